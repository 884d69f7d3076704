// Properties of the generators themselves (case_gen.h): every drawn case is valid and inside
// the capabilities it was drawn for (no filtering needed), its inputs are finite, the Philox
// backend is a pure function of the seed, and every shrink candidate is valid, covered and
// strictly simpler.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "property_tests/rc_gen.h"
#include "reference/case/inputs.h"

namespace attest {
namespace {

RC_GTEST_PROP(GeneratorProperties, EveryDrawnCaseIsValidAndInsideTheKernelsCapabilities, ()) {
  const std::string name = *rc::gen::elementOf(CpuModelNames());
  const Capabilities caps = (*Kernels().Create(name))->capabilities();
  const Case c = *GenCase(caps);
  RC_ASSERT(Validate(c.problem).ok());
  std::string why;
  RC_ASSERT(caps.Covers(c.problem, &why));
  RC_ASSERT(c.problem.seqlen_q <= DrawLimits{}.max_seqlen);
  auto in = MakeCaseInputs(c);
  RC_ASSERT(in.ok());
  for (const Tensor* t : {&in->q, &in->k, &in->v}) {
    for (double x : t->span<double>()) RC_ASSERT(std::isfinite(x));
  }
}

RC_GTEST_PROP(GeneratorProperties, EveryArbitraryProblemAndDistributionIsValid,
              (const Problem& p, const GeneratorSpec& g)) {
  RC_ASSERT(Validate(p).ok());
  RC_ASSERT(ValidateGeneratorSpec(p, g).ok());
}

RC_GTEST_PROP(GeneratorProperties, ThePhiloxBackendIsAPureFunctionOfTheSeed, (uint64_t seed)) {
  const Capabilities caps = EverythingCapabilities();
  PhiloxPicker a(seed), b(seed);
  RC_ASSERT(CaseToText(DrawCase(caps, a)) == CaseToText(DrawCase(caps, b)));
}

RC_GTEST_PROP(GeneratorProperties, EveryShrinkCandidateIsValidCoveredAndStrictlySimpler, ()) {
  const std::string name = *rc::gen::elementOf(CpuModelNames());
  const Capabilities caps = (*Kernels().Create(name))->capabilities();
  const Case c = *GenCase(caps);
  for (const Case& n : ShrinkCandidates(c, caps)) {
    RC_ASSERT(Validate(n.problem).ok());
    RC_ASSERT(caps.Covers(n.problem));
    RC_ASSERT(CaseComplexity(n) < CaseComplexity(c));
  }
}

TEST(GeneratorCoverage, DrawsReachEveryMaskKindLayoutAndTileBoundary) {
  // Over 2000 Philox draws for a kernel claiming everything, each feature docs/fuzz.md lists
  // appears (a generator that silently stopped producing one would pass every property).
  int causal_br = 0, causal_tl = 0, window = 0, wide_window = 0, prefix = 0, varlen = 0,
      zero_len_doc = 0, documents = 0, softcap = 0, alibi = 0, gqa = 0, tile_pm1 = 0, tiny = 0,
      block_sparse = 0;
  for (uint64_t s = 0; s < 2000; ++s) {
    PhiloxPicker pick(s);
    const Problem p = DrawProblem(EverythingCapabilities(), pick);
    causal_br += p.causal && p.causal_align == CausalAlign::kBottomRight;
    causal_tl += p.causal && p.causal_align == CausalAlign::kTopLeft;
    window += p.window_left >= 0 || p.window_right >= 0;
    wide_window += p.window_left > p.seqlen_k || p.window_right > p.seqlen_k;
    prefix += p.prefix_lm > 0;
    varlen += p.varlen();
    documents += p.document_ids_q.has_value();
    softcap += p.softcap > 0;
    alibi += p.alibi_slopes.has_value();
    block_sparse += p.block_sparse.has_value();
    gqa += p.heads_q != p.heads_kv;
    tiny += p.seqlen_q <= 3;
    for (int64_t t : kTileSizes) tile_pm1 += p.seqlen_k == t - 1 || p.seqlen_k == t + 1;
    if (p.varlen()) {
      for (int64_t b = 0; b < p.batch; ++b) {
        const Sequence seq = SequenceOf(p, b);
        zero_len_doc += seq.q_len == 0 || seq.k_len == 0;
      }
    }
  }
  for (int count : {causal_br, causal_tl, window, wide_window, prefix, varlen, zero_len_doc,
                    documents, softcap, alibi, gqa, tile_pm1, tiny, block_sparse}) {
    EXPECT_GT(count, 20);
  }
}

}  // namespace
}  // namespace attest
