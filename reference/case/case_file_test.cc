// Case files (case_file.h) against docs/design.md "Case files": exactly one data source, errors
// naming file and field, canonical bytes, relative input paths that survive a move.
#include "reference/case/case_file.h"

#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>
#include <sys/stat.h>

namespace attest {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json DesignCase() {
  return json::parse(R"({
  "problem": {
    "batch": 1, "heads_q": 4, "heads_kv": 2, "seqlen_q": 77, "seqlen_k": 130,
    "head_dim": 64, "head_dim_v": 64, "dtype": "bf16", "scale": null,
    "causal": true, "causal_align": "bottom_right", "window": [-1, -1],
    "softcap": 0.0, "alibi_slopes": null, "cu_seqlens_q": null, "cu_seqlens_k": null
  },
  "generator": {"name": "gaussian", "seed": 12345, "params": {}}
})");
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A fresh directory per test under the system temp directory.
class CaseFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / (std::string("attest_case_file_test_") + info->name() + "_" +
                                        std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

std::string ErrorOf(const json& j) {
  const auto c = CaseFromJson(j);
  return c.ok() ? "(accepted)" : c.error().message;
}

TEST(CaseJson, ParsesTheDesignExample) {
  const auto c = CaseFromJson(DesignCase());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->problem.seqlen_k, 130);
  ASSERT_TRUE(c->generator.has_value());
  EXPECT_FALSE(c->inputs.has_value());
  EXPECT_EQ(c->generator->name, "gaussian");
  EXPECT_EQ(c->generator->seed, 12345u);
  EXPECT_EQ(c->generator->params, json::object());
  EXPECT_EQ(CaseToJson(*c), DesignCase());
}

TEST(CaseJson, ExactlyOneDataSource) {
  json both = DesignCase();
  both["inputs"] = "x.safetensors";
  EXPECT_EQ(ErrorOf(both), "case: has both \"inputs\" and \"generator\" (give exactly one)");
  json neither = DesignCase();
  neither.erase("generator");
  EXPECT_EQ(ErrorOf(neither), "case: has neither \"inputs\" nor \"generator\" (give exactly one)");
  json empty_path = neither;
  empty_path["inputs"] = "";
  EXPECT_EQ(ErrorOf(empty_path), "inputs: expected a non-empty path string, got \"\"");
}

TEST(CaseJson, ErrorsNameTheField) {
  json j = DesignCase();
  j["generatr"] = 1;
  EXPECT_EQ(ErrorOf(j), "case: unknown field \"generatr\"");
  j = DesignCase();
  j["problem"]["heads_q"] = 6;
  j["problem"]["heads_kv"] = 4;
  EXPECT_EQ(ErrorOf(j), "problem.heads_q: 6 is not a multiple of heads_kv = 4");
  j = DesignCase();
  j.erase("problem");
  EXPECT_EQ(ErrorOf(j), "problem: missing");
  j = DesignCase();
  j["generator"].erase("seed");
  EXPECT_EQ(ErrorOf(j), "generator.seed: missing");
  j["generator"]["seed"] = -3;
  EXPECT_EQ(ErrorOf(j), "generator.seed: expected an integer in [0, 2^64), got -3");
  j["generator"]["seed"] = 1.5;
  EXPECT_EQ(ErrorOf(j), "generator.seed: expected an integer in [0, 2^64), got 1.5");
  j["generator"]["seed"] = 18446744073709551615ULL;  // the largest seed is fine
  EXPECT_EQ(ErrorOf(j), "(accepted)");
  j["generator"]["name"] = "gausian";
  EXPECT_EQ(ErrorOf(j), "generator.name: unknown generator \"gausian\" (known: gaussian, uniform, outlier-channels, heavy-tail, token-scale-spread, peaked-logits, near-fp8-subnormal, near-max, constant-rows, ties)");
  j["generator"]["name"] = "gaussian";
  j["generator"]["params"] = {{"std", -1}};
  EXPECT_EQ(ErrorOf(j), "generator.params.q.std: -1 must be >= 0");
  j["generator"]["params"] = 3;
  EXPECT_EQ(ErrorOf(j), "generator.params: expected an object, got 3");
  j["generator"] = {{"name", "uniform"}, {"seed", 1}, {"parms", {}}};
  EXPECT_EQ(ErrorOf(j), "generator: unknown field \"parms\"");
  // The sink's generator object (docs/semantics.md section 7).
  j["generator"] = {{"name", "gaussian"}, {"seed", 1}, {"params", {{"sink", {{"std", 2}}}}}};
  EXPECT_EQ(ErrorOf(j), "generator.params.sink: the problem has no sink (set problem.sink = true)");
  j["problem"]["sink"] = true;
  EXPECT_EQ(ErrorOf(j), "(accepted)");
  j["generator"]["params"]["sink"] = {{"std", -2}};
  EXPECT_EQ(ErrorOf(j), "generator.params.sink.std: expected a finite number >= 0, got -2");
  j["generator"]["params"]["sink"] = {{"scale", 1}};
  EXPECT_EQ(ErrorOf(j),
            "generator.params.sink: unknown parameter \"scale\" (parameters: mean, std, or values)");
  j["generator"]["params"]["sink"] = {{"values", {1, "+inf"}}};
  EXPECT_EQ(ErrorOf(j), "generator.params.sink.values[1]: expected a number finite in float32 or "
                        "\"-inf\", got \"+inf\"");
  j["generator"]["params"]["sink"] = {{"values", {1e39}}};
  EXPECT_EQ(ErrorOf(j), "generator.params.sink.values[0]: expected a number finite in float32 or "
                        "\"-inf\", got 1e+39");
  j["generator"]["params"]["sink"] = {{"values", json::array()}};
  EXPECT_EQ(ErrorOf(j), "generator.params.sink.values: expected a non-empty array, got []");
  j["generator"]["params"]["sink"] = {{"values", {1}}, {"mean", 0}};
  EXPECT_EQ(ErrorOf(j), "generator.params.sink: give either values or mean/std, not both");
  j["problem"]["sink"] = 1;
  EXPECT_EQ(ErrorOf(j), "problem.sink: expected true or false, got 1");
  // The relative bias's: the same parameters, numbers only.
  j["problem"].erase("sink");
  j["generator"]["params"] = {{"rel_bias", {{"std", 0.5}}}};
  EXPECT_EQ(ErrorOf(j), "generator.params.rel_bias: the problem has no rel_bias (set "
                        "problem.rel_bias = true)");
  j["problem"]["rel_bias"] = true;
  EXPECT_EQ(ErrorOf(j), "(accepted)");
  j["generator"]["params"]["rel_bias"] = {{"values", {1, "-inf"}}};
  EXPECT_EQ(ErrorOf(j), "generator.params.rel_bias.values[1]: expected a number finite in "
                        "float32, got \"-inf\"");
}

TEST_F(CaseFileTest, LoadResolvesRelativeInputsAgainstTheCaseFileDirectory) {
  fs::create_directories(dir_ / "cases");
  json j = DesignCase();
  j.erase("generator");
  j["inputs"] = "../data/x.safetensors";
  WriteFile(dir_ / "cases" / "a.case.json", j.dump());
  const auto c = LoadCase(dir_ / "cases" / "a.case.json");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(fs::path(*c->inputs), (dir_ / "data" / "x.safetensors").lexically_normal());
  // Absolute paths are kept.
  j["inputs"] = "/abs/y.safetensors";
  WriteFile(dir_ / "cases" / "b.case.json", j.dump());
  EXPECT_EQ(*LoadCase(dir_ / "cases" / "b.case.json")->inputs, "/abs/y.safetensors");
}

TEST_F(CaseFileTest, LoadErrorsNameTheFile) {
  const fs::path missing = dir_ / "nope.case.json";
  EXPECT_EQ(LoadCase(missing).error().message, missing.string() + ": cannot open: no such file");
  const fs::path bad = dir_ / "bad.case.json";
  WriteFile(bad, "{\"problem\": ");
  const auto b = LoadCase(bad);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().message.rfind(bad.string() + ": invalid JSON", 0), 0u) << b.error().message;
  json j = DesignCase();
  j["problem"]["window"] = {-2, 0};
  WriteFile(bad, j.dump());
  EXPECT_EQ(LoadCase(bad).error().message,
            bad.string() + ": problem.window[0]: -2 is out of range [-1, 2147483647]");
  // Numbers too large for a double are a JSON error, not an infinite scale.
  WriteFile(bad, R"({"problem": {"scale": 1e999}, "generator": {"name": "uniform", "seed": 1}})");
  EXPECT_FALSE(LoadCase(bad).ok());
}

