// oracle_cuda_check: the CUDA float64 oracle (oracle_cuda_host.h) against the CPU oracle
// (reference/oracle/oracle.h), on a GPU host (tools/device/oracle_cuda.sh runs it).
//
//   oracle_cuda_check [--problems A,B] [--json FILE]
//                                          every Problem feature (the CPU tests' feature problems,
//                                          reference/oracle/oracle_test_util.h, plus multi-tile
//                                          ones): CPU Backward<double> vs the GPU (FMA path, and
//                                          the mma path when the library has it), forward-only
//                                          too; per output max |gpu - cpu| / ErrorBound, where
//                                          ErrorBound uses the larger of the two runs' statistics
//                                          (each result is within its bound of the exact value,
//                                          so the ratio is <= 2); the exact counts (empty rows,
//                                          unseen keys, max keys / queries) must be equal, and two
//                                          GPU runs bitwise equal. Exit 1 on any failure.
//   oracle_cuda_check --bench [--sizes 8192,16384,32768] [--mma-only] [--json FILE]
//                                          GPU fwd+bwd at B = 1, H = 8, D = 128, full and causal,
//                                          both paths (fma, mma):
//                                          GFLOP/s = 14 S^2 D H (half for causal) / kernel
//                                          seconds, beside cuBLAS dgemm (N = 8192) in the same
//                                          process. A table on stdout and JSON.
// Exit codes: 0 pass, 1 a check failed, 2 usage error or no GPU / library.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/oracle/cuda/oracle_cuda_host.h"
#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_test_util.h"

namespace attest {
namespace {

using oracle_test::Base;
using oracle_test::NamedProblem;

// FeatureProblems() are one tile each; these cross tile boundaries (the GPU's tiles are 32 x 32
// or smaller, the forward's up to 64 query rows) with each feature, and shrink the tiles
// (D = 256).
std::vector<NamedProblem> CheckProblems() {
  std::vector<NamedProblem> out = oracle_test::FeatureProblems();
  {
    Problem p = Base(1, 2, 1, 70, 45, 8, 8);  // 3 x 2 tiles of 32: cheap enough to emulate
    p.causal = true;
    p.window_left = 20;
    p.prefix_lm = 5;
    out.push_back({"small_multi_tile", p});
  }
  {
    // Varlen through the row kernels (head dims of 16): a sequence without keys (its rows
    // empty), one without queries (its keys unseen), two at nonzero offsets of both, GQA 2,
    // causal across several tiles.
    Problem p = Base(4, 4, 2, 40, 40, 16, 16);
    p.cu_seqlens_q = std::vector<int32_t>{0, 5, 45, 45, 52};
    p.cu_seqlens_k = std::vector<int32_t>{0, 0, 40, 70, 90};
    p.causal = true;
    out.push_back({"varlen_rows", p});
  }
  {
    // The fused dQ's turns (RowDkDvKernel with FusedDq) across several key blocks and query
    // tiles of a band: GQA 2, a window on both sides, head dims of 16 (emulated: key blocks of
    // 16; on the GPU of 64).
    Problem p = Base(1, 4, 2, 40, 64, 16, 16);
    p.window_left = 12;
    p.window_right = 3;
    out.push_back({"rows_window_gqa", p});
  }
  {
    // No mask, whole tiles (the row kernels' plain-score path, PlainTile), small enough to
    // emulate: 2 query tiles of the emulated forward (32 rows) and 4 of its dK/dV (16 keys).
    Problem p = Base(1, 2, 1, 64, 64, 16, 16);
    out.push_back({"whole_tiles", p});
  }
  {
    Problem p = Base(2, 4, 2, 300, 333, 64, 64);
    p.causal = true;
    out.push_back({"long_gqa_causal", p});
  }
  {
    Problem p = Base(1, 2, 2, 257, 257, 32, 32);
    p.window_left = 40;
    p.window_right = 7;
    p.softcap = 3.0;
    p.alibi_slopes = std::vector<double>{0.25, 0.015625};
    out.push_back({"long_window_softcap_alibi", p, 2.0});
  }
  {
    Problem p = Base(3, 4, 1, 300, 350, 48, 40);
    p.cu_seqlens_q = std::vector<int32_t>{0, 100, 400, 407};
    p.cu_seqlens_k = std::vector<int32_t>{0, 150, 350, 700};
    p.causal = true;
    p.causal_align = CausalAlign::kTopLeft;
    out.push_back({"long_varlen_top_left", p});
  }
  {
    Problem p = Base(1, 2, 2, 200, 190, 16, 16);
    BlockSparse bs;
    bs.block_q = 16;
    bs.block_k = 24;
    std::mt19937 rng(7);
    for (int64_t qb = 0; qb < 13; ++qb) {
      for (int64_t kb = 0; kb < 8; ++kb) {
        if (rng() % 3 == 0) bs.blocks.emplace_back(qb, kb);
      }
    }
    p.block_sparse = bs;
    out.push_back({"long_block_sparse", p});
  }
  {
    Problem p = Base(1, 2, 2, 180, 180, 16, 16);
    p.causal = true;
    p.prefix_lm = 37;
    out.push_back({"long_prefix_lm", p});
  }
  {
    Problem p = Base(2, 2, 1, 150, 150, 16, 16);
    std::vector<std::vector<int32_t>> dq(2), dk(2);
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < 150; ++i) {
        dq[b].push_back(static_cast<int32_t>(i / (37 + 5 * b)));
        dk[b].push_back(static_cast<int32_t>(i / (41 - 3 * b)));
      }
    }
    p.document_ids_q = dq;
    p.document_ids_k = dk;
    out.push_back({"long_document_ids", p});
  }
  {
    Problem p = Base(1, 2, 2, 70, 75, 256, 256);
    p.causal = true;
    out.push_back({"d256", p});
  }
  {
    Problem p = Base(1, 3, 1, 90, 64, 100, 36);
    p.scale = 0.3;
    out.push_back({"d100_dv36_sq_gt_sk", p});
  }
  {
    Problem p = Base(1, 2, 2, 1024, 1024, 128, 128);
    p.causal = true;
    out.push_back({"d128_s1024_causal", p});
  }
  return out;
}

