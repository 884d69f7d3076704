// Case inputs (inputs.h): a case whose problem is over the memory budget
// (reference/problem/budget.h) is refused before its inputs are allocated, with the fields that
// make it large; the learnable sink, generated (float32, deterministic, values cycling over
// heads, -inf and huge) and read from a file (F32 [Hq], present iff problem.sink, errors naming
// the tensor); likewise the learnable relative bias; paged cases (the pool generated and
// read). Built into case_file_test.
#include "reference/case/inputs.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>

#include "reference/formats/format.h"
#include "reference/io/safetensors.h"
#include "reference/problem/paged.h"

namespace attest {
namespace {

TEST(CaseInputs, RefusesAnOverBudgetCaseBeforeAllocating) {
  ::unsetenv("ATTEST_MEMORY_BUDGET");
  Case c;
  c.problem.batch = 1000000;
  c.problem.head_dim = c.problem.head_dim_v = 64;
  c.generator = GeneratorSpec{"gaussian", 1, nlohmann::json::object()};
  const auto t0 = std::chrono::steady_clock::now();
  auto in = MakeCaseInputs(c);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  ASSERT_FALSE(in.ok());
  EXPECT_NE(in.error().message.find("batch 1000000"), std::string::npos) << in.error().message;
  EXPECT_NE(in.error().message.find("over the 8 GiB memory budget (ATTEST_MEMORY_BUDGET"),
            std::string::npos)
      << in.error().message;
}

Case SinkCase(nlohmann::json sink_params) {
  Case c;
  c.problem.heads_q = 4;
  c.problem.heads_kv = 2;
  c.problem.seqlen_q = 3;
  c.problem.seqlen_k = 5;
  c.problem.head_dim = c.problem.head_dim_v = 8;
  c.problem.sink = true;
  nlohmann::json params = nlohmann::json::object();
  if (!sink_params.is_null()) params["sink"] = std::move(sink_params);
  c.generator = GeneratorSpec{"gaussian", 11, params};
  return c;
}

TEST(CaseInputs, GeneratedSinksAreFloat32DeterministicAndCycleTheirValues) {
  const auto a = MakeCaseInputs(SinkCase(nullptr));
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(a->sink.defined());
  EXPECT_EQ(a->sink.shape(), (Shape{4}));
  const auto b = MakeCaseInputs(SinkCase(nullptr));
  EXPECT_TRUE(a->sink.BitwiseEqual(b->sink));
  for (double x : a->sink.span<const double>()) {
    EXPECT_EQ(x, static_cast<double>(static_cast<float>(x)));  // rounded to float32
    EXPECT_TRUE(std::isfinite(x) && x != 0.0);
  }
  // A sink of its own stream: q, k, v, do are those of the same case without a sink.
  Case none = SinkCase(nullptr);
  none.problem.sink = false;
  const auto n = MakeCaseInputs(none);
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->sink.defined());
  EXPECT_TRUE(n->q.BitwiseEqual(a->q) && n->dout.BitwiseEqual(a->dout));
  const auto v = MakeCaseInputs(SinkCase({{"values", {1e30, "-inf", 0.1}}}));
  ASSERT_TRUE(v.ok()) << v.error().message;
  const double* x = v->sink.data<double>();
  EXPECT_EQ(x[0], static_cast<double>(1e30f));
  EXPECT_EQ(x[1], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(x[2], static_cast<double>(0.1f));
  EXPECT_EQ(x[3], x[0]);
}

TEST(CaseInputs, SinkFromAFileIsF32OfHqAndErrorsNameIt) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("attest_inputs_sink_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Case c = SinkCase(nullptr);
  const auto gen = MakeCaseInputs(c);
  ASSERT_TRUE(gen.ok());
  const auto f32 = [](const Tensor& t) { return Convert(t, Format::kF32).value(); };
  // Writes q, k, v, do (as bf16 values in f32) plus `sink` if defined; loads the case.
  const auto load = [&](const std::optional<Tensor>& sink, bool problem_sink) {
    NamedTensors file;
    file.Add("q", f32(gen->q));
    file.Add("k", f32(gen->k));
    file.Add("v", f32(gen->v));
    file.Add("do", f32(gen->dout));
    if (sink) file.Add("sink", *sink);
    const std::string path = (dir / "in.safetensors").string();
    EXPECT_TRUE(WriteSafetensors(path, file).ok());
    Case fc = c;
    fc.generator.reset();
    fc.inputs = path;
    fc.problem.sink = problem_sink;
    return MakeCaseInputs(fc);
  };
  const auto ok = load(f32(gen->sink), true);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_TRUE(ok->sink.BitwiseEqual(gen->sink));
  const auto error_of = [&](const std::optional<Tensor>& sink, bool problem_sink) {
    const auto r = load(sink, problem_sink);
    return r.ok() ? std::string("(accepted)") : r.error().message;
  };
  EXPECT_NE(error_of(std::nullopt, true).find("no tensor named 'sink' (problem.sink is true"),
            std::string::npos);
  EXPECT_NE(error_of(f32(gen->sink), false).find("'sink' is present but problem.sink is false"),
            std::string::npos);
  EXPECT_NE(error_of(gen->sink, true).find("tensor 'sink' has dtype f64, expected f32"),
            std::string::npos)
      << error_of(gen->sink, true);
  const Tensor three = f32(Tensor::FromF64({3}, {1, 2, 3}));
  EXPECT_NE(error_of(three, true).find("tensor 'sink': shape [3] does not match the problem's [4]"),
            std::string::npos)
      << error_of(three, true);
  const Tensor nan = f32(Tensor::FromF64({4}, {1, std::nan(""), 3, 4}));
  EXPECT_NE(error_of(nan, true).find("sink[1] = nan"), std::string::npos) << error_of(nan, true);
  const Tensor inf =
      f32(Tensor::FromF64({4}, {1, 2, 3, std::numeric_limits<double>::infinity()}));
  EXPECT_NE(error_of(inf, true).find("sink[3] = inf"), std::string::npos) << error_of(inf, true);
  const Tensor minus_inf =
      f32(Tensor::FromF64({4}, {1, 2, 3, -std::numeric_limits<double>::infinity()}));
  EXPECT_EQ(error_of(minus_inf, true), "(accepted)");
  std::filesystem::remove_all(dir);
}

Case RelBiasCase(nlohmann::json params_bias) {
  Case c = SinkCase(nullptr);
  c.problem.sink = false;
  c.problem.rel_bias = true;
  if (!params_bias.is_null()) c.generator->params["rel_bias"] = std::move(params_bias);
  return c;
}

TEST(CaseInputs, RelativeBiasIsGeneratedFloat32AndReadFromAFileNamingIt) {
  // Generated: [Hq, Sq + Sk - 1] float32, deterministic, its own stream (q, k, v, do as
  // without it); values cycle over the row-major table.
  const auto a = MakeCaseInputs(RelBiasCase(nullptr));
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->rel_bias.shape(), (Shape{4, 7}));
  EXPECT_FALSE(a->sink.defined());
  for (double x : a->rel_bias.span<const double>()) {
    EXPECT_EQ(x, static_cast<double>(static_cast<float>(x)));
  }
  Case none = RelBiasCase(nullptr);
  none.problem.rel_bias = false;
  const auto n = MakeCaseInputs(none);
  ASSERT_TRUE(n.ok());
  EXPECT_TRUE(n->q.BitwiseEqual(a->q) && n->dout.BitwiseEqual(a->dout));
  const auto v = MakeCaseInputs(RelBiasCase({{"values", {0.1, -2}}}));
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->rel_bias.data<double>()[27], -2.0);
  EXPECT_EQ(v->rel_bias.data<double>()[26], static_cast<double>(0.1f));
  // From a file: F32 [Hq, Sq + Sk - 1], present iff problem.rel_bias; errors name it.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("attest_inputs_rel_bias_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto f32 = [](const Tensor& t) { return Convert(t, Format::kF32).value(); };
  const auto error_of = [&](const std::optional<Tensor>& bias, bool problem_bias) {
    NamedTensors file;
    file.Add("q", f32(a->q));
    file.Add("k", f32(a->k));
    file.Add("v", f32(a->v));
    if (bias) file.Add("rel_bias", *bias);
    const std::string path = (dir / "in.safetensors").string();
    EXPECT_TRUE(WriteSafetensors(path, file).ok());
    Case fc = RelBiasCase(nullptr);
    fc.generator.reset();
    fc.inputs = path;
    fc.problem.rel_bias = problem_bias;
    const auto r = MakeCaseInputs(fc);
    if (r.ok() && bias) EXPECT_TRUE(r->rel_bias.BitwiseEqual(a->rel_bias));
    return r.ok() ? std::string("(accepted)") : r.error().message;
  };
  EXPECT_EQ(error_of(f32(a->rel_bias), true), "(accepted)");
  EXPECT_NE(error_of(std::nullopt, true).find("no tensor named 'rel_bias' (problem.rel_bias is "
                                              "true: rel_bias [4, 7] F32)"),
            std::string::npos);
  EXPECT_NE(error_of(f32(a->rel_bias), false).find("problem.rel_bias is false"),
            std::string::npos);
  EXPECT_NE(error_of(a->rel_bias, true).find("tensor 'rel_bias' has dtype f64, expected f32"),
            std::string::npos);
  EXPECT_NE(error_of(f32(Tensor::Zeros(DType::kF64, {4, 6})), true)
                .find("tensor 'rel_bias': shape [4, 6] does not match the problem's [4, 7]"),
            std::string::npos);
  std::vector<double> inf(28, 0.0);
  inf[9] = std::numeric_limits<double>::infinity();
  EXPECT_NE(error_of(f32(Tensor::FromF64({4, 7}, inf)), true).find("element 9 is inf"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

// A paged case: generated k, v are the pool (NaN where nothing is read), rounded like every
// input; a file's k and v must have the pool's shape, and the error names the tensor and it.
TEST(CaseInputs, PagedCasesGenerateAndReadThePool) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("attest_inputs_paged_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Case c;
  c.problem.batch = 2;
  c.problem.seqlen_q = 3;
  c.problem.seqlen_k = 6;
  c.problem.head_dim = c.problem.head_dim_v = 8;
  c.problem.page_size = 4;
  c.problem.seqused_k = std::vector<int32_t>{6, 1};
  FillPagedDefaults(c.problem);
  ASSERT_TRUE(Validate(c.problem).ok());
  c.generator = GeneratorSpec{"gaussian", 3, nlohmann::json::object()};
  const auto gen = MakeCaseInputs(c);
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  EXPECT_EQ(gen->k.shape(), (Shape{9, 4, 1, 8}));
  EXPECT_TRUE(std::isnan(gen->k.span<const double>()[0]));  // page 0: read by no sequence
  const auto f32 = [](const Tensor& t) { return Convert(t, Format::kF32).value(); };
  const auto load = [&](const Tensor& k) {
    NamedTensors file;
    file.Add("q", f32(gen->q));
    file.Add("k", f32(k));
    file.Add("v", f32(gen->v));
    const std::string path = (dir / "in.safetensors").string();
    EXPECT_TRUE(WriteSafetensors(path, file).ok());
    Case fc = c;
    fc.generator.reset();
    fc.inputs = path;
    return MakeCaseInputs(fc);
  };
  const auto ok = load(gen->k);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_TRUE(ok->k.BitwiseEqual(gen->k));
  const auto bad = load(Tensor::Zeros(DType::kF64, {2, 6, 1, 8}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find(
                "k: shape [2, 6, 1, 8] does not match the problem's [9, 4, 1, 8]"),
            std::string::npos)
      << bad.error().message;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace attest
