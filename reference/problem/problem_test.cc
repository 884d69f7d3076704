// Problem JSON, validation and shapes (problem.h) against docs/design.md "Case files" and
// "Semantics": every rule is shown rejecting a value by name, and the JSON round-trips.
#include "reference/problem/problem.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace attest {
namespace {

using nlohmann::json;

// docs/design.md's example, verbatim.
json DesignExample() {
  return json::parse(R"({
    "batch": 1, "heads_q": 4, "heads_kv": 2, "seqlen_q": 77, "seqlen_k": 130,
    "head_dim": 64, "head_dim_v": 64, "dtype": "bf16", "scale": null,
    "causal": true, "causal_align": "bottom_right", "window": [-1, -1],
    "softcap": 0.0, "alibi_slopes": null, "cu_seqlens_q": null, "cu_seqlens_k": null
  })");
}

// Parses DesignExample() with `patch` merged in and expects an error containing `needle`.
void ExpectRejected(const json& patch, const std::string& needle) {
  json j = DesignExample();
  j.merge_patch(patch);
  const auto p = ProblemFromJson(j);
  ASSERT_FALSE(p.ok()) << "accepted: " << patch.dump();
  EXPECT_NE(p.error().message.find(needle), std::string::npos)
      << "message \"" << p.error().message << "\" lacks \"" << needle << "\"";
}

TEST(ProblemJson, ParsesTheDesignExample) {
  const auto p = ProblemFromJson(DesignExample());
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->batch, 1);
  EXPECT_EQ(p->heads_q, 4);
  EXPECT_EQ(p->heads_kv, 2);
  EXPECT_EQ(p->seqlen_q, 77);
  EXPECT_EQ(p->seqlen_k, 130);
  EXPECT_EQ(p->dtype, DType::kBF16);
  EXPECT_FALSE(p->scale.has_value());
  EXPECT_EQ(p->EffectiveScale(), 0.125);
  EXPECT_TRUE(p->causal);
  EXPECT_EQ(p->KvHead(3), 1);
  EXPECT_EQ(p->QShape(), (Shape{1, 77, 4, 64}));
  EXPECT_EQ(p->KShape(), (Shape{1, 130, 2, 64}));
  EXPECT_EQ(p->LseShape(), (Shape{1, 4, 77}));
}

TEST(ProblemJson, CanonicalJsonRoundTripsExactly) {
  // The design example is already canonical (every field, nulls included).
  const auto p = ProblemFromJson(DesignExample());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(ProblemToJson(*p), DesignExample());
  // A problem with every extension in use.
  json j = DesignExample();
  j["seqlen_q"] = 4;
  j["seqlen_k"] = 6;
  j["scale"] = 0.3;
  j["window"] = {3, 0};
  j["softcap"] = 30.0;
  j["alibi_slopes"] = {0.5, 0.25, 0.125, 0.0625};
  j["document_ids_q"] = {{0, 0, 1, 1}};
  j["document_ids_k"] = {{0, 0, 0, 1, 1, 1}};
  j["prefix_lm"] = 2;
  j["block_sparse"] = {{"block_q", 2}, {"block_k", 3}, {"blocks", {{0, 0}, {1, 1}}}};
  j["sink"] = true;
  j["rel_bias"] = true;
  j["num_splits"] = 3;
  const auto q = ProblemFromJson(j);
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_EQ(ProblemToJson(*q), j);
  EXPECT_EQ(ProblemFromJson(ProblemToJson(*q)).value(), *q);
}

