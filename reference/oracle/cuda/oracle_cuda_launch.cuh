// The host side of the CUDA float64 oracle's launches: its errors (Failure, Check, Require),
// device allocations (DeviceArena), the launch of one kernel (Launch), and the kernels of one call
// (LaunchNorms, LaunchForward, LaunchBackward with LaunchDq and LaunchDkDv), which pick between
// the tile kernels (oracle_cuda_kernels.cuh) and the row kernels (oracle_cuda_rows*.cuh) for the
// sizes (Extents), tiles (Tiles) and buffers (Buffers) that Run (oracle_cuda.cu) sets up.
// Included by oracle_cuda.cu only, after the kernels' files.
#pragma once

namespace {

struct Failure {
  int code;
  std::string message;
};

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw Failure{2, std::string("CUDA oracle: ") + what + ": " + cudaGetErrorName(e) + ": " +
                         cudaGetErrorString(e)};
  }
}

void Require(bool ok, const std::string& text) {
  if (!ok) throw Failure{1, "CUDA oracle: " + text};
}

// Device allocations freed when the call ends, whatever way.
class DeviceArena {
 public:
  ~DeviceArena() {
    for (void* ptr : ptrs_) cudaFree(ptr);
  }
  template <class T>
  T* Alloc(int64_t n, const char* what) {
    void* ptr = nullptr;
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T);
    Check(cudaMalloc(&ptr, bytes), (std::string("cudaMalloc ") + what).c_str());
    ptrs_.push_back(ptr);
    return static_cast<T*>(ptr);
  }
  template <class T>
  T* Copy(const T* host, int64_t n, const char* what) {
    T* dev = Alloc<T>(n, what);
    if (n > 0) {
      Check(cudaMemcpy(dev, host, static_cast<size_t>(n) * sizeof(T), cudaMemcpyHostToDevice),
            (std::string("cudaMemcpy to device ") + what).c_str());
    }
    return dev;
  }

 private:
  std::vector<void*> ptrs_;
};

// Launches `kernel` (named `name` in errors) on grid x block threads with `bytes` of dynamic
// shared memory, first allowing it that much (the opt-in above 48 KiB), and checks the launch.
template <typename Kernel, typename... Args>
void Launch(Kernel kernel, const char* name, dim3 grid, unsigned block, size_t bytes,
            Args... args) {
  if (bytes > 0) {
    Check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(bytes)),
          (std::string("cudaFuncSetAttribute(") + name + ")").c_str());
  }
  ATTEST_LAUNCH(kernel, grid, block, bytes, args...);
  Check(cudaGetLastError(), (std::string("launch of ") + name).c_str());
}

// The tokens of the batch (total_q, total_k) and its longest sequences (max_q, max_k), with
// cu_seqlens' rules checked.
struct Extents {
  int64_t total_q, total_k, max_q, max_k;
};

// The tiles of ForwardKernel, DqKernel and DkDvKernel and the dynamic shared memory they take
// (bytes), within `limit` (bytes a block may have, less room for static shared variables).
struct Tiles {
  int64_t limit;
  int tq, tk, frag, k_buffers, fwd_tq;
  size_t fwd_bytes, dq_bytes, dkdv_bytes;
};

// The inputs and outputs on the device (the caller's pointers with
// ATTEST_ORACLE_CUDA_DEVICE_POINTERS, else copies in the arena; dout null: no backward), the
// norms (Dev's qn, kn), the statistics, and the sizes of the arrays in doubles.
struct Buffers {
  const double *q, *k, *v, *dout;
  double *o, *lse, *dq, *dk, *dv, *delta, *qn, *kn;
  DevStats* stats;
  int64_t nq_el, nk_el, nv_el, no_el, nlse;
};

