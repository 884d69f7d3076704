// Strict JSON parsing (json.h): duplicate keys and deep nesting refused by kind and with the
// key named, RFC 8259 syntax only, linear time on wide objects, bounded excerpts.
#include "reference/io/json.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace attest {
namespace {

// AddressSanitizer (GCC's __SANITIZE_ADDRESS__, the asan preset) slows parsing several-fold;
// the time limits are for the Release build.
#ifdef __SANITIZE_ADDRESS__
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

using Json = nlohmann::json;
using Kind = JsonDefect::Kind;

JsonDefect DefectOf(std::string_view text, int max_depth = kJsonDefaultMaxDepth) {
  auto r = ParseJsonText(text, max_depth);
  EXPECT_TRUE(std::holds_alternative<JsonDefect>(r)) << text;
  return std::holds_alternative<JsonDefect>(r) ? std::get<JsonDefect>(r) : JsonDefect{};
}

TEST(StrictJson, AcceptsWhatTheDomParserAccepts) {
  const std::string text =
      R"({"a": [1, -2, 3.5, 1e300, true, false, null, "x\u00e9"], "b": {"c": {}}, "d": []})";
  auto r = ParseJsonText(text);
  ASSERT_TRUE(std::holds_alternative<Json>(r));
  EXPECT_EQ(std::get<Json>(r), Json::parse(text));
  EXPECT_TRUE(std::get<Json>(r)["a"][0].is_number_unsigned());
  EXPECT_TRUE(std::get<Json>(r)["a"][1].is_number_integer());
  auto scalar = ParseJsonText("  42 ");
  ASSERT_TRUE(std::holds_alternative<Json>(scalar));
  EXPECT_EQ(std::get<Json>(scalar), 42);
}

TEST(StrictJson, RefusesDuplicateKeysNamingThem) {
  JsonDefect top = DefectOf(R"({"seqlen_q": 4, "seqlen_q": 8})");
  EXPECT_EQ(top.kind, Kind::kDuplicateKey);
  EXPECT_TRUE(top.top_level);
  EXPECT_EQ(top.Describe(), R"(duplicate key "seqlen_q" at the top level)");
  JsonDefect inner = DefectOf(R"({"problem": {"causal": true, "x": 1, "causal": false}})");
  EXPECT_EQ(inner.Describe(), R"(duplicate key "causal" inside "problem")");
  // In an object inside an array, the parent is the array's key.
  JsonDefect in_list = DefectOf(R"({"cases": [{"a": 1, "a": 2}]})");
  EXPECT_EQ(in_list.Describe(), R"(duplicate key "a" inside "cases")");
  // Equal keys in different objects are fine.
  EXPECT_TRUE(std::holds_alternative<Json>(ParseJsonText(R"({"a": {"k": 1}, "b": {"k": 2}})")));
}

TEST(StrictJson, RefusesNestingBeyondTheLimitWithoutRecursing) {
  // 200 000 levels: the DOM parser's own stack would not matter, a dump into a message would.
  const std::string deep =
      R"({"problem": )" + std::string(200000, '[') + std::string(200000, ']') + "}";
  JsonDefect d = DefectOf(deep);
  EXPECT_EQ(d.kind, Kind::kTooDeep);
  EXPECT_EQ(d.Describe(), R"(containers nested deeper than 32 levels (under key "problem"))");
  EXPECT_TRUE(std::holds_alternative<Json>(ParseJsonText("[[[]]]", 3)));
  EXPECT_EQ(DefectOf("[[[[]]]]", 3).kind, Kind::kTooDeep);
  EXPECT_EQ(DefectOf("[[[[]]]]", 3).Describe(), "containers nested deeper than 3 levels");
}

TEST(StrictJson, RefusesWhatIsNotJson) {
  EXPECT_EQ(DefectOf("").kind, Kind::kSyntax);
  EXPECT_EQ(DefectOf("{\"a\": 1} x").kind, Kind::kSyntax);
  EXPECT_EQ(DefectOf("{\"a\": 1 /* c */}").kind, Kind::kSyntax);
  EXPECT_EQ(DefectOf("{\"a\": 01}").kind, Kind::kSyntax);
  EXPECT_EQ(DefectOf("\"\xC3\x28\"").kind, Kind::kSyntax);  // ill-formed UTF-8 in a string
  EXPECT_EQ(DefectOf("\xEF\xBB\xBF{}").kind, Kind::kByteOrderMark);
  const JsonDefect range = DefectOf("[1e400]");
  EXPECT_EQ(range.kind, Kind::kNumberRange);
  const JsonDefect cut = DefectOf("{\"a\": [1, 2");
  EXPECT_EQ(cut.kind, Kind::kSyntax);
  EXPECT_NE(cut.Describe().find("invalid JSON at byte"), std::string::npos) << cut.Describe();
  auto e = ParseJson("{", "x.case.json");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().message.rfind("x.case.json: invalid JSON at byte", 0), 0u);
}

TEST(StrictJson, WideObjectsParseInLinearTime) {
  // 200 000 members each holding an object: the shape of a large safetensors header, where
  // nlohmann's callback parser rescans the parent after every member (quadratic).
  std::string text = "{";
  for (int i = 0; i < 200000; ++i) {
    text += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(":{"shape":[1,2],"dtype":"F32"})";
  }
  text += "}";
  const auto t0 = std::chrono::steady_clock::now();
  auto r = ParseJsonText(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(std::holds_alternative<Json>(r));
  EXPECT_EQ(std::get<Json>(r).size(), 200000u);
  std::printf("200000-member object (%zu bytes) parsed in %.3f s\n", text.size(), s);
  EXPECT_LT(s, kSanitized ? 30.0 : 5.0);
}

TEST(StrictJson, ExcerptsAreBoundedWhateverTheValue) {
  Json big = Json::array();
  for (int i = 0; i < 100000; ++i) big.push_back(i);
  const std::string e = JsonExcerpt(big, 50);
  EXPECT_LE(e.size(), 53u);
  EXPECT_EQ(e.substr(e.size() - 3), "...");
  EXPECT_EQ(e.substr(0, 7), "[0,1,2,");
  // Deep values built in code are elided below a fixed depth, not recursed into.
  Json deep = Json::array();
  for (int i = 0; i < 1000; ++i) deep = Json::array({deep});
  EXPECT_NE(JsonExcerpt(deep, 1000).find("[...]"), std::string::npos);
  EXPECT_EQ(JsonExcerpt(Json::parse(R"({"a":[1,2],"b":"x"})")), R"({"a":[1,2],"b":"x"})");
  EXPECT_EQ(QuotedExcerpt("abcdef", 3), "\"abc...\"");
  // Cut on a UTF-8 boundary: "é" is two bytes.
  EXPECT_EQ(QuotedExcerpt("a\xC3\xA9z", 2), "\"a...\"");
}

}  // namespace
}  // namespace attest