TEST(ProblemJson, RandomProblemsRoundTrip) {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 300; ++trial) {
    Problem p;
    p.batch = 1 + static_cast<int64_t>(rng() % 3);
    p.heads_kv = 1 + static_cast<int64_t>(rng() % 3);
    p.heads_q = p.heads_kv * (1 + static_cast<int64_t>(rng() % 3));
    p.seqlen_q = static_cast<int64_t>(rng() % 9);
    p.seqlen_k = static_cast<int64_t>(rng() % 9);
    p.head_dim = 1 + static_cast<int64_t>(rng() % 256);
    p.head_dim_v = 1 + static_cast<int64_t>(rng() % 256);
    p.dtype = std::array{DType::kF64, DType::kF32,    DType::kBF16,
                         DType::kF16, DType::kE4M3FN, DType::kE5M2}[rng() % 6];
    if (rng() % 2) p.scale = std::ldexp(static_cast<double>(rng() % 1000 + 1), -7) / 3.0;
    p.causal = rng() % 2;
    p.causal_align = rng() % 2 ? CausalAlign::kTopLeft : CausalAlign::kBottomRight;
    p.window_left = static_cast<int64_t>(rng() % 5) - 1;
    p.window_right = static_cast<int64_t>(rng() % 5) - 1;
    p.softcap = rng() % 2 ? 0.0 : 1.0 / 7.0 * static_cast<double>(rng() % 100);
    if (rng() % 2) {
      p.alibi_slopes.emplace();
      for (int64_t h = 0; h < p.heads_q; ++h) p.alibi_slopes->push_back(std::exp2(-0.7 * h));
    }
    if (p.causal && rng() % 2) p.prefix_lm = static_cast<int64_t>(rng() % 5);
    if (rng() % 3 == 0) {
      std::vector<int32_t> cq{0}, ck{0};
      for (int64_t b = 0; b < p.batch; ++b) {
        cq.push_back(cq.back() + static_cast<int32_t>(rng() % (p.seqlen_q + 1)));
        ck.push_back(ck.back() + static_cast<int32_t>(rng() % (p.seqlen_k + 1)));
      }
      p.cu_seqlens_q = cq;
      p.cu_seqlens_k = ck;
    }
    ASSERT_TRUE(Validate(p).ok()) << Validate(p).error().message;
    const json j = ProblemToJson(p);
    const auto back = ProblemFromJson(j);
    ASSERT_TRUE(back.ok()) << back.error().message << "\n" << j.dump();
    EXPECT_EQ(*back, p) << j.dump();
    // Through text too: doubles are written with round-trip precision.
    EXPECT_EQ(ProblemFromJson(json::parse(j.dump())).value(), p);
    EXPECT_EQ(ProblemToJson(*back), j);
  }
}

TEST(ProblemJson, MissingFieldsTakeTheStructDefaults) {
  const auto p = ProblemFromJson(json::object());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, Problem{});
  const auto q = ProblemFromJson(json{{"seqlen_k", 0}});
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->seqlen_k, 0);
}

TEST(ProblemJson, AcceptsDtypeAliasesAndWritesTheCanonicalName) {
  const auto p = ProblemFromJson(json{{"dtype", "float16"}});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(ProblemToJson(*p).at("dtype"), "f16");
}

TEST(ProblemJson, RejectsUnknownFieldsWithASuggestion) {
  ExpectRejected({{"caual", true}}, "problem: unknown field \"caual\" (did you mean \"causal\"?)");
  ExpectRejected({{"casual", true}},
                 "problem: unknown field \"casual\" (did you mean \"causal\"?)");
  {
    json j = DesignExample();
    j["bogus_thing"] = 1;
    EXPECT_EQ(ProblemFromJson(j).error().message, "problem: unknown field \"bogus_thing\"");
  }
  ExpectRejected({{"block_sparse", {{"blocks", json::array()}, {"blok_q", 4}}}},
                 "problem.block_sparse: unknown field \"blok_q\"");
}

