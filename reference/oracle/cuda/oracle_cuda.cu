// The float64 attention oracle on a CUDA GPU (oracle_cuda.h; the CPU oracle is
// reference/oracle/oracle_double.cc, whose semantics and summation structure this follows).
//
// Kernels (all float64, --fmad=false: every fused multiply-add is an explicit fma()):
// - NormsKernel: per (row, head) 2-norms and max |x| of q, k, v, dO (OracleStats inputs).
// - ForwardKernel, one block per (batch, query head, query tile of tq rows; 2 tq where shared
//   memory allows: the forward's chains run over keys, so its query tile changes none): for
//   every key tile of tk keys that some row of the tile may see (the rule of
//   TileWalk::ForEachKeyTile, reference/problem/tile_walk.h), in ascending order: S = scale Q K^T
//   (fma chains of D), the score transform and the mask (reference/problem/mask.h, reproduced
//   below), the online softmax (running max m, rescaling of O and the denominator l by
//   exp(m_old - m_new)), P = exp(s - m), l += rowsum(P) compensated (a TwoSum tree over the
//   warp, then TwoSum into l, as Sum2; each warp takes four rows side by side), O = f O + P V
//   (the tile's product summed apart, then added: a chain of tk + tiles per element, as the
//   CPU's). o = O / l, lse = m + log l; empty rows o = 0, lse = -inf. Key tiles stream through
//   one K and one V buffer with cp.async: the next K is requested once the scores are done, the
//   next V once P V is done, so each load overlaps the other half of the tile's work.
// - DeltaKernel: delta = dO . o by Dot2 (compensated, exact products by fma), as the CPU.
// - DqKernel, one block per (batch, query head, query tile): the forward's scores again (same
//   expressions), P = exp(s - lse), dP = dO V^T, dS = P (dP - delta) [(1 - tanh^2) with
//   softcap], dQ += dS K per key tile; dq = scale dQ. K tiles double-buffered where shared
//   memory allows (the next one requested a whole tile ahead), V requested once dP is done.
// - DkDvKernel, one block per (batch, kv head, key tile): for every query head of the group
//   and every query tile that may see the tile (found by a warp vote, no barrier), in ascending
//   order: the same S, P, dS; dV += P^T dO, dK += dS^T Q; dk = scale dK. Q and dO tiles stream
//   through one buffer each, the next requested as soon as the product that reads it is done.
//   No atomics on outputs: every output element has one owner block, so results are
//   deterministic (run to run bitwise equal; the row kernels' fused dQ below adds in a fixed
//   order); the per-key count of visible entries is read off
//   the sign of P on the mma path (masked entries hold -0.0, ScoresBackwardMma).
// Memory: O(tile) shared memory per block plus the inputs, outputs and per-row norms; never
// O(Sq Sk). Shared-memory row strides avoid bank conflicts: odd on the fma path, 4 (mod 8) on
// the mma path where that padding costs no tile size (Stride in oracle_cuda_device.cuh).
// Products: fma chains over shared-memory tiles (each thread a few outputs), or with
// ATTEST_ORACLE_CUDA_MMA the FP64 tensor cores (MmaProducts: mma.sync m8n8k4 f64; each warp
// takes groups of up to 2 x 4 blocks of 8 x 8, reusing the A and B fragments across the group
// and keeping one independent chain per block in flight; the backward computes S = Q K^T and
// dP = dO V^T side by side and P, dS in their epilogue). Every block's chain is the same as one
// block at a time (k steps ascending), so either path sums each tile's product apart and then
// adds it, and the chains are the same.
// Row kernels (oracle_cuda_rows*.cuh), used in place of ForwardKernel, DqKernel and DkDvKernel
// on the mma path with 16 x 8 x 8 blocks where the head dims allow (ATTEST_ORACLE_CUDA_ROWS=0
// keeps the three above): a warp owns 16 query rows (forward, dQ) or, with its partner, 16 keys
// (dK, dV); its scores, P, dS and its accumulators stay in registers, in the mma fragments. Key
// tiles of 32 in the forward and dQ, query tiles of 32 in dK/dV: the same expressions and the
// same kinds of chains (a tile's product summed apart, then added), with the chain lengths each
// kernel reports (dQ: 16 + tiles + 1, its two warps per row adding at the end). With 64 keys a
// block, the dK/dV kernel also forms dQ and RowDqKernel does not run (FusedDq: each block's share
// added to dq by red.global.add.f64 in ascending key order, turn by turn, then scaled; no
// atomics in an arbitrary order, so two runs still give the same bits).
// Compiled with -DATTEST_ORACLE_CUDA_EMULATE by a C++ compiler (oracle_cuda_emulated.cc), the
// kernels run on the CPU (oracle_cuda_emulate.h: a fiber per thread, cp.async included) for
// tests without a GPU.
//
// Error bound. The GPU evaluates the same expressions as the CPU oracle with at most the same
// per-operation error: additions, multiplications, divisions and sqrt are IEEE round-to-nearest
// (u); fma rounds once; exp, log and tanh of CUDA's double-precision math library have a
// maximum error of 1 ulp (CUDA C++ Programming Guide, "Mathematical Functions", Double-Precision
// Floating-Point Functions: exp 1, log 1, tanh 1;
// https://docs.nvidia.com/cuda/cuda-c-programming-guide/#double-precision-floating-point-functions
// — found by extensive but not exhaustive testing, as that appendix states), which is what
// reference/oracle/oracle_bound.cc assumes for the CPU (exp within one ulp, log and tanh of glibc
// within one ulp). The products are fma chains in some order, the sums of Higham's any-order
// model. So ErrorBound(stats, t) of oracle.h holds for the GPU result with the statistics this
// file reports (sum_len_k and sum_len_q are the GPU's own chain lengths: tk + key tiles, tq +
// (head, query tile) pairs), and |gpu - cpu| <= ErrorBound(gpu) + ErrorBound(cpu).
#include "reference/oracle/cuda/oracle_cuda.h"

