// Test helpers for the oracle tests (oracle_test.cc, oracle_cert_test.cc): seeded inputs,
// one small Problem per feature of reference/problem (built directly, not parsed), and
// element-wise comparisons.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "reference/problem/problem.h"
#include "reference/tensor.h"

namespace attest::oracle_test {

// Gaussian values times `sigma`, rounded to bf16's 8 significant bits so that the inputs
// look like what a kernel sees (and dot products of them are exact in double for small D).
inline Tensor Random(const Shape& shape, uint64_t seed, double sigma = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<double> values(static_cast<size_t>(Tensor::NumElements(shape)));
  for (double& x : values) {
    const double r = dist(rng);
    int e = 0;
    std::frexp(r, &e);
    x = std::ldexp(std::nearbyint(std::ldexp(r, 8 - e)), e - 8);
  }
  return Tensor::FromF64(shape, std::move(values));
}

struct Inputs {
  Tensor q, k, v, dout;
};

inline Inputs RandomInputs(const Problem& p, uint64_t seed, double q_sigma = 1.0) {
  return {Random(p.QShape(), seed * 4 + 1, q_sigma), Random(p.KShape(), seed * 4 + 2),
          Random(p.VShape(), seed * 4 + 3), Random(p.OShape(), seed * 4 + 4)};
}

struct NamedProblem {
  std::string name;
  Problem p;
  double q_sigma = 1.0;  // larger: sharper softmax, larger condition numbers
};

inline Problem Base(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d,
                    int64_t dv) {
  Problem p;
  p.batch = b;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = d;
  p.head_dim_v = dv;
  p.dtype = DType::kBF16;
  return p;
}

// One problem per feature of Problem / mask.h; every one passes Validate.
inline std::vector<NamedProblem> FeatureProblems() {
  std::vector<NamedProblem> out;
  out.push_back({"plain", Base(2, 2, 2, 13, 17, 8, 8)});
  {
    Problem p = Base(1, 2, 1, 19, 11, 8, 8);  // Sq > Sk: top 8 rows empty
    p.causal = true;
    out.push_back({"causal_bottom_right_sq_gt_sk", p});
  }
  {
    Problem p = Base(2, 2, 2, 9, 21, 8, 6);
    p.causal = true;
    out.push_back({"causal_bottom_right_sq_lt_sk", p});
  }
  {
    Problem p = Base(1, 2, 2, 19, 11, 8, 8);
    p.causal = true;
    p.causal_align = CausalAlign::kTopLeft;
    out.push_back({"causal_top_left", p});
  }
  {
    Problem p = Base(1, 2, 2, 16, 23, 8, 8);
    p.window_left = 3;
    p.window_right = 2;
    out.push_back({"window_3_2", p});
  }
  {
    Problem p = Base(1, 2, 2, 16, 16, 8, 8);
    p.window_left = 0;
    p.window_right = 0;
    out.push_back({"window_0_0", p});
  }
  {
    Problem p = Base(1, 1, 1, 14, 9, 8, 8);
    p.causal = true;
    p.window_left = 4;
    out.push_back({"causal_window_left_4", p});
  }
  {
    Problem p = Base(1, 1, 1, 12, 12, 8, 8);
    p.window_left = -1;
    p.window_right = 2;
    out.push_back({"window_right_only", p});
  }
  {
    Problem p = Base(1, 2, 2, 18, 18, 8, 8);
    p.causal = true;
    p.prefix_lm = 5;
    out.push_back({"prefix_lm", p});
  }
  {
    Problem p = Base(2, 2, 1, 15, 15, 8, 8);
    p.document_ids_q =
        std::vector<std::vector<int32_t>>{{0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3},
                                          {5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 9}};
    p.document_ids_k =
        std::vector<std::vector<int32_t>>{{0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3},
                                          {5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7}};
    p.causal = true;  // document + causal, and a query document (9) with no key
    out.push_back({"document_ids_causal", p});
  }
  {
    Problem p = Base(1, 2, 2, 17, 19, 8, 8);
    BlockSparse bs;
    bs.block_q = 4;
    bs.block_k = 3;
    bs.blocks = {{0, 0}, {0, 2}, {1, 1}, {2, 0}, {2, 3}, {2, 6}, {4, 5}, {3, 4}};
    p.block_sparse = bs;
    out.push_back({"block_sparse", p});
  }
  out.push_back({"gqa_ratio_2", Base(1, 4, 2, 11, 13, 8, 8)});
  {
    Problem p = Base(2, 4, 1, 10, 12, 8, 8);
    p.causal = true;
    out.push_back({"gqa_ratio_4_causal", p});
  }
  out.push_back({"dv_ne_d", Base(1, 2, 2, 12, 14, 12, 5)});
  {
    Problem p = Base(1, 2, 2, 13, 15, 8, 8);
    p.softcap = 2.5;
    out.push_back({"softcap", p, 3.0});
  }
  {
    Problem p = Base(1, 2, 2, 13, 15, 8, 8);
    p.alibi_slopes = std::vector<double>{0.5, 0.0625};
    out.push_back({"alibi", p});
  }
  {
    Problem p = Base(1, 4, 2, 14, 17, 8, 8);
    p.softcap = 4.0;
    p.causal = true;
    p.alibi_slopes = std::vector<double>{0.25, 0.125, 0.0625, 0.03125};
    out.push_back({"softcap_alibi_causal", p, 2.0});
  }
  {
    Problem p = Base(4, 2, 1, 9, 12, 8, 8);
    p.cu_seqlens_q = std::vector<int32_t>{0, 5, 5, 14, 17};  // sequence 1: zero-length
    p.cu_seqlens_k = std::vector<int32_t>{0, 7, 7, 19, 19};  // sequence 3: no keys at all
    out.push_back({"varlen", p});
  }
  {
    Problem p = Base(3, 2, 2, 8, 10, 8, 8);
    p.cu_seqlens_q = std::vector<int32_t>{0, 8, 11, 11};
    p.cu_seqlens_k = std::vector<int32_t>{0, 4, 14, 18};
    p.causal = true;
    p.window_left = 3;
    out.push_back({"varlen_causal_window", p});
  }
  out.push_back({"sk_1", Base(2, 2, 2, 6, 1, 8, 8)});
  {
    Problem p = Base(1, 2, 2, 10, 10, 16, 16);
    p.scale = 0.5;
    out.push_back({"explicit_scale_sharp", p});
  }
  return out;
}

inline double MaxAbs(const Tensor& t) {
  double m = 0;
  for (double x : t.span<const double>()) {
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  }
  return m;
}

// max |a - b| over elements; equal infinities (lse = -inf) count as 0, any other non-finite
// difference as +inf.
inline double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  double m = 0;
  auto x = a.span<const double>();
  auto y = b.span<const double>();
  if (x.size() != y.size()) return INFINITY;
  for (size_t e = 0; e < x.size(); ++e) {
    if (x[e] == y[e]) continue;
    const double d = std::abs(x[e] - y[e]);
    m = std::max(m, std::isnan(d) ? INFINITY : d);
  }
  return m;
}

}  // namespace attest::oracle_test