OracleStats Larger(const OracleStats& a, const OracleStats& b) {
  OracleStats s = a;
  s.score_abs_max = std::max(a.score_abs_max, b.score_abs_max);
  s.v_abs_max = std::max(a.v_abs_max, b.v_abs_max);
  s.v_norm_max = std::max(a.v_norm_max, b.v_norm_max);
  s.k_abs_max = std::max(a.k_abs_max, b.k_abs_max);
  s.lse_abs_max = std::max(a.lse_abs_max, b.lse_abs_max);
  s.max_keys = std::max(a.max_keys, b.max_keys);
  s.sum_len_k = std::max(a.sum_len_k, b.sum_len_k);
  s.q_abs_max = std::max(a.q_abs_max, b.q_abs_max);
  s.do_abs_max = std::max(a.do_abs_max, b.do_abs_max);
  s.do_norm_max = std::max(a.do_norm_max, b.do_norm_max);
  s.col_mass_max = std::max(a.col_mass_max, b.col_mass_max);
  s.max_queries = std::max(a.max_queries, b.max_queries);
  s.sum_len_q = std::max(a.sum_len_q, b.sum_len_q);
  return s;
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  auto x = a.span<const double>();
  auto y = b.span<const double>();
  return x.size() == y.size() &&
         std::equal(x.begin(), x.end(), y.begin(), [](double u, double v) {
           return std::memcmp(&u, &v, sizeof u) == 0;
         });
}

struct Counter {
  int failures = 0;
  nlohmann::json results = nlohmann::json::array();
};

// One output: ratio = max |gpu - cpu| / ErrorBound(larger stats); pass if <= 2.
void Compare(const std::string& name, const std::string& path, OracleTensor t, const Tensor& gpu,
             const Tensor& cpu, const OracleStats& stats, Counter& c, nlohmann::json& row) {
  const double diff = oracle_test::MaxAbsDiff(gpu, cpu);
  const double bound = ErrorBound(stats, t);
  const double ratio = diff == 0 ? 0.0 : (bound > 0 ? diff / bound : INFINITY);
  const bool ok = std::isfinite(ratio) && ratio <= 2.0;
  if (!ok) ++c.failures;
  row[std::string(Name(t))] = {{"max_abs_diff", diff}, {"bound", bound}, {"ratio", ratio},
                               {"ok", ok}};
  std::printf("  %-28s %-6s %-5s diff %.3e bound %.3e ratio %.4f %s\n", name.c_str(),
              path.c_str(), std::string(Name(t)).c_str(), diff, bound, ratio,
              ok ? "ok" : "FAIL");
}

