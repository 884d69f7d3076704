// Shape limits: the violation test, the JSON form and its errors, and FitShape's moves (the
// rules numbered in shape_limits.h), checked on the shapes the suites and generators use.
#include "kernels/shape_limits.h"

#include <algorithm>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/kernel.h"

namespace attest {
namespace {

Problem Padded(int64_t b, int64_t sq, int64_t sk) {
  Problem p;
  p.batch = b;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  return p;
}

Problem Packed(const std::vector<int32_t>& q, const std::vector<int32_t>& k) {
  Problem p;
  std::vector<int32_t> cq{0}, ck{0};
  for (int32_t l : q) cq.push_back(cq.back() + l);
  for (int32_t l : k) ck.push_back(ck.back() + l);
  p.batch = static_cast<int64_t>(q.size());
  p.cu_seqlens_q = cq;
  p.cu_seqlens_k = ck;
  p.seqlen_q = *std::max_element(q.begin(), q.end());
  p.seqlen_k = *std::max_element(k.begin(), k.end());
  return p;
}

// The Triton tutorial's limits: Sq = Sk, multiples of 64.
ShapeLimits Tile64() {
  ShapeLimits s;
  s.seqlen_q_multiple = s.seqlen_k_multiple = 64;
  s.equal_seqlens = true;
  return s;
}

TEST(ShapeLimits, DefaultLimitsSayNothing) {
  EXPECT_FALSE(ShapeLimits{}.any());
  EXPECT_EQ(ShapeViolation(ShapeLimits{}, Padded(7, 77, 130)), "");
  Problem p = Padded(7, 77, 130);
  EXPECT_EQ(FitShape(p, ShapeLimits{}), "");
  EXPECT_EQ(p, Padded(7, 77, 130));
  EXPECT_EQ(ShapeLimitsToJson(ShapeLimits{}), nlohmann::json::object());
}

TEST(ShapeLimits, ViolationsNameTheLengthAndTheLimit) {
  const ShapeLimits s = Tile64();
  EXPECT_EQ(ShapeViolation(s, Padded(1, 128, 128)), "");
  EXPECT_EQ(ShapeViolation(s, Padded(1, 77, 128)), "seqlen_q 77 is not a multiple of 64");
  EXPECT_EQ(ShapeViolation(s, Padded(1, 64, 128)),
            "seqlen_q 64 != seqlen_k 128 (the kernel requires equal lengths)");
  EXPECT_EQ(ShapeViolation(s, Packed({64, 60}, {64, 64})),
            "sequence 1: q_len 60 is not a multiple of 64");
  ShapeLimits m;
  m.max_batch = 2;
  m.max_seqlen_k = 256;
  m.min_seqlen_q = 1;
  EXPECT_EQ(ShapeViolation(m, Padded(3, 8, 8)), "batch 3 exceeds max_batch 2");
  EXPECT_EQ(ShapeViolation(m, Padded(1, 8, 300)), "seqlen_k 300 exceeds the maximum 256");
  EXPECT_EQ(ShapeViolation(m, Packed({0, 4}, {4, 4})),
            "sequence 0: q_len 0 is below the minimum 1");
}

TEST(ShapeLimits, CapabilitiesCoverOnlyLegalShapes) {
  Capabilities caps;
  caps.shapes = Tile64();
  std::string why;
  EXPECT_TRUE(caps.Covers(Padded(2, 192, 192), &why)) << why;
  EXPECT_FALSE(caps.Covers(Padded(2, 191, 191), &why));
  EXPECT_EQ(why, "shape: seqlen_q 191 is not a multiple of 64");
}

TEST(ShapeLimits, JsonRoundTripsThroughTheCapabilities) {
  ShapeLimits s = Tile64();
  s.max_seqlen_q = s.max_seqlen_k = 4096;
  s.min_seqlen_q = 64;
  s.max_batch = 8;
  Capabilities caps;
  caps.shapes = s;
  const nlohmann::json j = CapabilitiesToJson(caps);
  EXPECT_EQ(j["shapes"], nlohmann::json::parse(R"({"seqlen_q_multiple": 64,
      "seqlen_k_multiple": 64, "equal_seqlens": true, "min_seqlen_q": 64, "max_seqlen_q": 4096,
      "max_seqlen_k": 4096, "max_batch": 8})"));
  auto back = CapabilitiesFromJson(j);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->shapes, s);
  EXPECT_FALSE(CapabilitiesToJson(Capabilities{}).contains("shapes"));
}

TEST(ShapeLimits, BadDeclarationsNameTheField) {
  auto error = [](const char* text) {
    auto r = CapabilitiesFromJson(nlohmann::json::parse(text));
    return r.ok() ? std::string("(accepted)") : r.error().message;
  };
  EXPECT_EQ(error(R"({"shapes": [64]})"), "capabilities.shapes: not a JSON object");
  EXPECT_EQ(error(R"({"shapes": {"seqlen_q_multiple": 0}})"),
            "capabilities.shapes.seqlen_q_multiple: must be an integer in [1, 2^31]");
  EXPECT_EQ(error(R"({"shapes": {"max_batch": 1.5}})"),
            "capabilities.shapes.max_batch: must be an integer in [0, 2^31]");
  EXPECT_EQ(error(R"({"shapes": {"equal_seqlens": 1}})"),
            "capabilities.shapes.equal_seqlens: not a boolean");
  EXPECT_NE(error(R"({"shapes": {"seqlen_multiple": 64}})")
                .find("capabilities.shapes.seqlen_multiple: unknown limit (known: "),
            std::string::npos);
  EXPECT_EQ(error(R"({"shapes": {"seqlen_k_multiple": 128, "max_seqlen_k": 100}})"),
            "capabilities.shapes.max_seqlen_k: 100 leaves no positive length that is a multiple "
            "of 128 and at least 0");
  EXPECT_EQ(error(R"({"shapes": {"equal_seqlens": true, "seqlen_q_multiple": 64,
                                 "seqlen_k_multiple": 96, "max_seqlen_q": 128}})"),
            "capabilities.shapes.equal_seqlens: no positive length meets both sides' limits");
}