TEST(ProblemJson, RejectsWrongTypesNamingTheField) {
  ExpectRejected({{"batch", 1.5}}, "problem.batch: expected an integer");
  ExpectRejected({{"batch", "2"}}, "problem.batch: expected an integer");
  ExpectRejected({{"causal", 1}}, "problem.causal: expected true or false");
  ExpectRejected({{"sink", 1}}, "problem.sink: expected true or false");
  ExpectRejected({{"sink", "true"}}, "problem.sink: expected true or false");
  ExpectRejected({{"rel_bias", 1}}, "problem.rel_bias: expected true or false");
  ExpectRejected({{"num_splits", 1.5}}, "problem.num_splits: expected an integer");
  ExpectRejected({{"num_splits", -1}}, "problem.num_splits: -1 must be >= 0");
  ExpectRejected({{"num_splits", 1025}}, "problem.num_splits: 1025 is out of range [0, 1024]");
  ExpectRejected({{"dtype", 3}}, "problem.dtype: expected a string");
  ExpectRejected({{"scale", "x"}}, "problem.scale: expected a number");
  ExpectRejected({{"window", {1}}}, "problem.window: expected [left, right]");
  ExpectRejected({{"window", {1, 0.5}}}, "problem.window[1]: expected an integer");
  {
    // (merge_patch would treat null as "delete", so set it directly.)
    json j = DesignExample();
    j["window"] = nullptr;
    const auto r = ProblemFromJson(j);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("problem.window: expected [left, right], got null"),
              std::string::npos);
  }
  ExpectRejected({{"alibi_slopes", {1, "a", 1, 1}}}, "problem.alibi_slopes[1]");
  ExpectRejected({{"cu_seqlens_q", {0, 3000000000LL}}, {"cu_seqlens_k", {0, 1}}},
                 "problem.cu_seqlens_q[1]: 3000000000 does not fit in int32");
  ExpectRejected({{"document_ids_q", {{0, 1.5}}}}, "problem.document_ids_q[0][1]");
  ExpectRejected({{"block_sparse", {{"blocks", {{0}}}}}}, "problem.block_sparse.blocks[0]");
  ExpectRejected({{"block_sparse", {{"block_q", 4}}}}, "problem.block_sparse.blocks: missing");
  const auto p = ProblemFromJson(json::array());
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("problem: expected an object"), std::string::npos);
}

TEST(ProblemValidate, SizesAndHeads) {
  ExpectRejected({{"batch", 0}}, "problem.batch: 0 must be positive");
  ExpectRejected({{"heads_q", 0}}, "problem.heads_q: 0 must be positive");
  ExpectRejected({{"heads_kv", -2}}, "problem.heads_kv: -2 must be positive");
  ExpectRejected({{"head_dim", 0}}, "problem.head_dim: 0 must be positive");
  ExpectRejected({{"head_dim_v", 0}}, "problem.head_dim_v: 0 must be positive");
  ExpectRejected({{"seqlen_q", -1}}, "problem.seqlen_q: -1 must be >= 0");
  ExpectRejected({{"seqlen_k", -1}}, "problem.seqlen_k: -1 must be >= 0");
  ExpectRejected({{"seqlen_k", int64_t{1} << 40}}, "problem.seqlen_k: 1099511627776 exceeds");
  ExpectRejected({{"seqlen_k", 2147483648LL}}, "problem.seqlen_k: 2147483648 exceeds the int32");
  EXPECT_TRUE(ProblemFromJson(json{{"seqlen_k", 2147483647LL}, {"head_dim", 1}}).ok());
  ExpectRejected({{"heads_q", 6}, {"heads_kv", 4}},
                 "problem.heads_q: 6 is not a multiple of heads_kv = 4");
  ExpectRejected({{"heads_q", 5}, {"heads_kv", 4}},
                 "problem.heads_q: 5 is not a multiple of heads_kv = 4");
  ExpectRejected(
      {{"batch", 2147483647}, {"seqlen_q", 2147483647}, {"heads_q", 2147483646}, {"heads_kv", 1}},
      "more than 2^62 elements");
  // Zero-length sequences are legal.
  EXPECT_TRUE(ProblemFromJson(json{{"seqlen_q", 0}, {"seqlen_k", 0}}).ok());
}

