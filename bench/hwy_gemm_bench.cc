// Highway evaluation (bench/README.md "Highway"): the oracle's panel product
// (reference/oracle/oracle_gemm.h) by its Highway micro-kernel (reference/oracle/oracle_gemm.cc)
// and by the hand-written AVX-512 and AVX2 micro-kernels it replaced (bench/hand_gemm.cc), side
// by side in one process on the same inputs, at square sizes and at the float64 oracle's tile
// products (128 x 128 tiles, D = 64 and 128). For each
// shape and ISA it prints GFLOP/s of both (per CPU second of the calling thread, so that time
// spent waiting for a core is left out), their ratio (median and range over --rounds rounds, each
// the best of --reps timed runs, the two kernels interleaved), OpenBLAS dgemm's best rate over
// the core types it offers here (child processes with OPENBLAS_CORETYPE set, one per type: the
// machine's default pick can be a slow kernel), and whether the two kernels' bits are identical
// (and identical to the portable kernel's, up to 512^3).
//   hwy_gemm_bench [--rounds 3] [--reps 5] [--min-seconds 0.05] [--max-n 2048] [--no-openblas]
//   hwy_gemm_bench --openblas M N K TRANS_A   (child: one OpenBLAS rate, GFLOP/s per CPU s)
#include <time.h>

#include <algorithm>
#include <cblas.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <hwy/highway.h>  // HWY_MAJOR, HWY_MINOR, the HWY_* target bits

#include "bench/hand_gemm.h"
#include "reference/oracle/oracle_gemm.h"

