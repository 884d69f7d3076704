// Fuzz property of the exec reply parser (reply.h): valid describe and call replies with
// random mutations (reference/io/json_mutations_test_util.h) give a reply or an Error, never a
// crash, a hang or a leak (the asan preset runs this too); messages quote excerpts, never
// the whole line; what is accepted is well-formed (capabilities that survive their JSON
// round trip, a status of the three, free text capped). Bounded by RC_PARAMS (max_success,
// set by ctest); reproduce a failure with the RC_PARAMS="reproduce=..." line printed.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <string>
#include <vector>

#include "kernels/exec/reply.h"
#include "reference/io/json_mutations_test_util.h"

namespace attest {
namespace {

using Json = nlohmann::json;

Capabilities GenCapabilities() {
  Capabilities caps;
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kE4M3FN}) {
    if (*rc::gen::arbitrary<bool>()) caps.dtypes.push_back(d);
  }
  if (*rc::gen::arbitrary<bool>()) caps.head_dims = {64, 128};
  caps.causal = *rc::gen::arbitrary<bool>();
  caps.window = *rc::gen::arbitrary<bool>();
  caps.varlen = *rc::gen::arbitrary<bool>();
  caps.gqa = *rc::gen::arbitrary<bool>();
  caps.backward = *rc::gen::arbitrary<bool>();
  caps.deterministic = *rc::gen::arbitrary<bool>();
  caps.profile = *rc::gen::elementOf(std::vector<std::string>{"", "bf16", "f32"});
  if (*rc::gen::arbitrary<bool>()) caps.empty_row_lse = "+inf";
  if (*rc::gen::arbitrary<bool>()) caps.softcap_tanh_abs_error = 7.984215021017427e-06;
  return caps;
}

std::string GenReplyLine(bool* describe) {
  *describe = *rc::gen::arbitrary<bool>();
  Json j;
  if (*describe) {
    j = {{"status", "ok"},
         {"name", "fuzz"},
         {"capabilities", CapabilitiesToJson(GenCapabilities())}};
  } else {
    switch (*rc::gen::inRange(0, 5)) {
      case 0:
        j = {{"status", "ok"}};
        break;
      case 1:
        j = {{"status", "ok"}, {"route", "slow path"}};
        break;
      case 2:
        j = {{"status", "unsupported"}, {"reason", "no varlen"}};
        break;
      case 3:
        j = {{"status", "error"}, {"message", "CUDA error: an illegal memory access"}};
        break;
      default:
        j = {{"status", "error"}, {"message", "CUDA error: an illegal memory access"},
             {"exiting", *rc::gen::arbitrary<bool>()}};
    }
  }
  return j.dump();
}

RC_GTEST_PROP(ReplyFuzz, ValidRepliesAreReadAsSent, ()) {
  bool describe = false;
  const std::string line = GenReplyLine(&describe);
  if (describe) {
    auto r = ParseDescribeReply(line);
    RC_ASSERT(r.ok());
    RC_ASSERT(r->name == "fuzz");
    RC_ASSERT(CapabilitiesToJson(r->capabilities) == r->capabilities_json);
  } else {
    RC_ASSERT(ParseCallReply(line).ok());
  }
}

RC_GTEST_PROP(ReplyFuzz, AMutatedReplyGivesAReplyOrAnErrorNeverACrash, ()) {
  bool describe = false;
  std::string line = GenReplyLine(&describe);
  const auto mutations = *rc::gen::inRange(1, 5);
  for (int i = 0; i < mutations; ++i) testing::MutateJsonText(line);
  if (describe) {
    auto r = ParseDescribeReply(line);
    if (!r.ok()) {
      RC_ASSERT(!r.error().message.empty());
      RC_ASSERT(r.error().message.size() < 2000);
      RC_TAG("describe rejected");
      return;
    }
    RC_TAG("describe accepted");
    RC_ASSERT(r->name.size() <= 2003);
    // The capabilities as read are what they say: their own JSON reads back the same.
    auto again = CapabilitiesFromJson(CapabilitiesToJson(r->capabilities));
    RC_ASSERT(again.ok());
    RC_ASSERT(CapabilitiesToJson(*again) == CapabilitiesToJson(r->capabilities));
    return;
  }
  auto r = ParseCallReply(line);
  if (!r.ok()) {
    RC_ASSERT(!r.error().message.empty());
    RC_ASSERT(r.error().message.size() < 2000);
    RC_TAG("call rejected");
    return;
  }
  RC_TAG("call accepted");
  RC_ASSERT(r->text.size() <= 2003);
  RC_ASSERT(r->route.size() <= 2003);
  const bool has_text = r->status != CallReply::Status::kOk;
  RC_ASSERT(has_text || r->text.empty());
}

TEST(CallReply, ExitingIsReadFromAnErrorReplyAndMustBeABoolean) {
  auto yes = ParseCallReply(R"({"status": "error", "message": "m", "exiting": true})");
  ASSERT_TRUE(yes.ok()) << yes.error().message;
  EXPECT_TRUE(yes->exiting);
  auto absent = ParseCallReply(R"({"status": "error", "message": "m"})");
  ASSERT_TRUE(absent.ok());
  EXPECT_FALSE(absent->exiting);
  auto bad = ParseCallReply(R"({"status": "error", "message": "m", "exiting": "yes"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("\"exiting\" is not true or false"), std::string::npos)
      << bad.error().message;
}

}  // namespace
}  // namespace attest