// Untrusted case files: a repeated key is refused (it would silently win), deep nesting is
// refused before anything recursive touches it, and only a regular file of bounded size is
// read (a FIFO would block, /dev/zero would be read until memory ran out).
TEST_F(CaseFileTest, HostileFilesAreRefusedNamingTheDefect) {
  const fs::path dup = dir_ / "dup.case.json";
  WriteFile(dup, R"({"problem": {"seqlen_q": 4, "causal": true, "seqlen_q": 8},
                     "generator": {"name": "gaussian", "seed": 1}})");
  EXPECT_EQ(LoadCase(dup).error().message,
            dup.string() + R"(: duplicate key "seqlen_q" inside "problem")");
  WriteFile(dup, R"({"problem": {}, "generator": {"name": "gaussian", "seed": 1, "seed": 2}})");
  EXPECT_EQ(LoadCase(dup).error().message,
            dup.string() + R"(: duplicate key "seed" inside "generator")");
  const fs::path deep = dir_ / "deep.case.json";
  WriteFile(deep, "{\"problem\": " + std::string(60000, '[') + std::string(60000, ']') + "}");
  const auto d = LoadCase(deep);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().message,
            deep.string() + R"(: containers nested deeper than 32 levels (under key "problem"))");
  const fs::path fifo = dir_ / "fifo.case.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto f = LoadCase(fifo);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("a FIFO, not a regular file"), std::string::npos);
  const auto z = LoadCase("/dev/zero");
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.error().message.find("a character device"), std::string::npos);
  // Messages quote at most an excerpt of a wrong value, however large.
  json j = DesignCase();
  j["problem"]["window"] = json::array();
  for (int i = 0; i < 100000; ++i) j["problem"]["window"].push_back(i);
  const fs::path big = dir_ / "big.case.json";
  WriteFile(big, j.dump());
  const auto b = LoadCase(big);
  ASSERT_FALSE(b.ok());
  EXPECT_LT(b.error().message.size(), 300u) << b.error().message.substr(0, 300);
}