#ifdef ATTEST_ORACLE_CUDA_EMULATE
#include "reference/oracle/cuda/oracle_cuda_emulate.h"  // the kernels on the CPU
#else
#include <cuda_runtime.h>
#define ATTEST_LAUNCH(kernel, grid, block, shared, ...) \
  kernel<<<(grid), (block), (shared)>>>(__VA_ARGS__)
#define ATTEST_DYNAMIC_SHARED(name) extern __shared__ double name[]
#endif
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "reference/oracle/cuda/oracle_cuda_device.cuh"
#include "reference/oracle/cuda/oracle_cuda_kernels.cuh"
#include "reference/oracle/cuda/oracle_cuda_rows.cuh"
#include "reference/oracle/cuda/oracle_cuda_rows_forward.cuh"
#include "reference/oracle/cuda/oracle_cuda_rows_backward.cuh"
#include "reference/oracle/cuda/oracle_cuda_launch.cuh"

namespace {

// ---------------------------------------------------------------------------------------------
// Host side.

void SetMessage(char* message, int64_t size, const std::string& text) {
  if (message == nullptr || size <= 0) return;
  const size_t n = std::min(static_cast<size_t>(size - 1), text.size());
  std::memcpy(message, text.data(), n);
  message[n] = '\0';
}

double Bits(unsigned long long x) {
  double d;
  std::memcpy(&d, &x, sizeof d);
  return d;
}

// The arguments' rules, checked in this order (the first one broken is the error).
void Validate(const AttestOracleCudaProblem& pr, const double* q, const double* k,
              const double* v, const double* dout, const double* o, const double* lse,
              const double* dq, const double* dk, const double* dv, const double* delta) {
  Require(pr.batch >= 1 && pr.batch <= 65535, "batch must be in [1, 65535]");
  Require(pr.heads_kv >= 1 && pr.heads_q >= pr.heads_kv && pr.heads_q % pr.heads_kv == 0 &&
              pr.heads_q <= 65535,
          "heads_q must be a multiple of heads_kv >= 1 (and <= 65535)");
  Require(pr.seqlen_q >= 0 && pr.seqlen_k >= 0, "seqlen_q and seqlen_k must be >= 0");
  Require(pr.head_dim >= 1 && pr.head_dim_v >= 1, "head_dim and head_dim_v must be >= 1");
  Require((pr.cu_seqlens_q == nullptr) == (pr.cu_seqlens_k == nullptr),
          "cu_seqlens_q and cu_seqlens_k: both or neither");
  Require((pr.document_ids_q == nullptr) == (pr.document_ids_k == nullptr),
          "document_ids_q and document_ids_k: both or neither");
  Require(pr.document_ids_q == nullptr || pr.cu_seqlens_q == nullptr,
          "document_ids_q: not with cu_seqlens (as Validate)");
  Require(pr.block_q <= 0 || (pr.block_k > 0 && pr.blocks_map != nullptr),
          "block_sparse: block_k > 0 and blocks_map are needed with block_q > 0");
  Require(q != nullptr && k != nullptr && v != nullptr && o != nullptr && lse != nullptr,
          "q, k, v, o and lse must not be null");
  Require(dout == nullptr ||
              (dq != nullptr && dk != nullptr && dv != nullptr && delta != nullptr),
          "dq, dk, dv and delta must not be null with dout");
}

// The batch's tokens and longest sequences (Extents).
Extents ExtentsOf(const AttestOracleCudaProblem& pr) {
  const int64_t batch = pr.batch;
  Extents x{batch * pr.seqlen_q, batch * pr.seqlen_k, pr.seqlen_q, pr.seqlen_k};
  if (pr.cu_seqlens_q != nullptr) {
    Require(pr.cu_seqlens_q[0] == 0 && pr.cu_seqlens_k[0] == 0, "cu_seqlens must start at 0");
    x.max_q = x.max_k = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t lq = pr.cu_seqlens_q[b + 1] - pr.cu_seqlens_q[b];
      const int64_t lk = pr.cu_seqlens_k[b + 1] - pr.cu_seqlens_k[b];
      Require(lq >= 0, "cu_seqlens_q must be non-decreasing");
      Require(lk >= 0, "cu_seqlens_k must be non-decreasing");
      x.max_q = std::max(x.max_q, lq);
      x.max_k = std::max(x.max_k, lk);
    }
    x.total_q = pr.cu_seqlens_q[batch];
    x.total_k = pr.cu_seqlens_k[batch];
  }
  return x;
}

