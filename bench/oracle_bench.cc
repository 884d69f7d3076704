// Speed and memory of the float64 oracle (docs/bench-oracle.md): one problem per
// process so that the peak RSS it reports (getrusage ru_maxrss) is this problem's alone, and
// OpenBLAS dgemm GFLOP/s with the same thread count as the yardstick. bench/oracle_bench.py
// drives it and prints the table (docs/bench-oracle.md).
//   oracle_bench attention --seqlen S --head-dim D [--heads H] [--causal] [--threads T]
//                          [--reps R] [--tile-q TQ] [--tile-k TK] [--skip-forward]
//                          [--sampled]
//   oracle_bench dgemm --n N [--threads T] [--reps R]
// Each prints one JSON object on stdout.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <cblas.h>
#include <nlohmann/json.hpp>

#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_gemm.h"
#include "reference/problem/problem.h"
#include "reference/tensor.h"
#include "verify/metrics/sample.h"

namespace attest {
namespace {

double PeakRssMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

// User + system CPU seconds of every thread of the process so far.
double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// Best wall-clock and best CPU seconds over `reps` runs. CPU time (all threads) is the
// steadier yardstick on a shared machine: time spent waiting for a core is not in it, so
// ratios of CPU-time rates compare the code, not the load (docs/bench-oracle.md).
struct Timing {
  double wall = 1e300, cpu = 1e300;
};
template <class Fn>
Timing Best(int reps, Fn&& fn) {
  Timing best;
  for (int r = 0; r < reps; ++r) {
    const double c0 = CpuSeconds();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best.wall = std::min(
        best.wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    best.cpu = std::min(best.cpu, CpuSeconds() - c0);
  }
  return best;
}

Tensor RandomNormal(const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> values(static_cast<size_t>(Tensor::NumElements(shape)));
  for (double& x : values) x = normal(rng);
  return Tensor::FromF64(shape, std::move(values));
}

struct AttentionArgs {
  int64_t heads = 8;
  int64_t tile_q = 0, tile_k = 0;  // 0: AutoTiles (oracle.h)
  bool skip_forward = false;       // time only the fwd+bwd call (tile experiments)
  // Also time the forward and fwd+bwd on the rows the checks sample (verify/metrics/sample.h
  // SampleRows, seed 0, the default budget) beside the whole run.
  bool sampled = false;
};

int RunAttention(int64_t seqlen, int64_t head_dim, bool causal, int threads, int reps,
                 const AttentionArgs& args) {
  Problem p;
  p.batch = 1;
  p.heads_q = p.heads_kv = args.heads;
  p.seqlen_q = p.seqlen_k = seqlen;
  p.head_dim = p.head_dim_v = head_dim;
  p.dtype = DType::kF64;
  p.causal = causal;
  const Tensor q = RandomNormal(p.QShape(), 1), k = RandomNormal(p.KShape(), 2),
               v = RandomNormal(p.VShape(), 3), dout = RandomNormal(p.OShape(), 4);
  OracleOptions options;
  options.threads = threads;
  if (args.tile_q > 0) options.tile_q = args.tile_q;
  if (args.tile_k > 0) options.tile_k = args.tile_k;
  const double t_fwd =
      args.skip_forward ? 0.0
                        : Best(reps, [&] { (void)Forward<double>(p, q, k, v, options); }).wall;
  // Backward returns o and lse too: one call is a whole training step's attention.
  const Timing step = Best(reps, [&] { (void)Backward<double>(p, q, k, v, dout, options); });
  const double t_step = step.wall;
  // The convention: 4 S^2 D forward + 10 S^2 D backward per head, halved if causal.
  const double flops = 14.0 * double(seqlen) * double(seqlen) * double(head_dim) *
                       double(p.batch * p.heads_q) * (causal ? 0.5 : 1.0);
  nlohmann::json out = {{"seqlen", seqlen},
                        {"head_dim", head_dim},
                        {"heads", p.heads_q},
                        {"causal", causal},
                        {"threads", threads},
                        {"tile_q", options.tile_q > 0 ? options.tile_q : AutoTiles(p).q},
                        {"tile_k", options.tile_k > 0 ? options.tile_k : AutoTiles(p).k},
                        {"seconds_forward", t_fwd},
                        {"seconds_fwd_bwd", t_step},
                        {"gflops_fwd_bwd", flops / t_step * 1e-9},
                        {"cpu_seconds_fwd_bwd", step.cpu},
                        {"gflops_per_cpu_second_fwd_bwd", flops / step.cpu * 1e-9},
                        {"peak_rss_mib", PeakRssMiB()},
                        {"products", oracle_internal::GemmPanelsIsa()}};
  if (args.sampled) {
    const RowSample sample = SampleRows(p, SampleOptions{});
    OracleOptions sampled = options;
    sampled.query_rows = &sample.query_rows;
    sampled.key_rows = &sample.key_rows;
    const Timing fwd = Best(reps, [&] { (void)Forward<double>(p, q, k, v, sampled); });
    const Timing both = Best(reps, [&] { (void)Backward<double>(p, q, k, v, dout, sampled); });
    out["sampled_query_rows"] = sample.queries;
    out["sampled_key_rows"] = sample.keys;
    out["seconds_forward_sampled"] = fwd.wall;
    out["cpu_seconds_forward_sampled"] = fwd.cpu;
    out["seconds_fwd_bwd_sampled"] = both.wall;
    out["cpu_seconds_fwd_bwd_sampled"] = both.cpu;
  }
  std::cout << out.dump() << std::endl;
  return 0;
}

int RunDgemm(int64_t n, int threads, int reps) {
  openblas_set_num_threads(threads);
  const Tensor a = RandomNormal({n, n}, 5), b = RandomNormal({n, n}, 6);
  std::vector<double> c(static_cast<size_t>(n * n));
  const int ni = static_cast<int>(n);
  const Timing best = Best(reps, [&] {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0,
                a.data<double>(), ni, b.data<double>(), ni, 0.0, c.data(), ni);
  });
  const double t = best.wall;
  const double gflop = 2.0 * double(n) * double(n) * double(n) * 1e-9;
  nlohmann::json out = {{"n", n},
                        {"threads", threads},
                        {"seconds", t},
                        {"gflops", gflop / t},
                        {"cpu_seconds", best.cpu},
                        {"gflops_per_cpu_second", gflop / best.cpu},
                        {"openblas_config", openblas_get_config()}};
  std::cout << out.dump() << std::endl;
  return 0;
}

int Usage() {
  std::cerr << "usage: oracle_bench attention --seqlen S --head-dim D [--heads H] [--causal]\n"
               "                             [--threads T] [--reps R] [--tile-q TQ] [--tile-k TK] "
               "[--skip-forward] [--sampled]\n"
               "       oracle_bench dgemm --n N [--threads T] [--reps R]\n";
  return 2;
}

}  // namespace
}  // namespace attest

