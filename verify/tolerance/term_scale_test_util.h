// Test helpers shared by the term scale tests (term_scale_test.cc) and the terms floor tests
// (terms_floor_test.cc): a seeded case, a problem of several query and key tiles, and a case
// run through the oracle and the term scales.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>

#include "reference/case/inputs.h"
#include "reference/oracle/oracle.h"
#include "verify/tolerance/term_scale.h"

namespace attest::term_scale_test {

inline Case MakeCase(const Problem& p, uint64_t seed = 7) {
  Case c;
  c.problem = p;
  c.generator = GeneratorSpec{"gaussian", seed, nlohmann::json::object()};
  return c;
}

inline Problem Base() {
  Problem p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 70;   // more than one query tile (64)
  p.seqlen_k = 300;  // more than one key tile (256)
  p.head_dim = 16;
  p.head_dim_v = 8;
  p.dtype = DType::kBF16;
  return p;
}

struct Computed {
  CaseInputs in;
  BackwardOut ref;
  GradientTermScales terms;
};

inline Computed RunCase(const Problem& p, uint64_t seed = 7) {
  auto in = MakeCaseInputs(MakeCase(p, seed));
  EXPECT_TRUE(in.ok()) << in.error().message;
  Computed c{*in, Backward<double>(p, in->q, in->k, in->v, in->dout), {}};
  auto t = ComputeGradientTermScales(p, c.in.q, c.in.k, c.in.v, c.in.dout, c.ref.lse);
  EXPECT_TRUE(t.ok()) << t.error().message;
  c.terms = *t;
  return c;
}

}  // namespace attest::term_scale_test