// Tiles: the largest that fit the device's shared memory in all three kernels.
Tiles PickTiles(int64_t dd, int64_t dvw, int device, bool mma) {
  int optin = 0;
  Check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
        "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  const int64_t limit = optin - 1024;  // room for the kernels' static shared variables
  const int candidates[][2] = {{32, 32}, {16, 32}, {16, 16}, {8, 16}, {8, 8}, {4, 8}};
  // The first (largest) candidate that fits all three kernels, with the mma path's fragment
  // strides (frag = 1) or the plain odd ones (Stride); -1 if none.
  auto pick = [&](int frag) {
    for (int n = 0; n < static_cast<int>(std::size(candidates)); ++n) {
      const int* c = candidates[n];
      if (mma && (c[0] % 8 != 0 || c[1] % 8 != 0)) continue;  // MmaProducts' 8 x 8 blocks
      const int64_t need = 8 * std::max({ForwardShared(dd, dvw, c[0], c[1], frag),
                                          DqShared(dd, dvw, c[0], c[1], frag, 1),
                                          DkDvShared(dd, dvw, c[0], c[1], frag)});
      if (need <= limit) return n;
    }
    return -1;
  };
  // The fragment strides only where they cost no tile size (a smaller tile would lengthen the
  // chains, so weaken the bound): they change speed, never what is computed.
  int frag = 0, pick_n = pick(0);
  if (mma) {
    const int with_frag = pick(1);
    if (with_frag >= 0 && (pick_n < 0 || with_frag <= pick_n)) {
      frag = 1;
      pick_n = with_frag;
    }
  }
  Require(pick_n >= 0, "head_dim " + std::to_string(dd) + " / head_dim_v " +
                           std::to_string(dvw) + ": too large for the device's shared memory (" +
                           std::to_string(optin) + " bytes per block)");
  const int tq = candidates[pick_n][0], tk = candidates[pick_n][1];
  // DqKernel: a second K buffer (the next K tile requested a whole tile ahead) where it fits.
  const int k_buffers = 8 * DqShared(dd, dvw, tq, tk, frag, 2) <= limit ? 2 : 1;
  // ForwardKernel: query tiles of 2 tq rows where they fit (its chains run over keys: tk and the
  // key tiles per row, whatever tq is; half the K and V traffic per row).
  const int fwd_tq = 8 * ForwardShared(dd, dvw, 2 * tq, tk, frag) <= limit ? 2 * tq : tq;
  const size_t fwd_bytes = 8 * static_cast<size_t>(ForwardShared(dd, dvw, fwd_tq, tk, frag));
  const size_t dq_bytes = 8 * static_cast<size_t>(DqShared(dd, dvw, tq, tk, frag, k_buffers));
  const size_t dkdv_bytes = 8 * static_cast<size_t>(DkDvShared(dd, dvw, tq, tk, frag));
  return Tiles{limit, tq, tk, frag, k_buffers, fwd_tq, fwd_bytes, dq_bytes, dkdv_bytes};
}