// 1. Rounding up keeps the number of the kernel's tiles a length touches: the gate's tile
// boundaries 63, 64, 65, 127, 128, 129 become one, two or three whole 64-tiles.
TEST(FitShape, TileBoundariesBecomeBoundariesOfTheKernelsBlock) {
  ShapeLimits s;
  s.seqlen_q_multiple = s.seqlen_k_multiple = 64;
  for (auto [n, want] : {std::pair<int64_t, int64_t>{1, 64}, {63, 64}, {64, 64}, {65, 128},
                         {127, 128}, {128, 128}, {129, 192}, {0, 0}}) {
    Problem p = Padded(1, n, n);
    EXPECT_EQ(FitShape(p, s), "") << n;
    EXPECT_EQ(p.seqlen_q, want) << n;
    EXPECT_EQ(p.seqlen_k, want) << n;
  }
}

// 3. With equal lengths both sides take the longer one, unless the row is for their order.
TEST(FitShape, EqualLengthsKeepARowForTheOrderOnlyWhereItCanBeKept) {
  Problem p = Padded(1, 64, 129);
  EXPECT_EQ(FitShape(p, Tile64(), ShapeIntent{.order = false}), "");
  EXPECT_EQ(p.seqlen_q, 192);
  EXPECT_EQ(p.seqlen_k, 192);
  Problem q = Padded(1, 130, 77);
  EXPECT_EQ(FitShape(q, Tile64()),
            "the row is for q_len > k_len (130 vs 77) and the kernel requires equal lengths");
}

// 4. A row for Sq < Sk stays one when the multiples would make the sides equal.
TEST(FitShape, TheOrderIsKeptByGrowingTheLongerSide) {
  ShapeLimits s;
  s.seqlen_q_multiple = s.seqlen_k_multiple = 128;
  Problem p = Padded(1, 127, 128);
  EXPECT_EQ(FitShape(p, s), "");
  EXPECT_EQ(p.seqlen_q, 128);
  EXPECT_EQ(p.seqlen_k, 256);
  s.max_seqlen_k = 128;
  Problem q = Padded(1, 127, 128);
  EXPECT_EQ(FitShape(q, s), "the row loses its q_len < k_len order inside the kernel's limits");
  Problem r = Padded(1, 127, 128);
  EXPECT_EQ(FitShape(r, s, kAnyShape), "");
  EXPECT_EQ(r.seqlen_k, 128);
}

// 2. Maxima lower a length to the largest legal one; minima raise it.
TEST(FitShape, MaximaAndMinima) {
  ShapeLimits s;
  s.seqlen_k_multiple = 16;
  s.max_seqlen_k = 100;
  s.min_seqlen_q = 8;
  Problem p = Padded(1, 3, 300);
  EXPECT_EQ(FitShape(p, s), "");
  EXPECT_EQ(p.seqlen_q, 8);
  EXPECT_EQ(p.seqlen_k, 96);
}

TEST(FitShape, BatchesAndPackedSequences) {
  ShapeLimits s;
  s.max_batch = 1;
  Problem p = Padded(2, 64, 64);
  EXPECT_EQ(FitShape(p, s), "the row is for batch 2 > 1 and the kernel's max_batch is 1");
  Problem q = Padded(2, 64, 64);
  EXPECT_EQ(FitShape(q, s, kAnyShape), "");
  EXPECT_EQ(q.batch, 1);

  ShapeLimits t;
  t.seqlen_q_multiple = t.seqlen_k_multiple = 32;
  Problem v = Packed({37, 0, 63}, {50, 30, 0});
  EXPECT_EQ(FitShape(v, t), "");
  EXPECT_EQ(*v.cu_seqlens_q, (std::vector<int32_t>{0, 64, 64, 128}));
  EXPECT_EQ(*v.cu_seqlens_k, (std::vector<int32_t>{0, 96, 128, 128}));  // 4. q < k kept
  EXPECT_EQ(v.seqlen_q, 64);
  EXPECT_EQ(ShapeViolation(t, v), "");
  t.min_seqlen_k = 1;
  Problem w = Packed({37, 0, 63}, {50, 30, 0});
  EXPECT_EQ(FitShape(w, t),
            "the row's sequence 2 has k_len 0 and the kernel's min_seqlen_k is 1");
}

TEST(FitShape, DocumentIdsFollowThePaddedLengths) {
  Problem p = Padded(1, 3, 2);
  p.document_ids_q = std::vector<std::vector<int32_t>>{{0, 0, 1}};
  p.document_ids_k = std::vector<std::vector<int32_t>>{{0, 1}};
  ShapeLimits s;
  s.seqlen_q_multiple = s.seqlen_k_multiple = 4;
  s.equal_seqlens = true;
  EXPECT_EQ(FitShape(p, s, kAnyShape), "");
  EXPECT_EQ(*p.document_ids_q, (std::vector<std::vector<int32_t>>{{0, 0, 1, 1}}));
  EXPECT_EQ(*p.document_ids_k, (std::vector<std::vector<int32_t>>{{0, 1, 1, 1}}));
  EXPECT_TRUE(Validate(p).ok());
}

}  // namespace
}  // namespace attest