void ExpectCount(const char* what, int64_t gpu, int64_t cpu, Counter& c, nlohmann::json& row) {
  const bool ok = gpu == cpu;
  row[what] = {{"gpu", gpu}, {"cpu", cpu}, {"ok", ok}};
  if (!ok) {
    ++c.failures;
    std::printf("  FAIL %s: gpu %lld, cpu %lld\n", what, static_cast<long long>(gpu),
                static_cast<long long>(cpu));
  }
}

int RunCheck(const std::string& json_path, const std::vector<std::string>& only) {
  Counter c;
  uint64_t seed = 100;
  bool mma_available = true;
  for (const NamedProblem& np : CheckProblems()) {
    ++seed;  // the same inputs whichever problems run
    if (!only.empty() && std::find(only.begin(), only.end(), np.name) == only.end()) continue;
    const Problem& p = np.p;
    const auto in = oracle_test::RandomInputs(p, seed, np.q_sigma);
    const BackwardOut cpu = Backward<double>(p, in.q, in.k, in.v, in.dout);
    const ForwardOut cpu_f = Forward<double>(p, in.q, in.k, in.v);
    for (const bool mma : {false, true}) {
      const std::string path = mma ? "mma" : "fma";
      if (mma && !mma_available) continue;
      CudaOracleOptions options;
      options.mma = mma;
      BackwardOut gpu;
      try {
        gpu = CudaBackward(p, in.q, in.k, in.v, in.dout, options);
      } catch (const std::runtime_error& e) {
        if (mma && std::string(e.what()).find("not implemented") != std::string::npos) {
          std::printf("mma path: %s (skipped)\n", e.what());
          mma_available = false;
          continue;
        }
        ++c.failures;
        std::printf("%-28s %s: FAIL: %s\n", np.name.c_str(), path.c_str(), e.what());
        c.results.push_back({{"problem", np.name}, {"path", path}, {"error", e.what()}});
        continue;
      }
      try {
        nlohmann::json row = {{"problem", np.name}, {"path", path}};
        const OracleStats stats = Larger(cpu.stats, gpu.stats);
        Compare(np.name, path, OracleTensor::kO, gpu.o, cpu.o, stats, c, row);
        Compare(np.name, path, OracleTensor::kLse, gpu.lse, cpu.lse, stats, c, row);
        Compare(np.name, path, OracleTensor::kDq, gpu.dq, cpu.dq, stats, c, row);
        Compare(np.name, path, OracleTensor::kDk, gpu.dk, cpu.dk, stats, c, row);
        Compare(np.name, path, OracleTensor::kDv, gpu.dv, cpu.dv, stats, c, row);
        Compare(np.name, path, OracleTensor::kDelta, gpu.delta, cpu.delta, stats, c, row);
        ExpectCount("empty_rows", gpu.stats.empty_rows, cpu.stats.empty_rows, c, row);
        ExpectCount("unseen_keys", gpu.stats.unseen_keys, cpu.stats.unseen_keys, c, row);
        ExpectCount("max_keys", gpu.stats.max_keys, cpu.stats.max_keys, c, row);
        ExpectCount("max_queries", gpu.stats.max_queries, cpu.stats.max_queries, c, row);
        // The statistics both bounds rest on: the same quantities up to the rounding of the
        // norms (the CPU's score_abs_max may be larger: it adds the row's largest key norm
        // and ALiBi distance separately, oracle_double.cc), so within a factor of 2.
        const auto near = [](double g, double h) { return g <= 2 * h && h <= 2 * g; };
        const bool stats_ok = near(gpu.stats.score_abs_max, cpu.stats.score_abs_max) &&
                              std::abs(gpu.stats.col_mass_max - cpu.stats.col_mass_max) <=
                                  1e-9 * cpu.stats.col_mass_max &&
                              near(gpu.stats.v_norm_max, cpu.stats.v_norm_max);
        row["stats_consistent"] = stats_ok;
        if (!stats_ok) {
          ++c.failures;
          std::printf("  FAIL statistics: score_abs_max gpu %.17g cpu %.17g, col_mass_max gpu "
                      "%.17g cpu %.17g\n",
                      gpu.stats.score_abs_max, cpu.stats.score_abs_max,
                      gpu.stats.col_mass_max, cpu.stats.col_mass_max);
        }
        // Deterministic: a second run gives the same bits.
        const BackwardOut again = CudaBackward(p, in.q, in.k, in.v, in.dout, options);
        const bool same = BitwiseEqual(again.o, gpu.o) && BitwiseEqual(again.dq, gpu.dq) &&
                          BitwiseEqual(again.dk, gpu.dk) && BitwiseEqual(again.dv, gpu.dv) &&
                          BitwiseEqual(again.lse, gpu.lse);
        row["deterministic"] = same;
        if (!same) {
          ++c.failures;
          std::printf("  FAIL %s %s: two runs differ\n", np.name.c_str(), path.c_str());
        }
        // Forward only.
        const ForwardOut f = CudaForward(p, in.q, in.k, in.v, options);
        nlohmann::json frow;
        const OracleStats fstats = Larger(cpu_f.stats, f.stats);
        Compare(np.name, path + "/fwd", OracleTensor::kO, f.o, cpu_f.o, fstats, c, frow);
        Compare(np.name, path + "/fwd", OracleTensor::kLse, f.lse, cpu_f.lse, fstats, c, frow);
        ExpectCount("empty_rows_fwd", f.stats.empty_rows, cpu_f.stats.empty_rows, c, frow);
        row["forward"] = frow;
        c.results.push_back(row);
      } catch (const std::exception& e) {
        ++c.failures;
        std::printf("%-28s %s: FAIL: %s\n", np.name.c_str(), path.c_str(), e.what());
        c.results.push_back({{"problem", np.name}, {"path", path}, {"error", e.what()}});
      }
    }
  }
  std::printf("%s: %d failure(s)\n", c.failures == 0 ? "PASS" : "FAIL", c.failures);
  if (!json_path.empty()) {
    std::ofstream(json_path) << nlohmann::json{{"mode", "check"},
                                               {"failures", c.failures},
                                               {"mma_path", mma_available},
                                               {"results", c.results}}
                                    .dump(1)
                             << "\n";
  }
  return c.failures == 0 ? 0 : 1;
}