// The problem on the device (its per-token arrays copied into the arena) with the tiles; the
// norms' pointers (qn, kn) come with the buffers (DeviceBuffers).
Dev DevOf(const AttestOracleCudaProblem& pr, const Extents& x, const Tiles& tiles, bool mma,
          int device, DeviceArena& arena) {
  const int64_t batch = pr.batch, hq = pr.heads_q;
  Dev p{};
  p.batch = batch;
  p.hq = hq;
  p.hkv = pr.heads_kv;
  p.sq = pr.seqlen_q;
  p.sk = pr.seqlen_k;
  p.d = pr.head_dim;
  p.dv = pr.head_dim_v;
  p.total_q = x.total_q;
  p.total_k = x.total_k;
  p.scale = pr.scale;
  p.softcap = pr.softcap;
  p.top_left = pr.causal_top_left != 0;
  p.left = pr.window_left;
  p.right = pr.window_right;
  if (pr.causal) p.right = p.right < 0 ? 0 : std::min<int64_t>(p.right, 0);
  p.prefix = pr.prefix_lm;
  p.slopes = pr.alibi_slopes != nullptr ? arena.Copy(pr.alibi_slopes, hq, "alibi_slopes")
                                        : nullptr;
  if (pr.cu_seqlens_q != nullptr) {
    p.cu_q = arena.Copy(pr.cu_seqlens_q, batch + 1, "cu_seqlens_q");
    p.cu_k = arena.Copy(pr.cu_seqlens_k, batch + 1, "cu_seqlens_k");
  }
  if (pr.document_ids_q != nullptr) {
    p.doc_q = arena.Copy(pr.document_ids_q, batch * pr.seqlen_q, "document_ids_q");
    p.doc_k = arena.Copy(pr.document_ids_k, batch * pr.seqlen_k, "document_ids_k");
  }
  if (pr.block_q > 0) {
    p.block_q = pr.block_q;
    p.block_k = pr.block_k;
    const int64_t qb = (pr.seqlen_q + pr.block_q - 1) / pr.block_q;
    p.key_blocks = (pr.seqlen_k + pr.block_k - 1) / pr.block_k;
    p.blocks = arena.Copy(pr.blocks_map, qb * p.key_blocks, "blocks_map");
  }
  p.tq = tiles.tq;
  p.tk = tiles.tk;
  p.mma = mma ? 1 : 0;
  p.frag = tiles.frag;
  p.k_buffers = tiles.k_buffers;
  // Blocks of 16 x 8 x 8 on compute capability 9.0 and later, unless
  // ATTEST_ORACLE_CUDA_MMA_ROWS=8 asks for the 8 x 8 x 4 blocks of sm_80 (the bench compares):
  // on an H100, m8n8k4 f64 runs at half the rate of the m16n8k* shapes new in sm_90
  // (bench/fp64_rates.cu; docs/bench-oracle.md).
  int major = 0;
  Check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
        "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
  const char* rows_env = std::getenv("ATTEST_ORACLE_CUDA_MMA_ROWS");
  p.m16 = mma && major >= 9 && !(rows_env != nullptr && std::string(rows_env) == "8") ? 1 : 0;
  return p;
}