TEST(ProblemValidate, DtypeMustBeAnInputFloat) {
  ExpectRejected({{"dtype", "bf15"}}, "problem.dtype: unknown dtype \"bf15\"");
  ExpectRejected({{"dtype", "i32"}}, "problem.dtype: \"i32\" is not an input float type");
  ExpectRejected({{"dtype", "e8m0fnu"}}, "problem.dtype: \"e8m0fnu\" is not an input float");
  for (const char* ok : {"f64", "f32", "bf16", "f16", "e4m3fn", "e5m2"}) {
    EXPECT_TRUE(ProblemFromJson(json{{"dtype", ok}}).ok()) << ok;
  }
}

TEST(ProblemValidate, ScoreTransforms) {
  ExpectRejected({{"scale", 0.0}}, "problem.scale: 0 must be finite and > 0");
  ExpectRejected({{"scale", -0.5}}, "problem.scale: -0.5 must be finite and > 0");

  ExpectRejected({{"softcap", -1.0}}, "problem.softcap: -1 must be finite and >= 0");
  ExpectRejected({{"alibi_slopes", {0.5, 0.25}}},
                 "problem.alibi_slopes: has 2 entries, expected heads_q = 4");
  ExpectRejected({{"alibi_slopes", {0.5, 0.25, 0.1, 0.1, 0.1}}},
                 "problem.alibi_slopes: has 5 entries, expected heads_q = 4");
  Problem p;
  p.softcap = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(Validate(p).ok());
  p = Problem{};
  p.alibi_slopes = std::vector<double>{std::nan("")};
  ASSERT_FALSE(Validate(p).ok());
  EXPECT_NE(Validate(p).error().message.find("problem.alibi_slopes[0]: nan is not finite"),
            std::string::npos);
  p = Problem{};
  p.scale = std::nan("");
  EXPECT_FALSE(Validate(p).ok());
  p.scale = std::numeric_limits<double>::infinity();
  ASSERT_FALSE(Validate(p).ok());
  EXPECT_EQ(Validate(p).error().message, "problem.scale: inf must be finite and > 0 (or null)");
}

TEST(ProblemValidate, CausalAlignAndWindow) {
  ExpectRejected({{"causal_align", "bottom-right"}},
                 "problem.causal_align: \"bottom-right\" is not \"bottom_right\" or \"top_left\"");
  ExpectRejected({{"window", {-2, 0}}}, "problem.window[0]: -2 is out of range [-1, 2147483647]");
  ExpectRejected({{"window", {0, -5}}}, "problem.window[1]: -5 is out of range");
  ExpectRejected({{"window", {0, int64_t{1} << 33}}}, "problem.window[1]: 8589934592 is out");
  EXPECT_TRUE(ProblemFromJson(json{{"window", {0, 0}}}).ok());
  EXPECT_TRUE(ProblemFromJson(json{{"window", {1000, 1000}}}).ok());
}

