// Host side of the CUDA oracle (oracle_cuda_host.h): Problem + Tensors to the C interface of
// oracle_cuda.h, through dlopen.
#include "reference/oracle/cuda/oracle_cuda_host.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "reference/oracle/cuda/oracle_cuda.h"
#include "reference/oracle/oracle_internal.h"
#include "reference/problem/paged.h"

namespace attest {
namespace {

constexpr const char* kLibraryName = "libattest_oracle_cuda.so";

struct Api {
  std::string path;
  decltype(&attest_oracle_cuda_run) run = nullptr;
  decltype(&attest_oracle_cuda_device_count) device_count = nullptr;
  decltype(&attest_oracle_cuda_dgemm_seconds) dgemm_seconds = nullptr;
};

std::string ExecutableDir() {
  std::vector<char> buf(4096);
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return {};
  std::string path(buf.data(), static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

// Loaded once per library path, kept for the process's lifetime.
const Api& Load(const CudaOracleOptions& options) {
  static std::mutex mutex;
  static std::map<std::string, Api> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  std::vector<std::string> candidates;
  if (!options.library.empty()) {
    candidates.push_back(options.library);
  } else {
    if (const char* env = std::getenv("ATTEST_ORACLE_CUDA"); env != nullptr && *env != '\0') {
      candidates.push_back(env);
    } else {
      if (const std::string dir = ExecutableDir(); !dir.empty()) {
        candidates.push_back(dir + "/" + kLibraryName);
      }
#ifdef ATTEST_ORACLE_CUDA_BUILD_PATH
      candidates.push_back(ATTEST_ORACLE_CUDA_BUILD_PATH);
#endif
      candidates.push_back(kLibraryName);
    }
  }
  std::string tried;
  for (const std::string& path : candidates) {
    if (auto it = loaded.find(path); it != loaded.end()) return it->second;
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += "\n  " + path + ": " + (why != nullptr ? why : "not loadable");
      continue;
    }
    Api api;
    api.path = path;
    api.run = reinterpret_cast<decltype(api.run)>(dlsym(handle, "attest_oracle_cuda_run"));
    api.device_count = reinterpret_cast<decltype(api.device_count)>(
        dlsym(handle, "attest_oracle_cuda_device_count"));
    api.dgemm_seconds = reinterpret_cast<decltype(api.dgemm_seconds)>(
        dlsym(handle, "attest_oracle_cuda_dgemm_seconds"));
    if (api.run == nullptr || api.device_count == nullptr || api.dgemm_seconds == nullptr) {
      dlclose(handle);
      throw std::runtime_error("CUDA oracle: " + path +
                               " lacks attest_oracle_cuda_run / _device_count / _dgemm_seconds");
    }
    return loaded.emplace(path, api).first->second;
  }
  throw std::runtime_error(
      "CUDA oracle: cannot load " + std::string(kLibraryName) +
      " (built by nvcc when ATTEST_CUDA is on; set ATTEST_ORACLE_CUDA to its path). Tried:" +
      tried);
}

const Api& LoadWithDevice(const CudaOracleOptions& options) {
  const Api& api = Load(options);
  char message[512] = {0};
  if (api.device_count(message, sizeof message) <= 0) {
    throw std::runtime_error(std::string("CUDA oracle: no usable GPU (") + message + ")");
  }
  return api;
}

// The C description of `p`, with the arrays it points to.
struct CProblem {
  AttestOracleCudaProblem c{};
  std::vector<int32_t> doc_q, doc_k;
  std::vector<uint8_t> blocks;
};

void Convert(const Problem& p, CProblem& out) {
  AttestOracleCudaProblem& c = out.c;
  c.batch = p.batch;
  c.heads_q = p.heads_q;
  c.heads_kv = p.heads_kv;
  c.seqlen_q = p.seqlen_q;
  c.seqlen_k = p.seqlen_k;
  c.head_dim = p.head_dim;
  c.head_dim_v = p.head_dim_v;
  c.scale = p.EffectiveScale();
  c.softcap = p.softcap;
  c.causal = p.causal ? 1 : 0;
  c.causal_top_left = p.causal_align == CausalAlign::kTopLeft ? 1 : 0;
  c.window_left = p.window_left;
  c.window_right = p.window_right;
  c.prefix_lm = p.prefix_lm;
  c.alibi_slopes = p.alibi_slopes ? p.alibi_slopes->data() : nullptr;
  c.cu_seqlens_q = p.cu_seqlens_q ? p.cu_seqlens_q->data() : nullptr;
  c.cu_seqlens_k = p.cu_seqlens_k ? p.cu_seqlens_k->data() : nullptr;
  if (p.document_ids_q && p.document_ids_k) {
    // Validate made each [batch][seqlen]; flattened to token rows b * S + i.
    for (const auto& ids : *p.document_ids_q) {
      out.doc_q.insert(out.doc_q.end(), ids.begin(), ids.end());
    }
    for (const auto& ids : *p.document_ids_k) {
      out.doc_k.insert(out.doc_k.end(), ids.begin(), ids.end());
    }
    if (static_cast<int64_t>(out.doc_q.size()) != p.batch * p.seqlen_q ||
        static_cast<int64_t>(out.doc_k.size()) != p.batch * p.seqlen_k) {
      throw std::invalid_argument(
          "CUDA oracle: problem.document_ids_q/k: expected batch x seqlen ids");
    }
    c.document_ids_q = out.doc_q.data();
    c.document_ids_k = out.doc_k.data();
  }
  if (p.block_sparse) {
    const BlockSparse& bs = *p.block_sparse;
    const int64_t nq = (p.seqlen_q + bs.block_q - 1) / bs.block_q;
    const int64_t nk = (p.seqlen_k + bs.block_k - 1) / bs.block_k;
    out.blocks.assign(static_cast<size_t>(std::max<int64_t>(nq * nk, 1)), 0);
    for (const auto& [qb, kb] : bs.blocks) {
      if (qb < 0 || qb >= nq || kb < 0 || kb >= nk) {
        throw std::invalid_argument("CUDA oracle: problem.block_sparse.blocks: (" +
                                    std::to_string(qb) + ", " + std::to_string(kb) +
                                    ") is outside the block grid");
      }
      out.blocks[static_cast<size_t>(qb * nk + kb)] = 1;
    }
    c.block_q = bs.block_q;
    c.block_k = bs.block_k;
    c.blocks_map = out.blocks.data();
  }
}

OracleStats ToStats(const Problem& p, const AttestOracleCudaStats& s, bool backward) {
  OracleStats st;
  st.unit_roundoff = std::ldexp(1.0, -53);
  st.scale = p.EffectiveScale();
  st.softcap = p.softcap;
  st.head_dim = p.head_dim;
  st.head_dim_v = p.head_dim_v;
  st.score_abs_max = s.score_abs_max;
  st.v_abs_max = s.v_abs_max;
  st.v_norm_max = s.v_norm_max;
  st.k_abs_max = s.k_abs_max;
  st.lse_abs_max = s.lse_abs_max;
  st.max_keys = s.max_keys;
  st.sum_len_k = s.sum_len_k;
  st.empty_rows = s.empty_rows;
  if (backward) {
    st.q_abs_max = s.q_abs_max;
    st.do_abs_max = s.do_abs_max;
    st.do_norm_max = s.do_norm_max;
    st.col_mass_max = s.col_mass_max;
    st.max_queries = s.max_queries;
    st.sum_len_q = s.sum_len_q;
    st.unseen_keys = s.unseen_keys;
  }
  return st;
}

struct Outputs {
  Tensor o, lse, dq, dk, dv, delta;
  OracleStats stats;
};

Outputs RunCuda(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor* dout, const CudaOracleOptions& options) {
  // Learnable sinks are not implemented on the GPU: declined before anything is loaded, and
  // OracleForwardOn / OracleBackwardOn run such problems on the CPU oracle instead.
  if (p.sink) {
    throw std::invalid_argument(
        "CUDA oracle: problem.sink: the CUDA oracle declines learnable sinks (the CPU float64 "
        "oracle computes them: OracleForwardOn, attest oracle --device cpu)");
  }
  if (p.rel_bias) {
    throw std::invalid_argument(
        "CUDA oracle: problem.rel_bias: the CUDA oracle declines learnable relative biases "
        "(the CPU float64 oracle computes them: OracleForwardOn, attest oracle --device cpu)");
  }
  // Paged KV and seqused likewise (the CPU oracle gathers the logical problem: oracle_paged.h).
  if (HasLogicalView(p)) {
    throw std::invalid_argument(
        "CUDA oracle: problem.page_size / seqused_q / seqused_k: the CUDA oracle declines paged "
        "and seqused problems (the CPU float64 oracle computes them: OracleForwardOn, attest "
        "oracle --device cpu)");
  }
  // The CPU oracle's checks: Validate, shapes, f64, finite (names the field or tensor).
  const oracle_internal::Inputs in = oracle_internal::CheckInputs(p, q, k, v, dout);
  const Api& api = LoadWithDevice(options);
  CProblem cp;
  Convert(p, cp);
  Outputs out;
  out.o = Tensor::Zeros(DType::kF64, p.OShape());
  out.lse = Tensor::Zeros(DType::kF64, p.LseShape());
  if (dout != nullptr) {
    out.dq = Tensor::Zeros(DType::kF64, p.QShape());
    out.dk = Tensor::Zeros(DType::kF64, p.KShape());
    out.dv = Tensor::Zeros(DType::kF64, p.VShape());
    out.delta = Tensor::Zeros(DType::kF64, p.LseShape());
  }
  AttestOracleCudaStats stats{};
  char message[1024] = {0};
  const int flags = options.mma ? ATTEST_ORACLE_CUDA_MMA : 0;
  const bool bwd = dout != nullptr;
  const int rc = api.run(&cp.c, in.Q(), in.K(), in.V(), bwd ? in.DO() : nullptr,
                         out.o.data<double>(), out.lse.data<double>(),
                         bwd ? out.dq.data<double>() : nullptr,
                         bwd ? out.dk.data<double>() : nullptr,
                         bwd ? out.dv.data<double>() : nullptr,
                         bwd ? out.delta.data<double>() : nullptr, flags, &stats, message,
                         sizeof message);
  if (rc != 0) {
    throw std::runtime_error(std::string(message[0] != '\0' ? message : "CUDA oracle failed") +
                             " (" + api.path + ", code " + std::to_string(rc) + ")");
  }
  out.stats = ToStats(p, stats, bwd);
  if (options.kernel_seconds != nullptr) *options.kernel_seconds = stats.kernel_seconds;
  return out;
}

}  // namespace

ForwardOut CudaForward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                       const CudaOracleOptions& options) {
  Outputs r = RunCuda(p, q, k, v, nullptr, options);
  ForwardOut f;
  f.o = std::move(r.o);
  f.lse = std::move(r.lse);
  f.stats = r.stats;
  return f;
}

BackwardOut CudaBackward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& dout, const CudaOracleOptions& options) {
  Outputs r = RunCuda(p, q, k, v, &dout, options);
  BackwardOut b;
  b.dq = std::move(r.dq);
  b.dk = std::move(r.dk);
  b.dv = std::move(r.dv);
  b.delta = std::move(r.delta);
  b.o = std::move(r.o);
  b.lse = std::move(r.lse);
  b.stats = r.stats;
  return b;
}