// Buffers for the caller's arrays, the norms (p->qn, p->kn) and the statistics, in the arena; the
// outputs, the statistics and delta zeroed.
Buffers DeviceBuffers(const double* q, const double* k, const double* v, const double* dout,
                      double* o, double* lse, double* dq, double* dk, double* dv, double* delta,
                      bool on_device, DeviceArena& arena, Dev* p) {
  const int64_t total_q = p->total_q, total_k = p->total_k, hq = p->hq, hkv = p->hkv;
  Buffers io{q, k, v, dout, o, lse, dq, dk, dv, delta, nullptr, nullptr, nullptr, 0, 0, 0, 0, 0};
  io.nq_el = total_q * hq * p->d;
  io.nk_el = total_k * hkv * p->d;
  io.nv_el = total_k * hkv * p->dv;
  io.no_el = total_q * hq * p->dv;
  io.nlse = total_q * hq;
  if (!on_device) {
    io.q = arena.Copy(q, io.nq_el, "q");
    io.k = arena.Copy(k, io.nk_el, "k");
    io.v = arena.Copy(v, io.nv_el, "v");
    if (dout != nullptr) io.dout = arena.Copy(dout, io.no_el, "dout");
    io.o = arena.Alloc<double>(io.no_el, "o");
    io.lse = arena.Alloc<double>(io.nlse, "lse");
    if (dout != nullptr) {
      io.dq = arena.Alloc<double>(io.nq_el, "dq");
      io.dk = arena.Alloc<double>(io.nk_el, "dk");
      io.dv = arena.Alloc<double>(io.nv_el, "dv");
      io.delta = arena.Alloc<double>(io.nlse, "delta");
    }
  }
  io.qn = arena.Alloc<double>(total_q * hq, "q norms");
  io.kn = arena.Alloc<double>(total_k * hkv, "k norms");
  p->qn = io.qn;
  p->kn = io.kn;
  io.stats = arena.Alloc<DevStats>(1, "statistics");
  Check(cudaMemset(io.stats, 0, sizeof(DevStats)), "cudaMemset(statistics)");
  Check(cudaMemset(io.o, 0, static_cast<size_t>(io.no_el) * 8), "cudaMemset(o)");
  if (dout != nullptr) {
    Check(cudaMemset(io.dq, 0, static_cast<size_t>(io.nq_el) * 8), "cudaMemset(dq)");
    Check(cudaMemset(io.dk, 0, static_cast<size_t>(io.nk_el) * 8), "cudaMemset(dk)");
    Check(cudaMemset(io.dv, 0, static_cast<size_t>(io.nv_el) * 8), "cudaMemset(dv)");
    Check(cudaMemset(io.delta, 0, static_cast<size_t>(io.nlse) * 8), "cudaMemset(delta)");
  }
  return io;
}

// The statistics for the caller (the backward's with `backward`), the kernels taking ms.
AttestOracleCudaStats StatsOf(const DevStats& h, bool backward, float ms) {
  AttestOracleCudaStats out{};
  out.score_abs_max = Bits(h.score_abs_max);
  out.v_abs_max = Bits(h.v_abs_max);
  out.v_norm_max = Bits(h.v_norm_max);
  out.k_abs_max = Bits(h.k_abs_max);
  out.lse_abs_max = Bits(h.lse_abs_max);
  out.max_keys = static_cast<int64_t>(h.max_keys);
  out.sum_len_k = static_cast<int64_t>(h.sum_len_k);
  out.empty_rows = static_cast<int64_t>(h.empty_rows);
  if (backward) {
    out.q_abs_max = Bits(h.q_abs_max);
    out.do_abs_max = Bits(h.do_abs_max);
    out.do_norm_max = Bits(h.do_norm_max);
    out.col_mass_max = Bits(h.col_mass_max);
    out.max_queries = static_cast<int64_t>(h.max_queries);
    out.sum_len_q = static_cast<int64_t>(h.sum_len_q);
    out.unseen_keys = static_cast<int64_t>(h.unseen_keys);
  }
  out.kernel_seconds = ms * 1e-3;
  return out;
}