TEST_F(CaseFileTest, SaveWritesCanonicalStableBytes) {
  const Case c = CaseFromJson(DesignCase()).value();
  const fs::path a = dir_ / "a.case.json", b = dir_ / "b.case.json";
  ASSERT_TRUE(SaveCase(a, c).ok());
  ASSERT_TRUE(SaveCase(b, LoadCase(a).value()).ok());
  EXPECT_EQ(ReadFile(a), ReadFile(b));
  EXPECT_EQ(ReadFile(a), R"({
  "problem": {
    "batch": 1,
    "heads_q": 4,
    "heads_kv": 2,
    "seqlen_q": 77,
    "seqlen_k": 130,
    "head_dim": 64,
    "head_dim_v": 64,
    "dtype": "bf16",
    "scale": null,
    "causal": true,
    "causal_align": "bottom_right",
    "window": [-1,-1],
    "softcap": 0.0,
    "alibi_slopes": null,
    "cu_seqlens_q": null,
    "cu_seqlens_k": null
  },
  "generator": {"name": "gaussian", "seed": 12345, "params": {}}
}
)");
  EXPECT_EQ(LoadCase(a).value(), c);
}

TEST_F(CaseFileTest, SaveRoundTripsEveryFieldIncludingExtensions) {
  json j = DesignCase();
  j["problem"]["seqlen_q"] = 4;
  j["problem"]["seqlen_k"] = 6;
  j["problem"]["scale"] = 0.1;
  j["problem"]["softcap"] = 1.0 / 3.0;
  j["problem"]["alibi_slopes"] = {0.5, 0.25, 0.125, 1.0 / 3.0};
  j["problem"]["document_ids_q"] = {{0, 0, 1, 1}};
  j["problem"]["document_ids_k"] = {{0, 0, 0, 1, 1, 1}};
  j["problem"]["prefix_lm"] = 2;
  j["problem"]["block_sparse"] = {{"block_q", 2}, {"block_k", 3}, {"blocks", {{0, 0}, {1, 1}}}};
  j["problem"]["sink"] = true;
  j["problem"]["mask_form"] = "additive_f32";  // once dropped by the canonical text
  j["generator"] = {{"name", "uniform"},
                    {"seed", 7},
                    {"params",
                     {{"low", -0.1},
                      {"q", {{"high", 3}}},
                      {"sink", {{"values", {1e30, "-inf", -0.5}}}}}}};
  const auto parsed = CaseFromJson(j);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  const Case c = *parsed;
  const fs::path a = dir_ / "a.case.json";
  ASSERT_TRUE(SaveCase(a, c).ok());
  const auto back = LoadCase(a);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, c);
  EXPECT_EQ(CaseToJson(*back), CaseToJson(c));
}

TEST_F(CaseFileTest, SaveRewritesInputsRelativeToTheNewFile) {
  fs::create_directories(dir_ / "data");
  fs::create_directories(dir_ / "deep" / "cases");
  json j = DesignCase();
  j.erase("generator");
  j["inputs"] = "data/x.safetensors";
  const Case c = CaseFromJson(j, dir_).value();  // as if loaded from dir_/some.case.json
  const fs::path saved = dir_ / "deep" / "cases" / "c.case.json";
  ASSERT_TRUE(SaveCase(saved, c).ok());
  EXPECT_EQ(json::parse(ReadFile(saved)).at("inputs"), "../../data/x.safetensors");
  EXPECT_EQ(fs::path(*LoadCase(saved)->inputs),
            (dir_ / "data" / "x.safetensors").lexically_normal());
}

TEST_F(CaseFileTest, SaveReportsUnwritablePaths) {
  const Status s =
      SaveCase(dir_ / "no" / "such" / "dir" / "x.case.json", CaseFromJson(DesignCase()).value());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("cannot open for writing"), std::string::npos);
}

}  // namespace
}  // namespace attest