std::string CudaOracleLibrary(const CudaOracleOptions& options) { return Load(options).path; }

ForwardOut OracleForwardOn(const CudaOracleOptions* cuda, const Problem& p, const Tensor& q,
                           const Tensor& k, const Tensor& v, const OracleOptions& cpu) {
  return cuda != nullptr && !p.sink && !p.rel_bias && !HasLogicalView(p)
             ? CudaForward(p, q, k, v, *cuda)
             : Forward<double>(p, q, k, v, cpu);
}

BackwardOut OracleBackwardOn(const CudaOracleOptions* cuda, const Problem& p, const Tensor& q,
                             const Tensor& k, const Tensor& v, const Tensor& dout,
                             const OracleOptions& cpu) {
  return cuda != nullptr && !p.sink && !p.rel_bias && !HasLogicalView(p)
             ? CudaBackward(p, q, k, v, dout, *cuda)
             : Backward<double>(p, q, k, v, dout, cpu);
}

int CudaDeviceCount(std::string* why, const CudaOracleOptions& options) {
  const Api& api = Load(options);
  char message[512] = {0};
  const int n = api.device_count(message, sizeof message);
  if (why != nullptr) *why = message;
  return n;
}

double CudaDgemmSeconds(int64_t n, int repeats, const CudaOracleOptions& options) {
  const Api& api = LoadWithDevice(options);
  double seconds = 0;
  char message[512] = {0};
  if (api.dgemm_seconds(n, repeats, &seconds, message, sizeof message) != 0) {
    throw std::runtime_error(std::string("CUDA oracle: dgemm: ") + message);
  }
  return seconds;
}

}  // namespace attest
