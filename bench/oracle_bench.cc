// Speed and memory of the float64 oracle (issue "The oracle", item 8): one problem per
// process so that the peak RSS it reports (getrusage ru_maxrss) is this problem's alone, and
// OpenBLAS dgemm GFLOP/s with the same thread count as the yardstick. bench/oracle_bench.py
// drives it and prints the table (docs/bench-oracle.md).
//   oracle_bench attention --seqlen S --head-dim D [--causal] [--threads T] [--reps R]
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
#include "reference/problem/problem.h"
#include "reference/tensor.h"

namespace attest {
namespace {

double PeakRssMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

template <class Fn>
double BestSeconds(int reps, Fn&& fn) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
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

int RunAttention(int64_t seqlen, int64_t head_dim, bool causal, int threads, int reps) {
  Problem p;
  p.batch = 1;
  p.heads_q = p.heads_kv = 8;
  p.seqlen_q = p.seqlen_k = seqlen;
  p.head_dim = p.head_dim_v = head_dim;
  p.dtype = DType::kF64;
  p.causal = causal;
  const Tensor q = RandomNormal(p.QShape(), 1), k = RandomNormal(p.KShape(), 2),
               v = RandomNormal(p.VShape(), 3), dout = RandomNormal(p.OShape(), 4);
  OracleOptions options;
  options.threads = threads;
  const double t_fwd = BestSeconds(reps, [&] { (void)Forward<double>(p, q, k, v, options); });
  // Backward returns o and lse too: one call is a whole training step's attention.
  const double t_step =
      BestSeconds(reps, [&] { (void)Backward<double>(p, q, k, v, dout, options); });
  // The convention: 4 S^2 D forward + 10 S^2 D backward per head, halved if causal.
  const double flops = 14.0 * double(seqlen) * double(seqlen) * double(head_dim) *
                       double(p.batch * p.heads_q) * (causal ? 0.5 : 1.0);
  nlohmann::json out = {{"seqlen", seqlen},
                        {"head_dim", head_dim},
                        {"causal", causal},
                        {"threads", threads},
                        {"seconds_forward", t_fwd},
                        {"seconds_fwd_bwd", t_step},
                        {"gflops_fwd_bwd", flops / t_step * 1e-9},
                        {"peak_rss_mib", PeakRssMiB()}};
  std::cout << out.dump() << std::endl;
  return 0;
}

int RunDgemm(int64_t n, int threads, int reps) {
  openblas_set_num_threads(threads);
  const Tensor a = RandomNormal({n, n}, 5), b = RandomNormal({n, n}, 6);
  std::vector<double> c(static_cast<size_t>(n * n));
  const int ni = static_cast<int>(n);
  const double t = BestSeconds(reps, [&] {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0,
                a.data<double>(), ni, b.data<double>(), ni, 0.0, c.data(), ni);
  });
  nlohmann::json out = {{"n", n},
                        {"threads", threads},
                        {"seconds", t},
                        {"gflops", 2.0 * double(n) * double(n) * double(n) / t * 1e-9},
                        {"openblas_config", openblas_get_config()}};
  std::cout << out.dump() << std::endl;
  return 0;
}

int Usage() {
  std::cerr << "usage: oracle_bench attention --seqlen S --head-dim D [--causal] [--threads T] "
               "[--reps R]\n       oracle_bench dgemm --n N [--threads T] [--reps R]\n";
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
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* value = nullptr;
    if (a == "--causal") {
      causal = true;
      continue;
    }
    if ((value = next()) == nullptr) return attest::Usage();
    if (a == "--seqlen") {
      seqlen = std::atoll(value);
    } else if (a == "--head-dim") {
      head_dim = std::atoll(value);
    } else if (a == "--n") {
      n = std::atoll(value);
    } else if (a == "--threads") {
      threads = std::atoi(value);
    } else if (a == "--reps") {
      reps = std::atoi(value);
    } else {
      return attest::Usage();
    }
  }
  if (mode == "attention") return attest::RunAttention(seqlen, head_dim, causal, threads, reps);
  if (mode == "dgemm") return attest::RunDgemm(n, threads, reps);
  return attest::Usage();
}