int main(int argc, char** argv) {
  if (argc < 2) return attest::Usage();
  const std::string mode = argv[1];
  int64_t seqlen = 1024, head_dim = 64, n = 1024;
  int threads = 2, reps = 1;
  bool causal = false;
  attest::AttentionArgs args;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* value = nullptr;
    if (a == "--causal") {
      causal = true;
      continue;
    }
    if (a == "--skip-forward") {
      args.skip_forward = true;
      continue;
    }
    if (a == "--sampled") {
      args.sampled = true;
      continue;
    }
    if ((value = next()) == nullptr) return attest::Usage();
    if (a == "--seqlen") {
      seqlen = std::atoll(value);
    } else if (a == "--head-dim") {
      head_dim = std::atoll(value);
    } else if (a == "--heads") {
      args.heads = std::atoll(value);
    } else if (a == "--n") {
      n = std::atoll(value);
    } else if (a == "--threads") {
      threads = std::atoi(value);
    } else if (a == "--tile-q") {
      args.tile_q = std::atoll(value);
    } else if (a == "--tile-k") {
      args.tile_k = std::atoll(value);
    } else if (a == "--reps") {
      reps = std::atoi(value);
    } else {
      return attest::Usage();
    }
  }
  if (mode == "attention") {
    return attest::RunAttention(seqlen, head_dim, causal, threads, reps, args);
  }
  if (mode == "dgemm") return attest::RunDgemm(n, threads, reps);
  return attest::Usage();
}