TEST(ProblemValidate, CuSeqlens) {
  json ok = {{"batch", 2},
             {"seqlen_q", 5},
             {"seqlen_k", 7},
             {"cu_seqlens_q", {0, 5, 8}},
             {"cu_seqlens_k", {0, 7, 7}}};
  const auto p = ProblemFromJson(ok);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_TRUE(p->varlen());
  EXPECT_EQ(p->TotalQ(), 8);
  EXPECT_EQ(p->TotalK(), 7);
  EXPECT_EQ(p->QShape(), (Shape{8, 1, 64}));
  EXPECT_EQ(p->VShape(), (Shape{7, 1, 64}));
  EXPECT_EQ(p->OShape(), (Shape{8, 1, 64}));
  EXPECT_EQ(p->LseShape(), (Shape{1, 8}));
  const Sequence s = SequenceOf(*p, 1);
  EXPECT_EQ(s.q_begin, 5);
  EXPECT_EQ(s.q_len, 3);
  EXPECT_EQ(s.k_begin, 7);
  EXPECT_EQ(s.k_len, 0);

  auto reject = [&](const json& patch, const std::string& needle) {
    json j = ok;
    j.merge_patch(patch);
    const auto r = ProblemFromJson(j);
    ASSERT_FALSE(r.ok()) << patch.dump();
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
  };
  reject({{"cu_seqlens_k", nullptr}}, "problem.cu_seqlens_q: set without cu_seqlens_k");
  reject({{"cu_seqlens_q", nullptr}}, "problem.cu_seqlens_k: set without cu_seqlens_q");
  reject({{"cu_seqlens_q", {0, 5}}}, "problem.cu_seqlens_q: has 2 entries, expected batch + 1 = 3");
  reject({{"cu_seqlens_q", {1, 5, 8}}}, "problem.cu_seqlens_q[0]: is 1, expected 0");
  reject({{"cu_seqlens_q", {0, 5, 4}}}, "problem.cu_seqlens_q[2]: 4 is less than the previous");
  reject({{"cu_seqlens_q", {0, 6, 8}}},
         "problem.cu_seqlens_q: sequence 0 has length 6 > seqlen_q = 5");
  reject({{"cu_seqlens_k", {0, 1, 9}}},
         "problem.cu_seqlens_k: sequence 1 has length 8 > seqlen_k = 7");
  reject({{"document_ids_q", {{0}, {0}}}, {"document_ids_k", {{0}, {0}}}},
         "cannot be combined with cu_seqlens");
}

TEST(ProblemValidate, DocumentIds) {
  json ok = {{"batch", 2},
             {"seqlen_q", 2},
             {"seqlen_k", 3},
             {"document_ids_q", {{0, 1}, {5, 5}}},
             {"document_ids_k", {{0, 1, 1}, {5, 5, 6}}}};
  ASSERT_TRUE(ProblemFromJson(ok).ok());
  auto reject = [&](const json& patch, const std::string& needle) {
    json j = ok;
    j.merge_patch(patch);
    const auto r = ProblemFromJson(j);
    ASSERT_FALSE(r.ok()) << patch.dump();
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
  };
  reject({{"document_ids_k", nullptr}}, "problem.document_ids_q: set without document_ids_k");
  reject({{"document_ids_q", {{0, 1}}}}, "problem.document_ids_q: has 1 rows, expected batch = 2");
  reject({{"document_ids_k", {{0, 1, 1}, {5, 5}}}},
         "problem.document_ids_k[1]: has 2 entries, expected seqlen_k = 3");
}

TEST(ProblemValidate, PrefixLm) {
  ExpectRejected({{"prefix_lm", -1}}, "problem.prefix_lm: -1 is out of range");
  ExpectRejected({{"prefix_lm", 3}, {"causal", false}}, "problem.prefix_lm: 3 requires causal");
  ExpectRejected({{"prefix_lm", 1}, {"causal", false}}, "problem.prefix_lm: 1 requires causal");
  EXPECT_TRUE(ProblemFromJson(json{{"prefix_lm", 3}, {"causal", true}}).ok());
  EXPECT_TRUE(ProblemFromJson(json{{"prefix_lm", 0}}).ok());
}

TEST(ProblemValidate, BlockSparse) {
  // seqlen_q 77 in blocks of 32: query blocks 0..2; seqlen_k 130 in blocks of 64: 0..2.
  json ok = DesignExample();
  ok["block_sparse"] = {{"block_q", 32}, {"block_k", 64}, {"blocks", {{2, 2}, {0, 0}}}};
  ASSERT_TRUE(ProblemFromJson(ok).ok());
  ExpectRejected({{"block_sparse", {{"block_q", 0}, {"blocks", json::array()}}}},
                 "problem.block_sparse.block_q: 0 must be in [1, 2147483647]");
  ExpectRejected({{"block_sparse", {{"block_k", -3}, {"blocks", json::array()}}}},
                 "problem.block_sparse.block_k: -3 must be in");
  ExpectRejected({{"block_sparse", {{"block_q", 32}, {"block_k", 64}, {"blocks", {{3, 0}}}}}},
                 "problem.block_sparse.blocks[0]: query block 3 is outside [0, 3) (seqlen_q = "
                 "77, block_q = 32)");
  ExpectRejected(
      {{"block_sparse", {{"block_q", 32}, {"block_k", 64}, {"blocks", {{0, 0}, {0, -1}}}}}},
      "problem.block_sparse.blocks[1]: key block -1 is outside [0, 3)");
  // Default blocks are 128 x 128: 130 keys make two key blocks, 0 and 1.
  ExpectRejected({{"block_sparse", {{"blocks", {{0, 2}}}}}}, "key block 2 is outside [0, 2)");
}

