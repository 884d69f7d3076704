// Fuzz property of the case-file parser (case_file.h ParseCaseText): valid case texts, from
// CaseToText of random cases, with random mutations (reference/io/json_mutations_test_util.h:
// repeated keys, deep nesting, wrong types, edge numbers, broken UTF-8, corruption), give a
// case or an Error naming the source, never a crash, a hang or a leak (the asan preset runs
// this too). What the parser accepts is a valid case that survives CaseToText unchanged.
// Bounded by RC_PARAMS (max_success, set by ctest); reproduce a failure with the
// RC_PARAMS="reproduce=..." line RapidCheck prints.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "reference/case/case_file.h"
#include "reference/io/json_mutations_test_util.h"

namespace attest {
namespace {

constexpr std::string_view kSource = "fuzz.case.json";

// A valid case with the problem features a case file can hold.
Case GenCase() {
  Case c;
  Problem& p = c.problem;
  p.batch = *rc::gen::inRange<int64_t>(1, 4);
  p.heads_kv = *rc::gen::inRange<int64_t>(1, 4);
  p.heads_q = p.heads_kv * *rc::gen::inRange<int64_t>(1, 4);
  p.seqlen_q = *rc::gen::inRange<int64_t>(0, 300);
  p.seqlen_k = *rc::gen::inRange<int64_t>(0, 300);
  p.head_dim = *rc::gen::elementOf(std::vector<int64_t>{8, 64, 128});
  p.head_dim_v = *rc::gen::elementOf(std::vector<int64_t>{p.head_dim, 32});
  p.dtype = *rc::gen::elementOf(std::vector<DType>{DType::kF32, DType::kBF16, DType::kF16});
  p.causal = *rc::gen::arbitrary<bool>();
  if (*rc::gen::arbitrary<bool>()) p.causal_align = CausalAlign::kTopLeft;
  if (*rc::gen::arbitrary<bool>()) {
    p.window_left = *rc::gen::inRange<int64_t>(-1, 100);
    p.window_right = *rc::gen::inRange<int64_t>(-1, 100);
  }
  if (*rc::gen::arbitrary<bool>()) p.softcap = *rc::gen::elementOf(std::vector<double>{30, 0.5});
  if (*rc::gen::arbitrary<bool>()) p.scale = *rc::gen::elementOf(std::vector<double>{0.125, 1});
  if (*rc::gen::arbitrary<bool>()) {
    p.alibi_slopes = std::vector<double>(static_cast<size_t>(p.heads_q), 0.25);
  }
  if (*rc::gen::arbitrary<bool>()) {  // packed: every sequence fits the maxima
    std::vector<int32_t> q = {0}, k = {0};
    for (int64_t b = 0; b < p.batch; ++b) {
      q.push_back(q.back() + static_cast<int32_t>(*rc::gen::inRange<int64_t>(0, p.seqlen_q + 1)));
      k.push_back(k.back() + static_cast<int32_t>(*rc::gen::inRange<int64_t>(0, p.seqlen_k + 1)));
    }
    p.cu_seqlens_q = q;
    p.cu_seqlens_k = k;
  }
  if (*rc::gen::arbitrary<bool>()) {
    c.inputs = "data/x.safetensors";
  } else {
    c.generator =
        GeneratorSpec{*rc::gen::elementOf(std::vector<std::string>{"gaussian", "uniform"}),
                      *rc::gen::arbitrary<uint64_t>(), nlohmann::json::object()};
  }
  return c;
}

RC_GTEST_PROP(CaseFileFuzz, TheParserReadsBackTheCanonicalText, ()) {
  const Case c = GenCase();
  const std::string text = CaseToText(c);
  auto back = ParseCaseText(text, kSource);
  RC_ASSERT(back.ok());
  RC_ASSERT(*back == c);
  RC_ASSERT(CaseToText(*back) == text);
}

RC_GTEST_PROP(CaseFileFuzz, AMutatedCaseGivesACaseOrAnErrorNeverACrash, ()) {
  std::string text = CaseToText(GenCase());
  const auto mutations = *rc::gen::inRange(1, 5);
  for (int i = 0; i < mutations; ++i) testing::MutateJsonText(text);
  auto r = ParseCaseText(text, kSource);
  if (!r.ok()) {
    const std::string& m = r.error().message;
    RC_ASSERT(m.rfind(std::string(kSource) + ": ", 0) == 0);
    RC_ASSERT(m.size() > kSource.size() + 2);
    // Messages quote excerpts, never a whole (possibly huge) value.
    RC_ASSERT(m.size() < 2000 + text.size() / 4);
    RC_TAG("rejected");
    return;
  }
  RC_TAG("accepted");
  RC_ASSERT(Validate(r->problem).ok());
  auto again = ParseCaseText(CaseToText(*r), kSource);
  RC_ASSERT(again.ok());
  RC_ASSERT(*again == *r);
}

}  // namespace
}  // namespace attest