// Blocks of kThreads for n threads.
unsigned BlocksFor(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// NormsKernel over q, k, v and (with a backward) dO.
void LaunchNorms(const Dev& p, const Buffers& io) {
  const int64_t total_q = p.total_q, total_k = p.total_k, hq = p.hq, hkv = p.hkv;
  DevStats* sp = io.stats;
  const unsigned q_blocks = BlocksFor(total_q * hq), k_blocks = BlocksFor(total_k * hkv);
  if (total_q * hq > 0) {
    Launch(NormsKernel, "NormsKernel(q)", q_blocks, kThreads, 0, io.q, total_q * hq, p.d, io.qn,
           &sp->q_abs_max, nullptr);
  }
  if (total_k * hkv > 0) {
    Launch(NormsKernel, "NormsKernel(k)", k_blocks, kThreads, 0, io.k, total_k * hkv, p.d, io.kn,
           &sp->k_abs_max, nullptr);
    Launch(NormsKernel, "NormsKernel(v)", k_blocks, kThreads, 0, io.v, total_k * hkv, p.dv,
           nullptr, &sp->v_abs_max, &sp->v_norm_max);
  }
  if (io.dout != nullptr && total_q * hq > 0) {
    Launch(NormsKernel, "NormsKernel(dout)", q_blocks, kThreads, 0, io.dout, total_q * hq, p.dv,
           nullptr, &sp->do_abs_max, &sp->do_norm_max);
  }
}

// Whether the row kernels may run: 16 x 8 x 8 blocks, unless ATTEST_ORACLE_CUDA_ROWS=0 keeps the
// tile kernels (the bench compares).
bool RowsOn(const Dev& p) {
  const char* rows_kernel_env = std::getenv("ATTEST_ORACLE_CUDA_ROWS");
  return p.m16 && !(rows_kernel_env != nullptr && std::string(rows_kernel_env) == "0");
}

// The forward: o, lse and the forward's statistics.
void LaunchForward(const Dev& p, const Buffers& io, const Tiles& tiles, int64_t max_q,
                   bool rows_on) {
  const int64_t dd = p.d, dvw = p.dv, limit = tiles.limit;
  // The forward with a warp per 16 query rows (RowForwardKernel, oracle_cuda_rows_forward.cuh)
  // where it applies: 16 x 8 x 8 blocks, d and dv multiples of 8, dv <= 128 (O's accumulator in
  // registers), and a query tile of 16 rows per warp that fits shared memory with as many warps
  // as a block has, or half or a quarter of them (RowsOn).
  int row_warps = 0;
  if (rows_on && dd % 8 == 0 && dvw % 8 == 0 && dvw <= 128) {
    for (int w = kThreads / 32; w >= 2 && row_warps == 0; w /= 2) {
      if (8 * RowForwardShared(dd, dvw, 16 * w) <= limit) row_warps = w;
    }
  }
  // ATTEST_ORACLE_CUDA_FWD_PAIRS=W (12 or 16): RowForwardPairKernel with W warps a block, a pair
  // per 16 rows, where dv is a multiple of 16 and the block's tile fits (the bench compares).
  int pair_warps = 0;
  if (const char* e = std::getenv("ATTEST_ORACLE_CUDA_FWD_PAIRS");
      e != nullptr && row_warps > 0 && dvw % 16 == 0) {
    const int w = std::atoi(e);
    if ((w == 12 || w == 16) && 8 * (RowForwardShared(dd, dvw, 8 * w) + 384 * w) <= limit) {
      pair_warps = w;
    }
  }
  const int row_tq = pair_warps > 0 ? 8 * pair_warps : 16 * row_warps, fwd_tq = tiles.fwd_tq;
  const int64_t fwd_q_tiles =
      row_warps > 0 ? (max_q + row_tq - 1) / row_tq : (max_q + fwd_tq - 1) / fwd_tq;
  if (fwd_q_tiles <= 0) return;
  Require(fwd_q_tiles <= 0x7fffffff, "seqlen_q too large");
  const dim3 grid(static_cast<unsigned>(fwd_q_tiles), static_cast<unsigned>(p.hq),
                  static_cast<unsigned>(p.batch));
  Dev pf = p;
  if (row_warps > 0) {
    pf.tq = row_tq;
    pf.tk = kRowTileKeys;
    const size_t bytes = 8 * static_cast<size_t>(RowForwardShared(dd, dvw, row_tq));
    const unsigned block = 32 * row_warps;
    const size_t pair_bytes = bytes + 8 * 384 * static_cast<size_t>(pair_warps);
    auto pairs = [&](auto kernel, const char* name) {
      Launch(kernel, name, grid, 32 * pair_warps, pair_bytes, pf, io.q, io.k, io.v, io.o, io.lse,
             io.stats);
    };
    if (pair_warps == 16 && dvw <= 64) {
      pairs(RowForwardPairKernel<4, 16>, "RowForwardPairKernel<4, 16>");
    } else if (pair_warps == 16) {
      pairs(RowForwardPairKernel<8, 16>, "RowForwardPairKernel<8, 16>");
    } else if (pair_warps == 12 && dvw <= 64) {
      pairs(RowForwardPairKernel<4, 12>, "RowForwardPairKernel<4, 12>");
    } else if (pair_warps == 12) {
      pairs(RowForwardPairKernel<8, 12>, "RowForwardPairKernel<8, 12>");
    } else if (dvw <= 64) {
      Launch(RowForwardKernel<8>, "RowForwardKernel<8>", grid, block, bytes, pf, io.q, io.k,
             io.v, io.o, io.lse, io.stats);
    } else {
      Launch(RowForwardKernel<16>, "RowForwardKernel<16>", grid, block, bytes, pf, io.q, io.k,
             io.v, io.o, io.lse, io.stats);
    }
  } else {
    pf.tq = fwd_tq;
    Launch(ForwardKernel, "ForwardKernel", grid, kThreads, tiles.fwd_bytes, pf, io.q, io.k, io.v,
           io.o, io.lse, io.stats);
  }
}

// dQ with a pair of warps per 16 query rows (RowDqKernel, oracle_cuda_rows_backward.cuh) where
// it applies: 16 x 8 x 8 blocks (RowsOn), d and dv multiples of 8, d <= 128 (dQ's accumulator in
// registers), and 16 query rows per pair of warps that fit shared memory; DqKernel otherwise.
void LaunchDq(const Dev& p, const Buffers& io, const Tiles& tiles, int64_t max_q, bool rows_on) {
  const int64_t dd = p.d, dvw = p.dv;
  int dq_pairs = 0;
  if (rows_on && dd % 8 == 0 && dvw % 8 == 0 && dd <= 128) {
    for (int w = kThreads / 64; w >= 1 && dq_pairs == 0; w /= 2) {
      if (8 * RowDqShared(dd, dvw, 16 * w) <= tiles.limit) dq_pairs = w;
    }
  }
  const int64_t q_tiles = (max_q + tiles.tq - 1) / tiles.tq;
  const int64_t dq_tiles =
      dq_pairs > 0 ? (max_q + 16 * dq_pairs - 1) / (16 * dq_pairs) : q_tiles;
  if (dq_tiles <= 0) return;
  const dim3 grid(static_cast<unsigned>(dq_tiles), static_cast<unsigned>(p.hq),
                  static_cast<unsigned>(p.batch));
  if (dq_pairs > 0) {
    Dev pd = p;
    pd.tq = 16 * dq_pairs;
    pd.tk = kRowTileKeys;
    const size_t bytes = 8 * static_cast<size_t>(RowDqShared(dd, dvw, pd.tq));
    const unsigned block = 64 * dq_pairs;
    if (dd <= 64) {
      Launch(RowDqKernel<8>, "RowDqKernel<8>", grid, block, bytes, pd, io.q, io.k, io.v, io.dout,
             io.lse, io.delta, io.dq, io.stats);
    } else {
      Launch(RowDqKernel<16>, "RowDqKernel<16>", grid, block, bytes, pd, io.q, io.k, io.v,
             io.dout, io.lse, io.delta, io.dq, io.stats);
    }
  } else {
    Launch(DqKernel, "DqKernel", grid, kThreads, tiles.dq_bytes, p, io.q, io.k, io.v, io.dout,
           io.lse, io.delta, io.dq, io.stats);
  }
}

// dK and dV: RowDkDvKernel with kv_pairs pairs of warps a block (with `fused`, dQ too: FusedDq,
// its turns in the arena), else DkDvKernel.
void LaunchDkDv(const Dev& p, const Buffers& io, const Tiles& tiles, int64_t max_k, int kv_pairs,
                bool fused, int64_t fused_tiles, DeviceArena& arena) {
  const int64_t dd = p.d, dvw = p.dv, batch = p.batch, hq = p.hq;
  const int64_t k_tiles = (max_k + tiles.tk - 1) / tiles.tk;
  const int64_t kv_tiles =
      kv_pairs > 0 ? (max_k + 16 * kv_pairs - 1) / (16 * kv_pairs) : k_tiles;
  if (kv_tiles <= 0) return;
  Require(kv_tiles <= 0x7fffffff, "seqlen_k too large");
  const dim3 grid(static_cast<unsigned>(kv_tiles), static_cast<unsigned>(p.hkv),
                  static_cast<unsigned>(batch));
  if (kv_pairs <= 0) {
    Launch(DkDvKernel, "DkDvKernel", grid, kThreads, tiles.dkdv_bytes, p, io.q, io.k, io.v,
           io.dout, io.lse, io.delta, io.dk, io.dv, io.stats);
    return;
  }
  Dev pk = p;
  pk.tq = 32;
  pk.tk = 16 * kv_pairs;
  const size_t bytes = 8 * static_cast<size_t>(RowDkDvShared(dd, dvw, pk.tq, pk.tk, 2 * kv_pairs));
  const unsigned block = 64 * kv_pairs;
  FusedDq fz{};
  if (fused && fused_tiles > 0) {
    fz.dq = io.dq;
    fz.q_tiles = fused_tiles;
    fz.turn = arena.Alloc<int>(batch * hq * fused_tiles, "dQ turns");
    const dim3 tiles_grid(static_cast<unsigned>(fused_tiles), static_cast<unsigned>(hq),
                          static_cast<unsigned>(batch));
    Launch(FirstTurnKernel, "FirstTurnKernel", tiles_grid, 32, 0, pk, fz);
  }
  const bool wide = std::max(dd, dvw) > 64;
  if (fused) {
    if (wide) {
      Launch(RowDkDvKernel<8, true>, "RowDkDvKernel<8, fused>", grid, block, bytes, pk, io.q,
             io.k, io.v, io.dout, io.lse, io.delta, io.dk, io.dv, io.stats, fz);
    } else {
      Launch(RowDkDvKernel<4, true>, "RowDkDvKernel<4, fused>", grid, block, bytes, pk, io.q,
             io.k, io.v, io.dout, io.lse, io.delta, io.dk, io.dv, io.stats, fz);
    }
  } else if (wide) {
    Launch(RowDkDvKernel<8, false>, "RowDkDvKernel<8>", grid, block, bytes, pk, io.q, io.k, io.v,
           io.dout, io.lse, io.delta, io.dk, io.dv, io.stats, fz);
  } else {
    Launch(RowDkDvKernel<4, false>, "RowDkDvKernel<4>", grid, block, bytes, pk, io.q, io.k, io.v,
           io.dout, io.lse, io.delta, io.dk, io.dv, io.stats, fz);
  }
}

// The backward: delta, then dQ (LaunchDq, or fused into dK/dV) and dK, dV (LaunchDkDv).
void LaunchBackward(const Dev& p, const Buffers& io, const Tiles& tiles, const Extents& x,
                    bool rows_on, DeviceArena& arena) {
  const int64_t dd = p.d, dvw = p.dv;
  // Rows of zero-length sequences have no lse entries; nothing else to fill.
  if (io.nlse > 0) {
    Launch(DeltaKernel, "DeltaKernel", BlocksFor(io.nlse), kThreads, 0, p, io.dout, io.o,
           io.delta);
  }
  // dK and dV with a pair of warps per 16 keys (RowDkDvKernel, oracle_cuda_rows_backward.cuh)
  // where it applies: 16 x 8 x 8 blocks, d and dv multiples of 16 and at most 128 (each warp
  // holds half of the columns of dK and dV in registers), query tiles of 32 rows, and 16 keys
  // per pair of warps that fit shared memory.
  int kv_pairs = 0;
  if (rows_on && dd % 16 == 0 && dvw % 16 == 0 && dd <= 128 && dvw <= 128) {
    for (int w = kThreads / 64; w >= 1 && kv_pairs == 0; w /= 2) {
      if (8 * RowDkDvShared(dd, dvw, 32, 16 * w, 2 * w) <= tiles.limit) kv_pairs = w;
    }
  }
  // With a whole block of pairs (kPairs: 64 keys a block), RowDkDvKernel also computes dQ
  // (kFused: FusedDq in oracle_cuda_rows_backward.cuh), unless ATTEST_ORACLE_CUDA_FUSED=0 (the
  // bench compares); RowDqKernel or DqKernel otherwise, and again if a fused block gave up
  // waiting for its turn.
  const char* fused_env = std::getenv("ATTEST_ORACLE_CUDA_FUSED");
  const int64_t fused_tiles = (x.max_q + 31) / 32;
  const bool fused = kv_pairs == kPairs &&
                     !(fused_env != nullptr && std::string(fused_env) == "0") &&
                     p.batch * p.hq * fused_tiles <= 0x7fffffff && x.max_k / 16 < 0x7fffffff;
  if (!fused) LaunchDq(p, io, tiles, x.max_q, rows_on);
  LaunchDkDv(p, io, tiles, x.max_k, kv_pairs, fused, fused_tiles, arena);
  if (!fused) return;
  // A block that waited kTurnTimeoutNs for its turn gave up (the GPU did not start the blocks
  // in index order): dQ again, without turns. Else dq = scale dQ.
  unsigned long long timeouts = 0;
  Check(cudaMemcpy(&timeouts, &io.stats->order_timeouts, sizeof timeouts,
                   cudaMemcpyDeviceToHost),
        "cudaMemcpy statistics");
#ifdef ATTEST_ORACLE_CUDA_EMULATE
  // Blocks run in index order here, so every turn comes before its block: one that found
  // another block's turn means the chain skipped it, which the recomputation below would
  // hide from the check.
  Require(timeouts == 0, "the fused dQ's turn chain skipped a key block");
#endif
  if (timeouts != 0) {
    Check(cudaMemset(io.dq, 0, static_cast<size_t>(io.nq_el) * 8), "cudaMemset(dq)");
    LaunchDq(p, io, tiles, x.max_q, rows_on);
  } else if (io.nq_el > 0) {
    Launch(ScaleKernel, "ScaleKernel", BlocksFor(io.nq_el), kThreads, 0, io.dq, io.nq_el,
           p.scale);
  }
}

}  // namespace