void Run(const AttestOracleCudaProblem& pr, const double* q, const double* k, const double* v,
         const double* dout, double* o, double* lse, double* dq, double* dk, double* dv,
         double* delta, int flags, AttestOracleCudaStats* stats) {
  Validate(pr, q, k, v, dout, o, lse, dq, dk, dv, delta);
  const bool on_device = (flags & ATTEST_ORACLE_CUDA_DEVICE_POINTERS) != 0;

  int devices = 0;
  Check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  Require(devices > 0, "no CUDA device");
  int device = 0;
  Check(cudaGetDevice(&device), "cudaGetDevice");

  const Extents x = ExtentsOf(pr);
  const bool mma = (flags & ATTEST_ORACLE_CUDA_MMA) != 0;
  const Tiles tiles = PickTiles(pr.head_dim, pr.head_dim_v, device, mma);

  DeviceArena arena;
  Dev p = DevOf(pr, x, tiles, mma, device, arena);
  const Buffers io = DeviceBuffers(q, k, v, dout, o, lse, dq, dk, dv, delta, on_device, arena, &p);

  cudaEvent_t start = nullptr, stop = nullptr;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  struct EventGuard {
    cudaEvent_t a, b;
    ~EventGuard() {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  } guard{start, stop};
  Check(cudaEventRecord(start), "cudaEventRecord");

  LaunchNorms(p, io);
  const bool rows_on = RowsOn(p);
  LaunchForward(p, io, tiles, x.max_q, rows_on);
  if (dout != nullptr) LaunchBackward(p, io, tiles, x, rows_on, arena);
  Check(cudaEventRecord(stop), "cudaEventRecord");
  Check(cudaEventSynchronize(stop), "kernels (cudaEventSynchronize)");
  Check(cudaDeviceSynchronize(), "kernels (cudaDeviceSynchronize)");
  float ms = 0;
  Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");

  if (!on_device) {
    auto back = [](double* host, const double* dev, int64_t n, const char* what) {
      if (n <= 0) return;
      Check(cudaMemcpy(host, dev, static_cast<size_t>(n) * 8, cudaMemcpyDeviceToHost),
            (std::string("cudaMemcpy to host ") + what).c_str());
    };
    back(o, io.o, io.no_el, "o");
    back(lse, io.lse, io.nlse, "lse");
    if (dout != nullptr) {
      back(dq, io.dq, io.nq_el, "dq");
      back(dk, io.dk, io.nk_el, "dk");
      back(dv, io.dv, io.nv_el, "dv");
      back(delta, io.delta, io.nlse, "delta");
    }
  }
  DevStats h{};
  Check(cudaMemcpy(&h, io.stats, sizeof h, cudaMemcpyDeviceToHost), "cudaMemcpy statistics");
  if (stats != nullptr) *stats = StatsOf(h, dout != nullptr, ms);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int attest_oracle_cuda_run(
    const AttestOracleCudaProblem* problem, const double* q, const double* k, const double* v,
    const double* dout, double* o, double* lse, double* dq, double* dk, double* dv,
    double* delta, int flags, AttestOracleCudaStats* stats, char* message,
    int64_t message_size) {
  SetMessage(message, message_size, "");
  if (problem == nullptr) {
    SetMessage(message, message_size, "CUDA oracle: problem is null");
    return 1;
  }
  try {
    Run(*problem, q, k, v, dout, o, lse, dq, dk, dv, delta, flags, stats);
    return 0;
  } catch (const Failure& f) {
    SetMessage(message, message_size, f.message);
    return f.code;
  } catch (const std::exception& e) {
    SetMessage(message, message_size, std::string("CUDA oracle: ") + e.what());
    return 3;
  }
}

extern "C" __attribute__((visibility("default"))) int attest_oracle_cuda_device_count(
    char* message, int64_t message_size) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    SetMessage(message, message_size,
               std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " +
                   cudaGetErrorString(e));
    return 0;
  }
  if (n == 0) {
    SetMessage(message, message_size, "no CUDA device");
    return 0;
  }
  // The kernels need compute capability 8.0 or later (mma.sync m8n8k4 f64 and cp.async: PTX
  // ISA, "Warp Level Matrix Multiply-Accumulate Instructions" and "cp.async"): on an older GPU
  // there is no usable device, so that the caller judges with the CPU oracle and says why.
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      major < 8) {
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    SetMessage(message, message_size,
               "GPU " + std::to_string(device) + " has compute capability " +
                   std::to_string(major) + "." + std::to_string(minor) +
                   "; the CUDA oracle needs 8.0 or later");
    return 0;
  }
  return n;
}