namespace {

using attest::oracle_internal::GemmPanelsOn;
using attest::oracle_internal::kPanelWidth;
using attest::oracle_internal::PackPanels;
using attest::oracle_internal::PanelCount;
using attest::oracle_internal::Panels;

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// One product of the oracle: C (m x n) = alpha A B or C += A B, A read through (a_rs, a_cs).
struct Shape {
  const char* name;
  int64_t m, n, k;
  bool trans_a;  // A stored k x m (a_rs = 1, a_cs = m): the P^T dO and dS^T Q products
  bool accumulate;
  double alpha;
};

struct Problem {
  Shape s;
  std::vector<double> a, b, panels, c0;
  Panels bp() const { return {panels.data(), s.k * kPanelWidth}; }
  int64_t a_rs() const { return s.trans_a ? 1 : s.k; }
  int64_t a_cs() const { return s.trans_a ? s.m : 1; }
  double flops() const { return 2.0 * double(s.m) * double(s.n) * double(s.k); }
};

Problem Make(const Shape& s, uint64_t seed) {
  Problem p{s, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  p.a.resize(static_cast<size_t>(s.m * s.k));
  p.b.resize(static_cast<size_t>(s.k * s.n));
  p.c0.resize(static_cast<size_t>(s.m * s.n));
  for (double& x : p.a) x = normal(rng);
  for (double& x : p.b) x = normal(rng);
  for (double& x : p.c0) x = normal(rng);
  p.panels.resize(static_cast<size_t>(PanelCount(s.n) * s.k * kPanelWidth));
  PackPanels(p.b.data(), s.k, s.n, s.n, 1, p.panels.data());
  return p;
}

// A kernel under test: runs the product into c (which holds c0 on entry).
struct Kernel {
  std::string name;
  bool (*run)(const void* ctx, const Problem& p, double* c);
  const void* ctx;
};

bool RunHand(const void* ctx, const Problem& p, double* c) {
  return attest::hand_gemm::GemmPanelsOn(static_cast<const char*>(ctx), p.s.m, p.s.n, p.s.k,
                                         p.a.data(), p.a_rs(), p.a_cs(), p.bp(), p.s.alpha,
                                         p.s.accumulate, c, p.s.n);
}
// The oracle's version of the same name (its Highway kernel on that target).
bool RunHwy(const void* ctx, const Problem& p, double* c) {
  return GemmPanelsOn(static_cast<const char*>(ctx), p.s.m, p.s.n, p.s.k, p.a.data(), p.a_rs(),
                      p.a_cs(), p.bp(), p.s.alpha, p.s.accumulate, c, p.s.n);
}

// Seconds of thread CPU time per call: the best over `reps` timings, each of enough calls to
// last min_seconds.
double TimeOne(const Kernel& k, const Problem& p, std::vector<double>& c, int calls) {
  std::copy(p.c0.begin(), p.c0.end(), c.begin());
  const double t0 = ThreadCpuSeconds();
  for (int i = 0; i < calls; ++i) k.run(k.ctx, p, c.data());
  return (ThreadCpuSeconds() - t0) / calls;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// OpenBLAS's rate for the shape in a child process per core type; the best of them.
std::string g_self;
double OpenBlasBest(const Shape& s, std::string* which) {
  double best = 0;
  for (const char* type : {"", "Haswell", "SkylakeX", "Cooperlake"}) {
    std::string cmd = "env -u OPENBLAS_CORETYPE ";
    if (*type) cmd += std::string("OPENBLAS_CORETYPE=") + type + " ";
    cmd += "OPENBLAS_NUM_THREADS=1 '" + g_self + "' --openblas " + std::to_string(s.m) + " " +
           std::to_string(s.n) + " " + std::to_string(s.k) + " " + (s.trans_a ? "1" : "0");
    FILE* f = popen(cmd.c_str(), "r");
    if (f == nullptr) continue;
    double rate = 0;
    if (std::fscanf(f, "%lf", &rate) != 1) rate = 0;
    pclose(f);
    if (rate > best) {
      best = rate;
      *which = *type ? type : "default";
    }
  }
  return best;
}

int OpenBlasChild(int64_t m, int64_t n, int64_t k, bool trans_a) {
  openblas_set_num_threads(1);
  const Problem p = Make(Shape{"", m, n, k, trans_a, false, 1.0}, 1);
  std::vector<double> c(p.c0.size());
  const int mi = int(m), ni = int(n), ki = int(k);
  auto call = [&] {
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, CblasNoTrans, mi, ni, ki, 1.0,
                p.a.data(), trans_a ? mi : ki, p.b.data(), ni, 0.0, c.data(), ni);
  };
  call();
  int calls = 1;
  for (double t0 = ThreadCpuSeconds(); ThreadCpuSeconds() - t0 < 0.02 && calls < 100000;) {
    call();
    ++calls;
  }
  double best = 1e300;
  for (int r = 0; r < 5; ++r) {
    const double t0 = ThreadCpuSeconds();
    for (int i = 0; i < calls; ++i) call();
    best = std::min(best, (ThreadCpuSeconds() - t0) / calls);
  }
  std::printf("%.3f\n", p.flops() / best * 1e-9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  g_self = argv[0];
  if (argc == 6 && std::strcmp(argv[1], "--openblas") == 0) {
    return OpenBlasChild(std::atoll(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]),
                         std::atoi(argv[5]) != 0);
  }
  int rounds = 3, reps = 5;
  double min_seconds = 0.05;
  int64_t max_n = 2048;
  bool openblas = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-openblas") {
      openblas = false;
    } else if (i + 1 < argc && a == "--rounds") {
      rounds = std::atoi(argv[++i]);
    } else if (i + 1 < argc && a == "--reps") {
      reps = std::atoi(argv[++i]);
    } else if (i + 1 < argc && a == "--min-seconds") {
      min_seconds = std::atof(argv[++i]);
    } else if (i + 1 < argc && a == "--max-n") {
      max_n = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: hwy_gemm_bench [--rounds R] [--reps N] [--min-seconds S] "
                   "[--max-n N] [--no-openblas]\n");
      return 2;
    }
  }
  const double scale = 1.0 / std::sqrt(128.0);
  std::vector<Shape> shapes = {
      {"square 256", 256, 256, 256, false, false, 1.0},
      {"square 512", 512, 512, 512, false, false, 1.0},
      {"square 1024", 1024, 1024, 1024, false, false, 1.0},
      {"square 2048", 2048, 2048, 2048, false, false, 1.0},
      // The oracle's tile products at its default 128 x 128 tiles (oracle_double.cc).
      {"S = scale Q K^T, D=128", 128, 128, 128, false, false, scale},
      {"O += P V, D=128", 128, 128, 128, false, true, 1.0},
      {"dV += P^T dO, D=128", 128, 128, 128, true, true, 1.0},
      {"S = scale Q K^T, D=64", 128, 128, 64, false, false, scale},
      {"O += P V, D=64", 128, 64, 128, false, true, 1.0},
      {"dV += P^T dO, D=64", 128, 64, 128, true, true, 1.0},
      // A ragged edge: 5 rows and a 20-column panel left over.
      {"ragged 131 x 84 x 200", 131, 84, 200, false, false, 0.5},
  };
  std::erase_if(shapes, [&](const Shape& s) { return s.m > max_n; });

  // The ISAs this CPU runs, by both (the oracle names its Highway targets the same way).
  std::vector<const char*> isas;
  for (const char* isa : {"avx512", "avx2"}) {
    const std::vector<double> one(kPanelWidth, 0.0);
    double c = 0;
    const Panels b{one.data(), kPanelWidth};
    if (GemmPanelsOn(isa, 1, 1, 1, one.data(), 1, 1, b, 1.0, false, &c, 1) &&
        attest::hand_gemm::GemmPanelsOn(isa, 1, 1, 1, one.data(), 1, 1, b, 1.0, false, &c, 1)) {
      isas.push_back(isa);
    }
  }
  std::printf("Highway %d.%d; the oracle's products run its %s version here.\n", HWY_MAJOR,
              HWY_MINOR, attest::oracle_internal::GemmPanelsIsa());
  std::printf("One thread; GFLOP/s per CPU second of the thread; %d rounds, each the best of %d "
              "timed runs (>= %.2f s each) per kernel, kernels interleaved; ratio = Highway / "
              "hand-written, median [min, max] over the rounds.\n\n",
              rounds, reps, min_seconds);
  std::printf("| shape (m x n x k) | ISA | hand-written GFLOP/s | Highway GFLOP/s | ratio | %s"
              "bits |\n",
              openblas ? "OpenBLAS best (core type) | " : "");
  std::printf("|---|---|---:|---:|---:|%s---|\n", openblas ? "---:|" : "");
  bool all_equal = true;
  std::vector<double> all_ratios;
  for (const Shape& s : shapes) {
    const Problem p = Make(s, 7);
    std::vector<double> c(p.c0.size()), c_ref(p.c0.size()), c_portable;
    if (s.m <= 512) {
      c_portable = p.c0;
      GemmPanelsOn("portable", s.m, s.n, s.k, p.a.data(), p.a_rs(), p.a_cs(), p.bp(), s.alpha,
                   s.accumulate, c_portable.data(), s.n);
    }
    std::string ob_type;
    const double ob = openblas ? OpenBlasBest(s, &ob_type) : 0;
    for (const char* isa : isas) {
      const Kernel hand{isa, RunHand, isa};
      const Kernel hwy{isa, RunHwy, isa};
      // Bits: one call each from the same C.
      c_ref = p.c0;
      hand.run(hand.ctx, p, c_ref.data());
      c = p.c0;
      hwy.run(hwy.ctx, p, c.data());
      const bool same = std::memcmp(c.data(), c_ref.data(), c.size() * sizeof(double)) == 0;
      const bool same_portable =
          c_portable.empty() ||
          std::memcmp(c.data(), c_portable.data(), c.size() * sizeof(double)) == 0;
      all_equal = all_equal && same && same_portable;
      // Calls per timing.
      int calls = 1;
      for (double t0 = ThreadCpuSeconds(); ThreadCpuSeconds() - t0 < min_seconds;) {
        hand.run(hand.ctx, p, c.data());
        ++calls;
      }
      std::vector<double> hand_rates, hwy_rates, ratios;
      for (int r = 0; r < rounds; ++r) {
        double t_hand = 1e300, t_hwy = 1e300;
        for (int i = 0; i < reps; ++i) {
          // Alternate which kernel goes first.
          if (i % 2 == 0) {
            t_hand = std::min(t_hand, TimeOne(hand, p, c, calls));
            t_hwy = std::min(t_hwy, TimeOne(hwy, p, c, calls));
          } else {
            t_hwy = std::min(t_hwy, TimeOne(hwy, p, c, calls));
            t_hand = std::min(t_hand, TimeOne(hand, p, c, calls));
          }
        }
        hand_rates.push_back(p.flops() / t_hand * 1e-9);
        hwy_rates.push_back(p.flops() / t_hwy * 1e-9);
        ratios.push_back(t_hand / t_hwy);
      }
      all_ratios.insert(all_ratios.end(), ratios.begin(), ratios.end());
      char ob_cell[64] = "";
      if (openblas) std::snprintf(ob_cell, sizeof ob_cell, "%.1f (%s) | ", ob, ob_type.c_str());
      std::printf("| %s (%lld x %lld x %lld%s%s) | %s | %.1f | %.1f | %.3f [%.3f, %.3f] | "
                  "%s%s |\n",
                  s.name, (long long)s.m, (long long)s.n, (long long)s.k,
                  s.trans_a ? ", A^T" : "", s.accumulate ? ", +=" : "", isa, Median(hand_rates),
                  Median(hwy_rates), Median(ratios),
                  *std::min_element(ratios.begin(), ratios.end()),
                  *std::max_element(ratios.begin(), ratios.end()), ob_cell,
                  !same ? "DIFFER" : c_portable.empty() ? "equal" : same_portable
                                                                    ? "equal (= portable)"
                                                                    : "DIFFER from portable");
      std::fflush(stdout);
    }
  }
  std::printf("\nHighway / hand-written over every shape, ISA and round: median %.3f, min %.3f, "
              "max %.3f. Bits: %s.\n",
              Median(all_ratios), *std::min_element(all_ratios.begin(), all_ratios.end()),
              *std::max_element(all_ratios.begin(), all_ratios.end()),
              all_equal ? "identical everywhere" : "SOME DIFFER");
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) == 3) std::printf("1-minute load average at the end: %.2f.\n", load[0]);
  return all_equal ? 0 : 1;
}
