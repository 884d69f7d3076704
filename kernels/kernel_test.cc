// Capabilities JSON (the exec protocol's `capabilities` object) and the kernel registry.
#include "kernels/kernel.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace attest {
namespace {

TEST(Capabilities, JsonRoundTripAndMissingFlagsAreFalse) {
  auto j = nlohmann::json::parse(R"({"dtypes":["bf16","f16"],"head_dims":[64,128],
      "head_dims_v":[],"causal":true,"window":true,"softcap":true,"alibi":true,
      "varlen":true,"gqa":true,"backward":true,"deterministic":true,"profile":"bf16"})");
  auto caps = CapabilitiesFromJson(j);
  ASSERT_TRUE(caps.ok()) << caps.error().message;
  EXPECT_EQ(caps->dtypes, (std::vector<DType>{DType::kBF16, DType::kF16}));
  EXPECT_EQ(caps->head_dims, (std::vector<int64_t>{64, 128}));
  EXPECT_TRUE(caps->causal && caps->backward && caps->deterministic);
  EXPECT_FALSE(caps->documents);
  auto again = CapabilitiesFromJson(CapabilitiesToJson(*caps));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(CapabilitiesToJson(*again), CapabilitiesToJson(*caps));
}

TEST(Capabilities, LseFlagRoundTripsAndAMissingKeyMeansTrue) {
  // Absent: true (every kernel returned lse before the flag existed).
  auto absent = CapabilitiesFromJson(nlohmann::json::parse(R"({"dtypes":["bf16"]})"));
  ASSERT_TRUE(absent.ok()) << absent.error().message;
  EXPECT_TRUE(absent->lse);
  EXPECT_EQ(CapabilitiesToJson(*absent)["lse"], true);
  auto no_lse = CapabilitiesFromJson(nlohmann::json::parse(R"({"dtypes":["bf16"],"lse":false})"));
  ASSERT_TRUE(no_lse.ok()) << no_lse.error().message;
  EXPECT_FALSE(no_lse->lse);
  const nlohmann::json j = CapabilitiesToJson(*no_lse);
  EXPECT_EQ(j["lse"], false);
  auto again = CapabilitiesFromJson(j);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->lse);
  EXPECT_EQ(CapabilitiesToJson(*again), j);
  auto bad = CapabilitiesFromJson(nlohmann::json::parse(R"({"lse":"no"})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("capabilities.lse"), std::string::npos);
}

TEST(Capabilities, DeviceRoundTripsHostIsNotWrittenAndOthersAreErrors) {
  auto host = CapabilitiesFromJson(nlohmann::json::parse(R"({"dtypes":["bf16"]})"));
  ASSERT_TRUE(host.ok()) << host.error().message;
  EXPECT_EQ(host->device, "host");
  EXPECT_FALSE(CapabilitiesToJson(*host).contains("device"));
  auto cuda = CapabilitiesFromJson(nlohmann::json::parse(R"({"device":"cuda"})"));
  ASSERT_TRUE(cuda.ok()) << cuda.error().message;
  EXPECT_EQ(cuda->device, "cuda");
  EXPECT_EQ(CapabilitiesToJson(*cuda)["device"], "cuda");
  auto again = CapabilitiesFromJson(CapabilitiesToJson(*cuda));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->device, "cuda");
  for (const char* text : {R"({"device":"gpu"})", R"({"device":1})"}) {
    auto bad = CapabilitiesFromJson(nlohmann::json::parse(text));
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.error().message.find("capabilities.device"), std::string::npos) << text;
  }
}