// cuBLAS through dlopen (cublas_api.h: cublasCreate_v2, cublasDgemm_v2, cublasDestroy_v2;
// cublasOperation_t CUBLAS_OP_N = 0; status 0 = CUBLAS_STATUS_SUCCESS).
extern "C" __attribute__((visibility("default"))) int attest_oracle_cuda_dgemm_seconds(
    int64_t n, int repeats, double* seconds, char* message, int64_t message_size) {
  SetMessage(message, message_size, "");
#ifdef ATTEST_ORACLE_CUDA_EMULATE
  (void)n;
  (void)repeats;
  (void)seconds;
  SetMessage(message, message_size, "no cuBLAS in the CPU emulation");
  return 1;
#else
  std::vector<std::string> names;
  if (const char* env = std::getenv("ATTEST_CUBLAS"); env != nullptr && *env != '\0') {
    names.push_back(env);
  }
  for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
    names.push_back(name);
  }
  void* lib = nullptr;
  std::string tried;
  for (const std::string& name : names) {
    lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    tried += (tried.empty() ? "" : ", ") + name;
  }
  if (lib == nullptr) {
    SetMessage(message, message_size, "no cuBLAS (tried " + tried + "; set ATTEST_CUBLAS)");
    return 1;
  }
  using Create = int (*)(void**);
  using Destroy = int (*)(void*);
  using Dgemm = int (*)(void*, int, int, int, int, int, const double*, const double*, int,
                        const double*, int, const double*, double*, int);
  auto create = reinterpret_cast<Create>(dlsym(lib, "cublasCreate_v2"));
  auto destroy = reinterpret_cast<Destroy>(dlsym(lib, "cublasDestroy_v2"));
  auto dgemm = reinterpret_cast<Dgemm>(dlsym(lib, "cublasDgemm_v2"));
  if (create == nullptr || destroy == nullptr || dgemm == nullptr) {
    SetMessage(message, message_size, "cuBLAS lacks cublasCreate_v2/cublasDgemm_v2");
    return 1;
  }
  try {
    DeviceArena arena;
    double* a = arena.Alloc<double>(n * n, "dgemm A");
    double* b = arena.Alloc<double>(n * n, "dgemm B");
    double* c = arena.Alloc<double>(n * n, "dgemm C");
    Check(cudaMemset(a, 0, static_cast<size_t>(n * n) * 8), "cudaMemset");
    Check(cudaMemset(b, 0, static_cast<size_t>(n * n) * 8), "cudaMemset");
    void* handle = nullptr;
    Require(create(&handle) == 0, "cublasCreate_v2 failed");
    const double one = 1, zero = 0;
    const int ni = static_cast<int>(n);
    double best = 1e30;
    cudaEvent_t e0, e1;
    Check(cudaEventCreate(&e0), "cudaEventCreate");
    Check(cudaEventCreate(&e1), "cudaEventCreate");
    for (int r = 0; r <= repeats; ++r) {
      Check(cudaEventRecord(e0), "cudaEventRecord");
      Require(dgemm(handle, 0, 0, ni, ni, ni, &one, a, ni, b, ni, &zero, c, ni) == 0,
              "cublasDgemm_v2 failed");
      Check(cudaEventRecord(e1), "cudaEventRecord");
      Check(cudaEventSynchronize(e1), "dgemm (cudaEventSynchronize)");
      float ms = 0;
      Check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      if (r > 0) best = std::min(best, ms * 1e-3);  // r = 0: warm-up
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    destroy(handle);
    *seconds = best;
    return 0;
  } catch (const Failure& f) {
    SetMessage(message, message_size, f.message);
    return f.code;
  }
#endif
}