// Gaussian values (not rounded: the bench measures speed only).
Tensor Gaussian(const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> values(static_cast<size_t>(Tensor::NumElements(shape)));
  for (double& x : values) x = dist(rng);
  return Tensor::FromF64(shape, std::move(values));
}

int RunBench(const std::vector<int64_t>& sizes, const std::string& json_path, bool mma_only) {
  nlohmann::json rows = nlohmann::json::array();
  const int64_t n = 8192;
  double dgemm_s = NAN, dgemm_gflops = NAN;
  std::string dgemm_error;
  try {
    dgemm_s = CudaDgemmSeconds(n, 5);
    dgemm_gflops = 2.0 * static_cast<double>(n) * n * n / dgemm_s * 1e-9;
    std::printf("cuBLAS dgemm N=%lld: %.4f s, %.0f GFLOP/s\n", static_cast<long long>(n),
                dgemm_s, dgemm_gflops);
  } catch (const std::runtime_error& e) {
    dgemm_error = e.what();  // the bench runs on without its yardstick
    std::printf("cuBLAS dgemm: %s\n", e.what());
  }
  std::printf("%8s %7s %5s %12s %12s %10s\n", "S", "causal", "path", "seconds", "GFLOP/s",
              "of dgemm");
  for (const int64_t s : sizes) {
    Problem p = Base(1, 8, 8, s, s, 128, 128);
    const Tensor q = Gaussian(p.QShape(), 1), k = Gaussian(p.KShape(), 2);
    const Tensor v = Gaussian(p.VShape(), 3), dout = Gaussian(p.OShape(), 4);
    for (const bool causal : {false, true}) {
      p.causal = causal;
      for (const bool mma : {false, true}) {
        if (mma_only && !mma) continue;
        CudaOracleOptions options;
        options.mma = mma;
        double seconds = 0;
        options.kernel_seconds = &seconds;
        const auto t0 = std::chrono::steady_clock::now();
        BackwardOut b;
        try {
          b = CudaBackward(p, q, k, v, dout, options);
        } catch (const std::runtime_error& e) {
          std::printf("%8lld %7s %5s failed: %s\n", static_cast<long long>(s),
                      causal ? "yes" : "no", mma ? "mma" : "fma", e.what());
          rows.push_back({{"seqlen", s}, {"causal", causal}, {"path", mma ? "mma" : "fma"},
                          {"error", e.what()}});
          continue;
        }
        const double wall =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double flops = 14.0 * static_cast<double>(s) * static_cast<double>(s) * 128 * 8 /
                             (causal ? 2.0 : 1.0);
        const double gflops = flops / seconds * 1e-9;
        std::printf("%8lld %7s %5s %12.3f %12.1f %9.1f%%\n", static_cast<long long>(s),
                    causal ? "yes" : "no", mma ? "mma" : "fma", seconds, gflops,
                    100 * gflops / dgemm_gflops);
        std::fflush(stdout);
        rows.push_back({{"seqlen", s}, {"causal", causal}, {"path", mma ? "mma" : "fma"},
                        {"batch", 1}, {"heads", 8}, {"head_dim", 128},
                        {"kernel_seconds", seconds}, {"wall_seconds", wall}, {"gflops", gflops},
                        {"fraction_of_dgemm", gflops / dgemm_gflops},
                        {"empty_rows", b.stats.empty_rows}});
      }
    }
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << nlohmann::json{{"mode", "bench"},
                                               {"dgemm_n", n},
                                               {"dgemm_seconds", dgemm_s},
                                               {"dgemm_gflops", dgemm_gflops},
                                               {"dgemm_error", dgemm_error},
                                               {"flops_formula", "14 S^2 D H (half for causal)"},
                                               {"rows", rows}}
                                    .dump(1)
                             << "\n";
  }
  return 0;
}

