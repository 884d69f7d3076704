// oracle_digest: what the float64 oracle computes, as one line per result with a 64-bit FNV-1a
// hash of its bytes, so that two builds (another compiler, another CPU architecture: see
// aarch64_test.sh) can be compared bit for bit with diff. Inputs come from a fixed integer
// generator (no libm), so both sides see the same bits.
//   - gemm: the oracle's panel products (reference/oracle/oracle_gemm.h) on ragged and tile
//     shapes, by the version GemmPanels picks; every other version this machine runs must give
//     the same bits (checked here; the versions run go to stderr).
//   - exp: the oracle's vector exp (reference/oracle/oracle_exp.h) over [-745, 710].
//   - forward / backward: Forward<double> and Backward<double> (reference/oracle/oracle.h) on
//     small problems: full, causal with GQA and ragged head sizes, sliding window with ALiBi.
// `oracle_digest gemm` prints the gemm lines alone (qemu emulates long SVE vectors slowly).
// Exit 1 if two versions of the products disagree.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_exp.h"
#include "reference/oracle/oracle_gemm.h"

namespace {

using namespace attest;
using namespace attest::oracle_internal;

uint64_t Fnv(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
uint64_t Fnv(const std::vector<double>& v) { return Fnv(v.data(), v.size() * sizeof(double)); }
uint64_t Fnv(const Tensor& t) {
  const auto s = t.span<double>();
  return Fnv(s.data(), s.size() * sizeof(double));
}

// splitmix64: uniform doubles in [-1, 1) from integers alone.
struct Rng {
  uint64_t s;
  double Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1p-52 - 1.0;
  }
};

std::vector<double> Random(int64_t n, uint64_t seed) {
  Rng rng{seed};
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = rng.Next();
  return v;
}

bool g_ok = true;

void Gemm(const char* name, int64_t m, int64_t n, int64_t k, bool trans_a, bool accumulate,
          double alpha) {
  const std::vector<double> a = Random(m * k, 1), b = Random(k * n, 2), c0 = Random(m * n, 3);
  std::vector<double> panels(static_cast<size_t>(PanelCount(n) * k * kPanelWidth));
  PackPanels(b.data(), k, n, n, 1, panels.data());
  const Panels bp{panels.data(), k * kPanelWidth};
  const int64_t a_rs = trans_a ? 1 : k, a_cs = trans_a ? m : 1;
  std::vector<double> c = c0;
  GemmPanels(m, n, k, a.data(), a_rs, a_cs, bp, alpha, accumulate, c.data(), n);
  for (const char* isa : {"portable", "avx512", "avx2", "neon", "sve", "sve2", "sve_256",
                          "sve2_128"}) {
    std::vector<double> other = c0;
    if (!GemmPanelsOn(isa, m, n, k, a.data(), a_rs, a_cs, bp, alpha, accumulate, other.data(),
                      n)) {
      continue;
    }
    if (std::memcmp(other.data(), c.data(), c.size() * sizeof(double)) != 0) {
      std::fprintf(stderr, "FAIL: gemm %s: the %s version differs from the %s one\n", name, isa,
                   GemmPanelsIsa());
      g_ok = false;
    }
  }
  std::printf("gemm %s %016llx\n", name, static_cast<unsigned long long>(Fnv(c)));
}

void Exp() {
  std::vector<double> x;
  for (double v = -745.0; v <= 710.0; v += 0.0137) x.push_back(v);
  for (double v : {0.0, -0.0, 1e-300, -1e-300, 709.78, -708.4, -744.44, -746.0, 710.0}) {
    x.push_back(v);
  }
  ExpInPlace(x.data(), static_cast<int64_t>(x.size()));
  std::printf("exp %zu values %016llx\n", x.size(), static_cast<unsigned long long>(Fnv(x)));
}

void Attention(const char* name, Problem p, int threads) {
  p.dtype = DType::kF64;
  const Tensor q = Tensor::FromF64(p.QShape(), Random(Tensor::NumElements(p.QShape()), 11));
  const Tensor k = Tensor::FromF64(p.KShape(), Random(Tensor::NumElements(p.KShape()), 12));
  const Tensor v = Tensor::FromF64(p.VShape(), Random(Tensor::NumElements(p.VShape()), 13));
  const Tensor dout = Tensor::FromF64(p.OShape(), Random(Tensor::NumElements(p.OShape()), 14));
  OracleOptions options;
  options.threads = threads;
  options.tile_q = 64;  // several tiles (and a ragged last one) on these small problems
  options.tile_k = 48;
  const ForwardOut f = Forward<double>(p, q, k, v, options);
  std::printf("forward %s o %016llx lse %016llx\n", name,
              static_cast<unsigned long long>(Fnv(f.o)),
              static_cast<unsigned long long>(Fnv(f.lse)));
  const BackwardOut b = Backward<double>(p, q, k, v, dout, options);
  std::printf("backward %s o %016llx lse %016llx dq %016llx dk %016llx dv %016llx\n", name,
              static_cast<unsigned long long>(Fnv(b.o)),
              static_cast<unsigned long long>(Fnv(b.lse)),
              static_cast<unsigned long long>(Fnv(b.dq)),
              static_cast<unsigned long long>(Fnv(b.dk)),
              static_cast<unsigned long long>(Fnv(b.dv)));
}

}  // namespace

int main(int argc, char** argv) {
  const bool gemm_only = argc > 1 && std::strcmp(argv[1], "gemm") == 0;
  std::fprintf(stderr, "oracle_digest: GemmPanels runs the %s version; checked against:",
               GemmPanelsIsa());
  for (const char* isa : {"portable", "avx512", "avx2", "neon", "sve", "sve2", "sve_256",
                          "sve2_128"}) {
    double c = 0, one = 1;
    std::vector<double> panel(kPanelWidth, 0.0);
    if (GemmPanelsOn(isa, 1, 1, 1, &one, 1, 1, Panels{panel.data(), kPanelWidth}, 1.0, false, &c,
                     1)) {
      std::fprintf(stderr, " %s", isa);
    }
  }
  std::fprintf(stderr, "\n");
  Gemm("131x84x200", 131, 84, 200, false, false, 0.5);
  Gemm("128x128x128+=AT", 128, 128, 128, true, true, 1.0);
  Gemm("7x33x300", 7, 33, 300, false, false, 1.0);
  Gemm("64x40x129+=", 64, 40, 129, false, true, 1.0);
  if (gemm_only) return g_ok ? 0 : 1;
  Exp();
  Problem full;
  full.heads_q = full.heads_kv = 2;
  full.seqlen_q = full.seqlen_k = 150;
  full.head_dim = full.head_dim_v = 64;
  Attention("full", full, 2);
  Problem gqa;
  gqa.heads_q = 4;
  gqa.heads_kv = 2;
  gqa.seqlen_q = 130;
  gqa.seqlen_k = 170;
  gqa.head_dim = 48;
  gqa.head_dim_v = 40;
  gqa.causal = true;
  Attention("causal-gqa", gqa, 2);
  Problem window;
  window.heads_q = window.heads_kv = 2;
  window.seqlen_q = window.seqlen_k = 140;
  window.head_dim = window.head_dim_v = 32;
  window.window_left = 40;
  window.window_right = 10;
  window.alibi_slopes = std::vector<double>{0.25, 0.0625};
  Attention("window-alibi", window, 1);
  return g_ok ? 0 : 1;
}