TEST(Capabilities, BadFieldsAreNamed) {
  auto bad = CapabilitiesFromJson(nlohmann::json::parse(R"({"dtypes":["bf17"]})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("capabilities.dtypes"), std::string::npos);
  auto flag = CapabilitiesFromJson(nlohmann::json::parse(R"({"causal":1})"));
  ASSERT_FALSE(flag.ok());
  EXPECT_NE(flag.error().message.find("capabilities.causal"), std::string::npos);
}

TEST(Capabilities, RestrictionsRoundTripAndLimitCoverage) {
  auto caps = CapabilitiesFromJson(
      nlohmann::json::parse(R"({"causal":true,"window":true,"varlen":true,)"
                            R"("same_head_dim_v":true,"causal_bottom_right_only":true})"));
  ASSERT_TRUE(caps.ok()) << caps.error().message;
  EXPECT_TRUE(caps->same_head_dim_v && caps->causal_bottom_right_only);
  EXPECT_EQ(CapabilitiesToJson(*caps)["causal_bottom_right_only"], true);
  // Absent restrictions are not written, so existing descriptions are unchanged.
  EXPECT_FALSE(CapabilitiesToJson(Capabilities{}).contains("same_head_dim_v"));
  auto bad = CapabilitiesFromJson(nlohmann::json::parse(R"({"same_head_dim_v":"yes"})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("capabilities.same_head_dim_v"), std::string::npos);

  Problem p;
  p.seqlen_q = 5, p.seqlen_k = 7, p.causal = true;
  std::string why;
  EXPECT_TRUE(caps->Covers(p, &why)) << why;  // bottom-right
  p.causal_align = CausalAlign::kTopLeft;
  EXPECT_FALSE(caps->Covers(p, &why));
  EXPECT_NE(why.find("top-left"), std::string::npos);
  p.seqlen_k = 5;  // square: both alignments agree
  EXPECT_TRUE(caps->Covers(p, &why)) << why;
  p.batch = 2, p.cu_seqlens_q = {0, 3, 5}, p.cu_seqlens_k = {0, 3, 6};
  EXPECT_FALSE(caps->Covers(p, &why));  // the second sequence is 2 x 3
  p.cu_seqlens_k = {0, 3, 5};
  EXPECT_TRUE(caps->Covers(p, &why)) << why;
  p.causal = false;  // no diagonal rule: the alignment does not matter
  p.cu_seqlens_k = {0, 1, 5};
  EXPECT_TRUE(caps->Covers(p, &why)) << why;
  p.head_dim_v = p.head_dim / 2;
  EXPECT_FALSE(caps->Covers(p, &why));
  EXPECT_NE(why.find("head_dim_v"), std::string::npos);
}

// The mirror restriction: SDPA's documented is_causal (top-left) on nested jagged tensors.
TEST(Capabilities, TopLeftOnlyCoversTopLeftAndSquare) {
  auto caps = CapabilitiesFromJson(nlohmann::json::parse(
      R"({"causal":true,"varlen":true,"causal_top_left_only":true})"));
  ASSERT_TRUE(caps.ok()) << caps.error().message;
  EXPECT_TRUE(caps->causal_top_left_only);
  EXPECT_EQ(CapabilitiesToJson(*caps)["causal_top_left_only"], true);
  EXPECT_FALSE(CapabilitiesToJson(Capabilities{}).contains("causal_top_left_only"));
  Problem p;
  p.seqlen_q = 5, p.seqlen_k = 7, p.causal = true;
  std::string why;
  EXPECT_FALSE(caps->Covers(p, &why));  // bottom-right, the problem's default
  EXPECT_NE(why.find("bottom-right"), std::string::npos) << why;
  p.causal_align = CausalAlign::kTopLeft;
  EXPECT_TRUE(caps->Covers(p, &why)) << why;
  p.causal_align = CausalAlign::kBottomRight;
  p.seqlen_k = 5;  // square: both alignments are one mask
  EXPECT_TRUE(caps->Covers(p, &why)) << why;
}

TEST(Capabilities, CoversNamesTheMissingFeature) {
  Capabilities caps;
  caps.dtypes = {DType::kBF16};
  caps.head_dims = {64, 128};
  Problem p;
  p.head_dim = 64;
  std::string why;
  EXPECT_TRUE(caps.Covers(p, &why));
  p.causal = true;
  EXPECT_FALSE(caps.Covers(p, &why));
  EXPECT_EQ(why, "causal");
  caps.causal = true;
  p.head_dim = 96;
  EXPECT_FALSE(caps.Covers(p, &why));
  EXPECT_EQ(why, "head_dim 96");
}

TEST(KernelRegistry, UnknownKernelIsAnError) {
  KernelRegistry registry;
  auto k = registry.Create("cpu/nope");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.error().message.find("unknown kernel 'cpu/nope'"), std::string::npos);
}

}  // namespace
}  // namespace attest

namespace attest {
namespace {

// A split count is a claim of the API (Capabilities::num_splits): a problem naming one is
// covered only where listed (0: the kernel's choice, always covered); the JSON form is checked.
TEST(Capabilities, SplitCountsAreClaimedOneByOne) {
  Problem p;
  Capabilities caps;
  std::string why;
  EXPECT_TRUE(caps.Covers(p, &why)) << why;
  p.num_splits = 3;
  EXPECT_FALSE(caps.Covers(p, &why));
  EXPECT_EQ(why, "num_splits 3 (the kernel chooses its own split)");
  caps.num_splits = {1, 2, 8};
  EXPECT_FALSE(caps.Covers(p, &why));
  EXPECT_EQ(why, "num_splits 3");
  caps.num_splits.push_back(3);
  EXPECT_TRUE(caps.Covers(p, &why)) << why;
  auto back = CapabilitiesFromJson(CapabilitiesToJson(caps));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->num_splits, caps.num_splits);
  EXPECT_FALSE(CapabilitiesToJson(Capabilities{}).contains("num_splits"));
  for (const char* bad : {R"({"num_splits": 2})", R"({"num_splits": [0]})",
                          R"({"num_splits": [2, 2]})", R"({"num_splits": [1025]})",
                          R"({"num_splits": [1.5]})"}) {
    auto r = CapabilitiesFromJson(nlohmann::json::parse(bad));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find("capabilities.num_splits"), std::string::npos);
  }
}

// A mask form is a claim of the API (Capabilities::mask_forms): a problem naming one is covered
// only where listed, and the JSON forms are checked.
TEST(Capabilities, MaskFormsAreClaimedOneByOne) {
  Problem p;
  p.mask_form = "additive_f32";
  Capabilities caps;
  std::string why;
  EXPECT_FALSE(caps.Covers(p, &why));
  EXPECT_EQ(why, "mask form additive_f32 (the API takes no mask tensor)");
  caps.mask_forms = {"bool", "additive"};
  EXPECT_FALSE(caps.Covers(p, &why));
  caps.mask_forms.push_back("additive_f32");
  EXPECT_TRUE(caps.Covers(p, &why)) << why;
  auto back = CapabilitiesFromJson(CapabilitiesToJson(caps));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->mask_forms, caps.mask_forms);
  EXPECT_FALSE(CapabilitiesFromJson(nlohmann::json::parse(R"({"mask_forms": ["float"]})")).ok());
  p.mask_form = "float";
  EXPECT_FALSE(Validate(p).ok());
  p.mask_form = "";
  EXPECT_TRUE(Validate(p).ok());
  EXPECT_FALSE(ProblemToJson(p).contains("mask_form"));
}

}  // namespace
}  // namespace attest