int Main(int argc, char** argv) {
  bool bench = false, mma_only = false;
  std::string json_path;
  std::vector<int64_t> sizes = {8192, 16384, 32768};
  std::vector<std::string> only;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--probe") {
      return 0;  // starts and exits: tools/device/pack_oracle_cuda.sh's loader check
    } else if (arg == "--bench") {
      bench = true;
    } else if (arg == "--mma-only") {
      mma_only = true;
    } else if (arg == "--json" && a + 1 < argc) {
      json_path = argv[++a];
    } else if (arg == "--problems" && a + 1 < argc) {
      std::stringstream list(argv[++a]);
      std::string item;
      while (std::getline(list, item, ',')) only.push_back(item);
    } else if (arg == "--sizes" && a + 1 < argc) {
      sizes.clear();
      std::stringstream list(argv[++a]);
      std::string item;
      while (std::getline(list, item, ',')) {
        try {
          sizes.push_back(std::stoll(item));
        } catch (const std::exception&) {
          std::cerr << "--sizes: '" << item << "' is not an integer\n";
          return 2;
        }
        if (sizes.back() < 1) {
          std::cerr << "--sizes: " << item << " must be >= 1\n";
          return 2;
        }
      }
    } else {
      std::cerr << "usage: oracle_cuda_check [--problems NAME,...] [--bench [--sizes S,...] "
                   "[--mma-only]] [--json FILE]\n";
      return 2;
    }
  }
  try {
    std::printf("library: %s\n", CudaOracleLibrary().c_str());
    std::string why;
    if (CudaDeviceCount(&why) <= 0) {
      std::cerr << "oracle_cuda_check: no usable GPU (" << why << ")\n";
      return 2;
    }
    return bench ? RunBench(sizes, json_path, mma_only) : RunCheck(json_path, only);
  } catch (const std::runtime_error& e) {
    std::cerr << "oracle_cuda_check: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace
}  // namespace attest

int main(int argc, char** argv) { return attest::Main(argc, argv); }
