// The plugin: loader and its isolation (kernels/plugin/plugin.h, attest_kernel.h): ABI
// checks with errors naming the library and the symbol or field, the struct layouts a plugin
// compiles against, crashes / aborts / hangs / lies becoming findings while the harness goes
// on, and the example plugins' conversions (plugin_suite_test runs them through the suites).
#include "kernels/plugin/plugin.h"

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>

#include <gtest/gtest.h>

#include "kernels/plugin/attest_kernel.h"
#include "kernels/plugin/examples/flash_rows.h"
#include "kernels/plugin/library.h"
#include "reference/formats/format.h"

namespace attest {
namespace {

// The C ABI's layout on LP64 targets (x86-64, aarch64): a plugin compiled against
// attest_kernel.h by any C compiler must agree with these numbers. A change here is an ABI
// change and needs ATTEST_KERNEL_ABI_VERSION bumped.
static_assert(sizeof(void*) == 8, "the layout below is for LP64 targets");
static_assert(sizeof(attest_tensor) == 88);
static_assert(offsetof(attest_tensor, dtype) == 8);
static_assert(offsetof(attest_tensor, shape) == 16);
static_assert(offsetof(attest_tensor, strides) == 48);
static_assert(offsetof(attest_tensor, device_type) == 80);
static_assert(sizeof(attest_problem) == 136);
static_assert(offsetof(attest_problem, dtype) == 56);
static_assert(offsetof(attest_problem, window_left) == 72);
static_assert(offsetof(attest_problem, scale) == 88);
static_assert(offsetof(attest_problem, alibi_slopes) == 104);
static_assert(offsetof(attest_problem, problem_json) == 128);
static_assert(sizeof(attest_forward_args) == 8 + 8 + 5 * 88 + 8);
static_assert(offsetof(attest_forward_args, q) == 16);
static_assert(offsetof(attest_forward_args, stream) == 456);
static_assert(sizeof(attest_backward_args) == 8 + 8 + 9 * 88 + 8);
static_assert(offsetof(attest_backward_args, stream) == 808);
static_assert(sizeof(attest_kernel_desc) == 56);
static_assert(offsetof(attest_kernel_desc, capabilities_json) == 16);
static_assert(offsetof(attest_kernel_desc, forward) == 32);
static_assert(offsetof(attest_kernel_desc, self) == 48);

std::string Lib(const char* name) { return std::string(ATTEST_PLUGIN_DIR) + "/lib" + name + ".so"; }

PluginOptions Isolated(double timeout_s = 60) {
  PluginOptions o;
  o.isolate = true;
  o.timeout_s = timeout_s;
  return o;
}
PluginOptions InProcess() {
  PluginOptions o;
  o.isolate = false;
  return o;
}

std::string LoadError(const std::string& spec, const PluginOptions& options) {
  auto k = LoadPluginKernel(spec, options);
  EXPECT_FALSE(k.ok()) << spec;
  return k.ok() ? std::string() : k.error().message;
}

#define EXPECT_HAS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (text) << "' lacks '" << (part) << "'"

TEST(PluginSpec, PathAndName) {
  PluginSpec s = ParsePluginSpec("/no/such/lib.so:flash-bf16");
  EXPECT_EQ(s.path, "/no/such/lib.so");
  EXPECT_EQ(s.name, "flash-bf16");
  s = ParsePluginSpec(Lib("attest_example_host"));  // an existing file is the whole path
  EXPECT_EQ(s.path, Lib("attest_example_host"));
  EXPECT_EQ(s.name, "");
  s = ParsePluginSpec("relative.so");
  EXPECT_EQ(s.path, "relative.so");
}

TEST(PluginLoader, AcceptsTheHostExample) {
  for (const PluginOptions& o : {InProcess(), Isolated()}) {
    auto k = LoadPluginKernel(Lib("attest_example_host") + ":flash-bf16", o);
    ASSERT_TRUE(k.ok()) << k.error().message;
    const Capabilities caps = (*k)->capabilities();
    ASSERT_EQ(caps.dtypes.size(), 1u);
    EXPECT_EQ(caps.dtypes[0], DType::kBF16);
    EXPECT_TRUE(caps.causal && caps.window && caps.softcap && caps.alibi && caps.varlen &&
                caps.gqa && caps.backward && caps.deterministic);
    EXPECT_FALSE(caps.documents || caps.prefix_lm || caps.block_sparse);
    EXPECT_EQ(caps.profile, "bf16");
    EXPECT_EQ((*k)->name(), "plugin:" + Lib("attest_example_host") + ":flash-bf16");
  }
}

TEST(PluginLoader, ErrorsNameTheLibraryAndTheSymbolOrField) {
  for (const PluginOptions& o : {InProcess(), Isolated()}) {
    std::string e = LoadError(Lib("attest_test_bad_version"), o);
    EXPECT_HAS(e, Lib("attest_test_bad_version"));
    EXPECT_HAS(e, "attest_kernel_abi_version() returned 999");
    e = LoadError(Lib("attest_test_missing_get"), o);
    EXPECT_HAS(e, Lib("attest_test_missing_get"));
    EXPECT_HAS(e, "missing symbol attest_kernel_get");
    e = LoadError(Lib("attest_test_bad_struct") + ":segfault", o);
    EXPECT_HAS(e, "attest_kernel_get(0)->struct_size is 48, expected sizeof(attest_kernel_desc) = 56");
    e = LoadError(Lib("attest_test_bad_caps") + ":segfault", o);
    EXPECT_HAS(e, "capabilities.dtypes: unknown dtype 'bf17'");
    EXPECT_HAS(e, "kernel 'segfault'");
    e = LoadError(Lib("attest_test_no_lse") + ":segfault", o);  // plugins always return lse
    EXPECT_HAS(e, "capabilities.lse: false is not supported by the C ABI");
    e = LoadError(Lib("attest_test_sink") + ":segfault", o);  // no sink through the C ABI
    EXPECT_HAS(e, "capabilities.sink: true is not supported by the C ABI");
    e = LoadError(Lib("attest_test_rel_bias") + ":segfault", o);  // nor a relative bias
    EXPECT_HAS(e, "capabilities.rel_bias: true is not supported by the C ABI");
    e = LoadError(Lib("attest_test_paged") + ":segfault", o);  // no page table either
    EXPECT_HAS(e, "capabilities.paged: true is not supported by the C ABI");
    e = LoadError("/no/such/dir/libnothing.so", o);
    EXPECT_HAS(e, "plugin /no/such/dir/libnothing.so: cannot load");
    e = LoadError(Lib("attest_example_host"), o);  // three kernels: say which
    EXPECT_HAS(e, "provides 3 kernels (flash-f32, flash-bf16, flash-f16)");
    e = LoadError(Lib("attest_example_host") + ":nope", o);
    EXPECT_HAS(e, "no kernel named 'nope'");
  }
}

TEST(PluginLoader, RegistryPrefix) {
  KernelRegistry registry;
  RegisterPluginPrefix(registry);
  auto k = registry.Create("plugin:" + Lib("attest_example_host") + ":flash-f32");
  ASSERT_TRUE(k.ok()) << k.error().message;
  EXPECT_EQ((*k)->capabilities().profile, "f32");
  auto bad = registry.Create("plugin:" + Lib("attest_test_bad_version"));
  ASSERT_FALSE(bad.ok());
  EXPECT_HAS(bad.error().message, "returned 999");
}

// A small f32 problem with random inputs.
struct Small {
  Problem p;
  Tensor q, k, v, dout;
};
Small MakeSmall() {
  Small s;
  s.p.batch = 1;
  s.p.heads_q = s.p.heads_kv = 1;
  s.p.seqlen_q = s.p.seqlen_k = 8;
  s.p.head_dim = s.p.head_dim_v = 8;
  s.p.dtype = DType::kF32;
  auto fill = [](const Shape& shape, double phase) {
    std::vector<double> v(static_cast<size_t>(Tensor::NumElements(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = RoundTo(std::sin(phase + 0.7 * i), Format::kF32);
    return Tensor::FromF64(shape, v);
  };
  s.q = fill(s.p.QShape(), 0.1);
  s.k = fill(s.p.KShape(), 0.2);
  s.v = fill(s.p.VShape(), 0.3);
  s.dout = fill(s.p.OShape(), 0.4);
  return s;
}

Error ForwardError(Kernel& k, const Small& s) {
  auto a = k.Forward(s.p, s.q, s.k, s.v);
  if (auto* e = std::get_if<Error>(&a)) return *e;
  ADD_FAILURE() << "forward did not answer with an Error";
  return Error{};
}

TEST(PluginIsolation, CrashesAbortsAndHangsAreFindingsAndTheRunGoesOn) {
  const Small s = MakeSmall();
  const std::string lib = Lib("attest_test_faulty");
  {
    auto k = LoadPluginKernel(lib + ":segfault", Isolated());
    ASSERT_TRUE(k.ok()) << k.error().message;
    // Twice: the second call runs in a fresh child.
    for (int round = 0; round < 2; ++round) {
      const Error e = ForwardError(**k, s);
#if defined(__SANITIZE_ADDRESS__)
      // AddressSanitizer may keep its own SIGSEGV handler, which reports and exits.
      EXPECT_TRUE(e.message.find("signal 11") != std::string::npos ||
                  e.message.find("exited with status") != std::string::npos)
          << e.message;
#else
      EXPECT_HAS(e.message, "signal 11");
#endif
      EXPECT_HAS(e.message, lib + ":segfault forward");
    }
  }
  {
    auto k = LoadPluginKernel(lib + ":abort", Isolated());
    ASSERT_TRUE(k.ok());
    EXPECT_HAS(ForwardError(**k, s).message, "signal 6");
  }
  {
    auto k = LoadPluginKernel(lib + ":hang", Isolated(/*timeout_s=*/0.5));
    ASSERT_TRUE(k.ok());
    const auto start = std::chrono::steady_clock::now();
    const Error e = ForwardError(**k, s);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_HAS(e.message, "no answer to forward within 0.5 s");
    EXPECT_LT(took, 10.0);
  }
}

// A child holds only its own socket: closing kernel A ends A's child at once even while
// kernel B's child (forked later, so it could have inherited A's socket) lives on. Without
// that, A's child would linger until the 2 s grace period runs out and it is killed.
TEST(PluginIsolation, ClosingOneKernelEndsItsChildPromptly) {
  const std::string spec = Lib("attest_example_host") + ":flash-f32";
  auto a = LoadPluginKernel(spec, Isolated());
  auto b = LoadPluginKernel(spec, Isolated());
  ASSERT_TRUE(a.ok() && b.ok());
  const auto start = std::chrono::steady_clock::now();
  a->reset();
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 1.5);
}

TEST(PluginIsolation, ErrorsAndProtocolViolationsInBothModes) {
  const Small s = MakeSmall();
  const std::string lib = Lib("attest_test_faulty");
  for (const PluginOptions& o : {InProcess(), Isolated()}) {
    auto error = LoadPluginKernel(lib + ":error", o);
    ASSERT_TRUE(error.ok());
    EXPECT_HAS(ForwardError(**error, s).message,
               "returned ATTEST_ERROR: cudaErrorIllegalAddress (simulated)");
    auto status = LoadPluginKernel(lib + ":bad-status", o);
    ASSERT_TRUE(status.ok());
    EXPECT_HAS(ForwardError(**status, s).message, "protocol violation: returned 7");
    auto writes = LoadPluginKernel(lib + ":writes-input", o);
    ASSERT_TRUE(writes.ok());
    EXPECT_HAS(ForwardError(**writes, s).message, "wrote into its input tensor q");
    // Backward is NULL and not claimed: an honest refusal.
    auto bwd = (*error)->Backward(s.p, s.q, s.k, s.v, s.q, s.q, s.dout);
    EXPECT_TRUE(std::holds_alternative<Unsupported>(bwd));
  }
}

TEST(PluginCalls, IsolatedAndInProcessGiveTheSameBits) {
  const Small s = MakeSmall();
  const std::string spec = Lib("attest_example_host") + ":flash-f32";
  auto a = LoadPluginKernel(spec, InProcess());
  auto b = LoadPluginKernel(spec, Isolated());
  ASSERT_TRUE(a.ok() && b.ok());
  auto fa = (*a)->Forward(s.p, s.q, s.k, s.v);
  auto fb = (*b)->Forward(s.p, s.q, s.k, s.v);
  ASSERT_TRUE(std::holds_alternative<ForwardResult>(fa) && std::holds_alternative<ForwardResult>(fb));
  const ForwardResult& ra = std::get<ForwardResult>(fa);
  const ForwardResult& rb = std::get<ForwardResult>(fb);
  EXPECT_TRUE(ra.o.BitwiseEqual(rb.o));
  EXPECT_TRUE(ra.lse.BitwiseEqual(rb.lse));
  EXPECT_EQ(ra.o.dtype(), DType::kF32);  // as the kernel wrote it (the problem's dtype)
  EXPECT_EQ(ra.lse.dtype(), DType::kF32);
  auto ba = (*a)->Backward(s.p, s.q, s.k, s.v, ra.o, ra.lse, s.dout);
  auto bb = (*b)->Backward(s.p, s.q, s.k, s.v, rb.o, rb.lse, s.dout);
  ASSERT_TRUE(std::holds_alternative<BackwardResult>(ba) &&
              std::holds_alternative<BackwardResult>(bb));
  EXPECT_TRUE(std::get<BackwardResult>(ba).dk.BitwiseEqual(std::get<BackwardResult>(bb).dk));
  // A feature it does not implement is refused with a reason, not computed wrongly.
  Problem docs = s.p;
  docs.causal = true;
  docs.prefix_lm = 2;
  auto refused = (*b)->Forward(docs, s.q, s.k, s.v);
  ASSERT_TRUE(std::holds_alternative<Unsupported>(refused));
  EXPECT_HAS(std::get<Unsupported>(refused).reason, "prefix_lm");
}

// The example's own conversions against attest's formats: every f16 and bf16 code decodes
// exactly; fp32 values (a strided sweep over all bit patterns plus every rounding boundary
// neighbourhood of f16) round to nearest even exactly as reference/formats does.
TEST(ExampleConversions, MatchReferenceFormats) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const double f16 = attest_example::F16ToFloat(static_cast<uint16_t>(c));
    const double bf16 = attest_example::Bf16ToFloat(static_cast<uint16_t>(c));
    const double ref16 = Decode(c, Format::kF16), refb = Decode(c, Format::kBF16);
    ASSERT_TRUE(f16 == ref16 || (std::isnan(f16) && std::isnan(ref16))) << c;
    ASSERT_TRUE(bf16 == refb || (std::isnan(bf16) && std::isnan(refb))) << c;
  }
  auto check = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    const uint16_t h = attest_example::FloatToF16(f), b = attest_example::FloatToBf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(IsNanCode(h, Format::kF16) && IsNanCode(b, Format::kBF16)) << bits;
      return;
    }
    ASSERT_EQ(h, Encode(f, Format::kF16).code) << std::hex << bits;
    ASSERT_EQ(b, Encode(f, Format::kBF16).code) << std::hex << bits;
  };
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 4099) check(static_cast<uint32_t>(bits));
  // Around every f16 rounding boundary: the midpoints between consecutive f16 values.
  for (uint32_t c = 0; c < 0x7c00; ++c) {
    const float mid = static_cast<float>((Decode(c, Format::kF16) + Decode(c + 1, Format::kF16)) / 2);
    uint32_t m;
    std::memcpy(&m, &mid, sizeof m);
    for (uint32_t d = 0; d < 3; ++d) {
      check(m - 1 + d);
      check((m - 1 + d) | 0x80000000u);
    }
  }
}

// The CUDA example on a machine without a GPU: a clean load error, no crash.
TEST(CudaPlugin, SaysWhyItCannotRunWithoutADevice) {
  const std::string lib = ATTEST_CUDA_PLUGIN;
  if (lib.empty()) GTEST_SKIP() << "built without nvcc";
  auto k = LoadPluginKernel(lib + ":flash-bf16", Isolated());
  if (k.ok()) GTEST_SKIP() << "this machine has a CUDA device (tools/device/gpu_gate.sh runs it)";
  const std::string& e = k.error().message;
  EXPECT_TRUE(e.find("no CUDA device") != std::string::npos ||
              e.find("no CUDA runtime") != std::string::npos)
      << e;
  EXPECT_HAS(e, lib + ":flash-bf16");
}

}  // namespace
}  // namespace attest