TEST(ProblemShapes, ValidateInputShapesNamesTheTensor) {
  const Problem p = ProblemFromJson(DesignExample()).value();
  const Tensor q = Tensor::Zeros(DType::kF64, p.QShape());
  const Tensor k = Tensor::Zeros(DType::kF64, p.KShape());
  const Tensor v = Tensor::Zeros(DType::kF64, p.VShape());
  const Tensor d = Tensor::Zeros(DType::kF64, p.OShape());
  EXPECT_TRUE(ValidateInputShapes(p, q, k, v).ok());
  EXPECT_TRUE(ValidateInputShapes(p, q, k, v, &d).ok());
  const Tensor bad_k = Tensor::Zeros(DType::kF64, {1, 77, 2, 64});
  const Status s = ValidateInputShapes(p, q, bad_k, v);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message,
            "k: shape [1, 77, 2, 64] does not match the problem's [1, 130, 2, 64]");
  // q's shape passed as do: head_dim 64 happens to equal head_dim_v, so use a mismatched one.
  const Tensor bad_do = Tensor::Zeros(DType::kF64, {1, 77, 4, 32});
  const Status sd = ValidateInputShapes(p, q, k, v, &bad_do);
  ASSERT_FALSE(sd.ok());
  EXPECT_EQ(sd.error().message,
            "do: shape [1, 77, 4, 32] does not match the problem's [1, 77, 4, 64]");
  EXPECT_FALSE(ValidateInputShapes(p, Tensor(), k, v).ok());
}

TEST(ProblemShapes, PaddedShapesAndSequences) {
  Problem p;
  p.batch = 3;
  p.heads_q = 6;
  p.heads_kv = 2;
  p.seqlen_q = 5;
  p.seqlen_k = 9;
  p.head_dim = 16;
  p.head_dim_v = 8;
  ASSERT_TRUE(Validate(p).ok());
  EXPECT_EQ(p.TotalQ(), 15);
  EXPECT_EQ(p.TotalK(), 27);
  EXPECT_EQ(p.QShape(), (Shape{3, 5, 6, 16}));
  EXPECT_EQ(p.KShape(), (Shape{3, 9, 2, 16}));
  EXPECT_EQ(p.VShape(), (Shape{3, 9, 2, 8}));
  EXPECT_EQ(p.OShape(), (Shape{3, 5, 6, 8}));
  EXPECT_EQ(p.LseShape(), (Shape{3, 6, 5}));
  EXPECT_EQ(p.gqa_ratio(), 3);
  EXPECT_EQ(p.KvHead(2), 0);
  EXPECT_EQ(p.KvHead(3), 1);
  EXPECT_EQ(p.KvHead(5), 1);
  const Sequence s = SequenceOf(p, 2);
  EXPECT_EQ(s.q_begin, 10);
  EXPECT_EQ(s.q_len, 5);
  EXPECT_EQ(s.k_begin, 18);
  EXPECT_EQ(s.k_len, 9);
  p.scale = 0.5;
  EXPECT_EQ(p.EffectiveScale(), 0.5);
  p.scale.reset();
  EXPECT_EQ(p.EffectiveScale(), 0.25);
}

}  // namespace
}  // namespace attest
