// Tests of the example HIP plugin (hip_attention_plugin.cc) through its C ABI: the library
// loads and describes itself, the device kernel says there is no HIP device on this machine,
// features it lacks are refused, and the emulated kernel (the device code's own steps run on
// the CPU with a model of WMMA) matches attention computed in double from docs/design.md's
// definition, with the mask taken from attest's reference (reference/problem/mask.h).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/kernel.h"
#include "kernels/plugin/attest_kernel.h"
#include "reference/problem/mask.h"
#include "reference/problem/problem.h"

namespace attest {
namespace {

struct PluginLib {
  void* handle = nullptr;
  const attest_kernel_desc* device = nullptr;    // "wmma-f16"
  const attest_kernel_desc* emulated = nullptr;  // "wmma-f16-emulated"
};

const PluginLib& Lib() {
  static PluginLib lib = [] {
    PluginLib l;
    l.handle = dlopen(ATTEST_HIP_WMMA_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (!l.handle) return l;
    auto get = reinterpret_cast<const attest_kernel_desc* (*)(int32_t)>(
        dlsym(l.handle, "attest_kernel_get"));
    if (get) {
      l.device = get(0);
      l.emulated = get(1);
    }
    return l;
  }();
  return lib;
}

TEST(HipPlugin, LoadsAndDescribesItself) {
  const PluginLib& lib = Lib();
  ASSERT_NE(lib.handle, nullptr) << dlerror();
  auto version = reinterpret_cast<uint32_t (*)()>(dlsym(lib.handle, "attest_kernel_abi_version"));
  auto count = reinterpret_cast<int32_t (*)()>(dlsym(lib.handle, "attest_kernel_count"));
  auto get = reinterpret_cast<const attest_kernel_desc* (*)(int32_t)>(
      dlsym(lib.handle, "attest_kernel_get"));
  ASSERT_TRUE(version && count && get);
  EXPECT_EQ(version(), ATTEST_KERNEL_ABI_VERSION);
  ASSERT_EQ(count(), 2);
  EXPECT_EQ(get(2), nullptr);
  EXPECT_EQ(get(-1), nullptr);
  // Only the three ABI symbols are exported (the HIP loader compiled in stays hidden).
  EXPECT_EQ(dlsym(lib.handle, "_ZN6attest6HipApi4LoadESt17basic_string_viewIcSt11char_traitsIcEE"),
            nullptr);
  ASSERT_NE(lib.device, nullptr);
  ASSERT_NE(lib.emulated, nullptr);
  EXPECT_STREQ(lib.device->name, "wmma-f16");
  EXPECT_STREQ(lib.emulated->name, "wmma-f16-emulated");
  EXPECT_EQ(lib.device->device_type, ATTEST_DEVICE_HIP);
  EXPECT_EQ(lib.emulated->device_type, ATTEST_DEVICE_HOST);
  for (const attest_kernel_desc* d : {lib.device, lib.emulated}) {
    EXPECT_EQ(d->abi_version, ATTEST_KERNEL_ABI_VERSION);
    EXPECT_EQ(d->struct_size, sizeof(attest_kernel_desc));
    EXPECT_NE(d->forward, nullptr);
    EXPECT_NE(d->backward, nullptr);
    auto caps = CapabilitiesFromJson(nlohmann::json::parse(d->capabilities_json));
    ASSERT_TRUE(caps.ok()) << caps.error().message;
    EXPECT_EQ(caps->dtypes, std::vector<DType>{DType::kF16});
    EXPECT_EQ(caps->head_dims, (std::vector<int64_t>{64, 128}));
    EXPECT_EQ(caps->head_dims_v, (std::vector<int64_t>{64, 128}));
    EXPECT_TRUE(caps->causal && caps->window && caps->gqa && caps->deterministic &&
                caps->backward);
    EXPECT_FALSE(caps->softcap || caps->alibi || caps->varlen ||
                 caps->documents || caps->prefix_lm || caps->block_sparse);
    EXPECT_EQ(caps->profile, "f16");
  }
}

// One call's problem and host tensors, generated from a seed; strides may be permuted.
struct Call {
  Problem problem;
  attest_problem abi{};
  std::string json;
  std::vector<_Float16> q, k, v, o;
  std::vector<float> lse;
  attest_forward_args args{};

  // `bhsd`: q, k, v, o stored as [B, H, S, D] in memory (strides say so), not [B, S, H, D].
  Call(const Problem& p, uint32_t seed, int32_t device_type, bool bhsd = false,
       double key_ramp = 0.0)
      : problem(p) {
    abi.batch = p.batch;
    abi.heads_q = p.heads_q;
    abi.heads_kv = p.heads_kv;
    abi.seqlen_q = p.seqlen_q;
    abi.seqlen_k = p.seqlen_k;
    abi.head_dim = p.head_dim;
    abi.head_dim_v = p.head_dim_v;
    abi.dtype = ATTEST_DTYPE_F16;
    abi.causal = p.causal;
    abi.causal_top_left = p.causal_align == CausalAlign::kTopLeft;
    abi.window_left = p.window_left;
    abi.window_right = p.window_right;
    abi.scale = p.EffectiveScale();
    json = "{}";
    abi.problem_json = json.c_str();
    std::mt19937 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    auto fill = [&](std::vector<_Float16>& t, int64_t n, double ramp_rows, int64_t rows_per) {
      t.resize(static_cast<size_t>(n));
      for (int64_t x = 0; x < n; ++x) {
        // key_ramp > 0 grows the keys along the sequence, so later key tiles raise the
        // running maximum again and again (the online rescale path).
        const double gain = ramp_rows > 0 ? 1.0 + ramp_rows * double((x / rows_per) % 1000) : 1.0;
        t[static_cast<size_t>(x)] = static_cast<_Float16>(normal(rng) * gain);
      }
    };
    const int64_t nq = p.batch * p.seqlen_q * p.heads_q * p.head_dim;
    const int64_t nk = p.batch * p.seqlen_k * p.heads_kv * p.head_dim;
    const int64_t nv = p.batch * p.seqlen_k * p.heads_kv * p.head_dim_v;
    fill(q, nq, 0, 1);
    // With bhsd the ramp index below is not the key index; only used with [B, S, H, D].
    fill(k, nk, key_ramp, p.heads_kv * p.head_dim);
    fill(v, nv, 0, 1);
    o.assign(static_cast<size_t>(p.batch * p.seqlen_q * p.heads_q * p.head_dim_v),
             static_cast<_Float16>(NAN));
    lse.assign(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q), NAN);
    args.struct_size = sizeof(args);
    args.problem = &abi;
    auto tensor = [&](void* data, int32_t dtype, int64_t s, int64_t h, int64_t d) {
      attest_tensor t{};
      t.data = data;
      t.dtype = dtype;
      t.ndim = 4;
      const int64_t shape[4] = {p.batch, s, h, d};
      for (int i = 0; i < 4; ++i) t.shape[i] = shape[i];
      if (bhsd) {
        t.strides[0] = h * s * d;
        t.strides[2] = s * d;
        t.strides[1] = d;
      } else {
        t.strides[0] = s * h * d;
        t.strides[1] = h * d;
        t.strides[2] = d;
      }
      t.strides[3] = 1;
      t.device_type = device_type;
      return t;
    };
    args.q = tensor(q.data(), ATTEST_DTYPE_F16, p.seqlen_q, p.heads_q, p.head_dim);
    args.k = tensor(k.data(), ATTEST_DTYPE_F16, p.seqlen_k, p.heads_kv, p.head_dim);
    args.v = tensor(v.data(), ATTEST_DTYPE_F16, p.seqlen_k, p.heads_kv, p.head_dim_v);
    args.o = tensor(o.data(), ATTEST_DTYPE_F16, p.seqlen_q, p.heads_q, p.head_dim_v);
    args.lse = attest_tensor{};
    args.lse.data = lse.data();
    args.lse.dtype = ATTEST_DTYPE_F32;
    args.lse.ndim = 3;
    args.lse.shape[0] = p.batch;
    args.lse.shape[1] = p.heads_q;
    args.lse.shape[2] = p.seqlen_q;
    args.lse.strides[0] = p.heads_q * p.seqlen_q;
    args.lse.strides[1] = p.seqlen_q;
    args.lse.strides[2] = 1;
    args.lse.device_type = device_type;
  }

  // Backward inputs and outputs: dout random, dq/dk/dv NaN-filled; o and lse as they are.
  std::vector<_Float16> dout, dq, dk, dv;
  attest_backward_args bargs{};

  void PrepareBackward(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    dout.resize(o.size());
    for (auto& x : dout) x = static_cast<_Float16>(normal(rng));
    dq.assign(q.size(), static_cast<_Float16>(NAN));
    dk.assign(k.size(), static_cast<_Float16>(NAN));
    dv.assign(v.size(), static_cast<_Float16>(NAN));
    bargs.struct_size = sizeof(bargs);
    bargs.problem = &abi;
    bargs.q = args.q;
    bargs.k = args.k;
    bargs.v = args.v;
    bargs.o = args.o;
    bargs.lse = args.lse;
    bargs.dout = args.o;
    bargs.dout.data = dout.data();
    bargs.dq = args.q;
    bargs.dq.data = dq.data();
    bargs.dk = args.k;
    bargs.dk.data = dk.data();
    bargs.dv = args.v;
    bargs.dv.data = dv.data();
  }

  int32_t RunBackward(const attest_kernel_desc* d, std::string* message) {
    char buf[512] = {};
    int32_t s = d->backward(d->self, &bargs, buf, sizeof(buf));
    *message = buf;
    return s;
  }

  int32_t Run(const attest_kernel_desc* d, std::string* message) {
    char buf[512] = {};
    int32_t s = d->forward(d->self, &args, buf, sizeof(buf));
    *message = buf;
    return s;
  }

  double At(const std::vector<_Float16>& t, const attest_tensor& desc, int64_t b, int64_t s,
            int64_t h, int64_t d) const {
    return static_cast<double>(t[static_cast<size_t>(b * desc.strides[0] + s * desc.strides[1] +
                                                     h * desc.strides[2] + d * desc.strides[3])]);
  }
};

Problem MakeProblem(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d,
                    int64_t dv) {
  Problem p;
  p.batch = b;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = d;
  p.head_dim_v = dv;
  p.dtype = DType::kF16;
  return p;
}

TEST(HipPlugin, TheDeviceKernelSaysThereIsNoHipDevice) {
  ASSERT_NE(Lib().device, nullptr);
  Call call(MakeProblem(1, 2, 1, 40, 33, 64, 128), 1, ATTEST_DEVICE_HIP);
  std::string message;
  EXPECT_EQ(call.Run(Lib().device, &message), ATTEST_ERROR);
  std::printf("wmma-f16: %s\n", message.c_str());
  if (!ATTEST_HIP_WMMA_HAS_DEVICE_CODE) {
    EXPECT_EQ(message, "this build of the plugin has no device code (clang++-19 was not found)");
    return;
  }
  bool runtime_present = false;
  for (const char* name : {"libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"}) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
      runtime_present = true;
      dlclose(h);
      break;
    }
  }
  const std::string expected =
      runtime_present ? "no HIP device: hipGetDeviceCount returned " : "no HIP runtime: ";
  EXPECT_EQ(message.compare(0, expected.size(), expected), 0) << message;
  // Outputs untouched.
  for (float x : call.lse) EXPECT_TRUE(std::isnan(x));
  call.PrepareBackward(2);
  std::string backward_message;
  EXPECT_EQ(call.RunBackward(Lib().device, &backward_message), ATTEST_ERROR);
  EXPECT_EQ(backward_message, message);
}

TEST(HipPlugin, FeaturesItLacksAreRefused) {
  const attest_kernel_desc* d = Lib().emulated;
  ASSERT_NE(d, nullptr);
  std::string message;
  auto refuse = [&](Call& call, const std::string& why) {
    EXPECT_EQ(call.Run(d, &message), ATTEST_UNSUPPORTED) << why;
    EXPECT_EQ(message, why);
    for (float x : call.lse) ASSERT_TRUE(std::isnan(x)) << why << ": wrote an output";
  };
  const Problem base = MakeProblem(1, 2, 2, 20, 20, 64, 64);
  {
    Call c(base, 2, ATTEST_DEVICE_HOST);
    c.abi.softcap = 30.0;
    refuse(c, "softcap");
  }
  {
    Call c(base, 2, ATTEST_DEVICE_HOST);
    const double slopes[2] = {0.5, 0.25};
    c.abi.alibi_slopes = slopes;
    refuse(c, "alibi");
  }
  {
    Call c(base, 2, ATTEST_DEVICE_HOST);
    const int32_t cu[2] = {0, 20};
    c.abi.cu_seqlens_q = cu;
    c.abi.cu_seqlens_k = cu;
    refuse(c, "varlen");
  }
  {
    Call c(base, 2, ATTEST_DEVICE_HOST);
    c.abi.dtype = ATTEST_DTYPE_BF16;
    refuse(c, "dtype: f16 only");
  }
  {
    Call c(MakeProblem(1, 2, 2, 20, 20, 96, 64), 2, ATTEST_DEVICE_HOST);
    refuse(c, "head_dim 96");
  }
  {
    Call c(MakeProblem(1, 3, 2, 20, 20, 64, 64), 2, ATTEST_DEVICE_HOST);
    refuse(c, "heads_q 3 not a multiple of heads_kv 2");
  }
  {
    Call c(base, 2, ATTEST_DEVICE_HOST);
    c.json = R"({"batch":1,"prefix_lm": 4})";
    c.abi.problem_json = c.json.c_str();
    refuse(c, "prefix_lm");
  }
  {
    Call c(base, 2, ATTEST_DEVICE_HOST);
    c.json = R"({"document_ids_q":[[0,0,1]],"document_ids_k":[[0,1,1]]})";
    c.abi.problem_json = c.json.c_str();
    refuse(c, "document_ids_q");
  }
  {
    // Features present but off are fine.
    Call c(base, 2, ATTEST_DEVICE_HOST);
    c.json = R"({"prefix_lm": 0, "block_sparse": null})";
    c.abi.problem_json = c.json.c_str();
    EXPECT_EQ(c.Run(d, &message), ATTEST_OK) << message;
  }
  {
    // A tensor on the wrong device is the caller's error, not a refusal.
    Call c(base, 2, ATTEST_DEVICE_HIP);
    EXPECT_EQ(c.Run(d, &message), ATTEST_ERROR);
    EXPECT_EQ(message, "tensor q: device_type 2");
  }
}

struct Case {
  const char* name;
  Problem problem;
  bool bhsd = false;
  double key_ramp = 0.0;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  auto add = [&](const char* name, Problem p, bool bhsd = false, double ramp = 0.0) {
    cases.push_back({name, std::move(p), bhsd, ramp});
  };
  add("one tile", MakeProblem(1, 1, 1, 16, 16, 64, 64));
  add("single element", MakeProblem(1, 1, 1, 1, 1, 64, 64));
  add("ragged gqa d64 dv128", MakeProblem(2, 4, 2, 37, 45, 64, 128));
  Problem causal = MakeProblem(2, 4, 2, 37, 45, 128, 64);
  causal.causal = true;
  add("causal bottom-right", causal);
  Problem empty_rows = MakeProblem(1, 2, 2, 45, 37, 64, 64);
  empty_rows.causal = true;  // Sq > Sk: the first 8 rows see nothing
  add("causal Sq > Sk (empty rows)", empty_rows);
  Problem top_left = MakeProblem(1, 2, 1, 33, 50, 128, 128);
  top_left.causal = true;
  top_left.causal_align = CausalAlign::kTopLeft;
  add("causal top-left", top_left);
  Problem window = MakeProblem(1, 2, 1, 40, 70, 64, 64);
  window.window_left = 8;
  window.window_right = 3;
  add("window (8, 3)", window);
  Problem causal_window = MakeProblem(1, 1, 1, 50, 50, 64, 64);
  causal_window.causal = true;
  causal_window.window_left = 17;
  add("causal window (17, 0)", causal_window);
  add("no keys", MakeProblem(1, 1, 1, 20, 0, 64, 64));
  add("[B, H, S, D] strides", MakeProblem(2, 2, 1, 29, 31, 64, 128), true);
  Problem ramp = MakeProblem(1, 1, 1, 16, 96, 64, 64);
  ramp.scale = 0.5;
  add("growing keys (online rescale)", ramp, false, 0.05);
  return cases;
}

TEST(HipPlugin, TheEmulatedKernelMatchesAttentionInDouble) {
  const attest_kernel_desc* d = Lib().emulated;
  ASSERT_NE(d, nullptr);
  uint32_t seed = 100;
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    Call call(c.problem, seed++, ATTEST_DEVICE_HOST, c.bhsd, c.key_ramp);
    std::string message;
    ASSERT_EQ(call.Run(d, &message), ATTEST_OK) << message;
    const Problem& p = c.problem;
    const double scale = p.EffectiveScale();
    double worst_o = 0, worst_lse = 0;  // error / allowed
    for (int64_t b = 0; b < p.batch; ++b) {
      const MaskView mask(p, b);
      for (int64_t h = 0; h < p.heads_q; ++h) {
        const int64_t hk = p.KvHead(h);
        for (int64_t i = 0; i < p.seqlen_q; ++i) {
          std::vector<double> s;
          std::vector<int64_t> keys;
          double m = -INFINITY;
          for (int64_t j = 0; j < p.seqlen_k; ++j) {
            if (!mask.Visible(i, j)) continue;
            double dot = 0;
            for (int64_t x = 0; x < p.head_dim; ++x) {
              dot += call.At(call.q, call.args.q, b, i, h, x) *
                     call.At(call.k, call.args.k, b, j, hk, x);
            }
            s.push_back(scale * dot);
            keys.push_back(j);
            m = std::max(m, scale * dot);
          }
          const float lse = call.lse[static_cast<size_t>((b * p.heads_q + h) * p.seqlen_q + i)];
          if (keys.empty()) {
            ASSERT_EQ(lse, -INFINITY) << "row " << i << " is empty";
            for (int64_t x = 0; x < p.head_dim_v; ++x) {
              ASSERT_EQ(call.At(call.o, call.args.o, b, i, h, x), 0.0) << "row " << i;
            }
            continue;
          }
          double l = 0;
          for (double& e : s) l += (e = std::exp(e - m));
          const double want_lse = m + std::log(l);
          const double lse_allowed = 1e-4 + 1e-5 * std::fabs(want_lse);
          worst_lse = std::max(worst_lse, std::fabs(lse - want_lse) / lse_allowed);
          ASSERT_LE(std::fabs(lse - want_lse), lse_allowed) << "lse b " << b << " h " << h
                                                            << " i " << i;
          for (int64_t x = 0; x < p.head_dim_v; ++x) {
            double want = 0, vmax = 0;
            for (size_t n = 0; n < keys.size(); ++n) {
              const double vv = call.At(call.v, call.args.v, b, keys[n], hk, x);
              want += s[n] * vv;
              vmax = std::max(vmax, std::fabs(vv));
            }
            want /= l;
            // P is rounded to f16 (2^-11 relative) before P V, and o to f16 on the way out.
            const double allowed = std::ldexp(1.0, -11) * vmax + std::ldexp(1.0, -11) *
                                   std::fabs(want) + 1e-6;
            const double got = call.At(call.o, call.args.o, b, i, h, x);
            worst_o = std::max(worst_o, std::fabs(got - want) / allowed);
            ASSERT_LE(std::fabs(got - want), allowed)
                << "o[" << b << ", " << i << ", " << h << ", " << x << "] = " << got
                << ", want " << want;
          }
        }
      }
    }
    std::printf("%-32s worst o error %.3f of allowed, lse %.3f of allowed\n", c.name, worst_o,
                worst_lse);
  }
}

// The emulated backward against the exact gradient in double (P from the exact forward, D
// from the exact o). The kernel rounds P and dS to f16 as WMMA operands, reads D from its own
// f16 o, and stores f16: each term of a gradient sum is allowed a relative error of 2^-8
// (four times those roundings together), plus 2^-11 of the result for the f16 store.
TEST(HipPlugin, TheEmulatedBackwardMatchesTheExactGradient) {
  const attest_kernel_desc* d = Lib().emulated;
  ASSERT_NE(d, nullptr);
  uint32_t seed = 500;
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    Call call(c.problem, seed++, ATTEST_DEVICE_HOST, c.bhsd, c.key_ramp);
    std::string message;
    ASSERT_EQ(call.Run(d, &message), ATTEST_OK) << message;
    call.PrepareBackward(seed++);
    ASSERT_EQ(call.RunBackward(d, &message), ATTEST_OK) << message;
    const Problem& p = c.problem;
    const double scale = p.EffectiveScale();
    const int64_t D = p.head_dim, Dv = p.head_dim_v;
    // Exact gradients and, per element, the sum of the magnitudes of its terms.
    const size_t nq = call.q.size(), nk = call.k.size(), nv = call.v.size();
    std::vector<double> dq(nq, 0), dk(nk, 0), dv(nv, 0), mq(nq, 0), mk(nk, 0), mv(nv, 0);
    auto index = [](const attest_tensor& t, int64_t b, int64_t s, int64_t h, int64_t x) {
      return static_cast<size_t>(b * t.strides[0] + s * t.strides[1] + h * t.strides[2] +
                                 x * t.strides[3]);
    };
    double vmax = 0;
    for (const _Float16& x : call.v) vmax = std::max(vmax, std::fabs(double(x)));
    for (int64_t b = 0; b < p.batch; ++b) {
      const MaskView mask(p, b);
      for (int64_t h = 0; h < p.heads_q; ++h) {
        const int64_t hk = p.KvHead(h);
        for (int64_t i = 0; i < p.seqlen_q; ++i) {
          std::vector<int64_t> keys;
          std::vector<double> s;
          double m = -INFINITY;
          for (int64_t j = 0; j < p.seqlen_k; ++j) {
            if (!mask.Visible(i, j)) continue;
            double dot = 0;
            for (int64_t x = 0; x < D; ++x) {
              dot += call.At(call.q, call.args.q, b, i, h, x) *
                     call.At(call.k, call.args.k, b, j, hk, x);
            }
            keys.push_back(j);
            s.push_back(scale * dot);
            m = std::max(m, scale * dot);
          }
          if (keys.empty()) continue;
          double l = 0;
          for (double& e : s) l += (e = std::exp(e - m));
          for (double& e : s) e /= l;  // s now holds P
          std::vector<double> o(static_cast<size_t>(Dv), 0.0);
          for (size_t n = 0; n < keys.size(); ++n) {
            for (int64_t x = 0; x < Dv; ++x) {
              o[size_t(x)] += s[n] * call.At(call.v, call.args.v, b, keys[n], hk, x);
            }
          }
          double delta = 0, delta_abs = 0, do_abs = 0;
          for (int64_t x = 0; x < Dv; ++x) {
            const double g = double(call.dout[index(call.bargs.dout, b, i, h, x)]);
            delta += g * o[size_t(x)];
            delta_abs += std::fabs(g * o[size_t(x)]);
            do_abs += std::fabs(g);
          }
          for (size_t n = 0; n < keys.size(); ++n) {
            const int64_t j = keys[n];
            double dp = 0;
            for (int64_t x = 0; x < Dv; ++x) {
              const double g = double(call.dout[index(call.bargs.dout, b, i, h, x)]);
              dp += g * call.At(call.v, call.args.v, b, j, hk, x);
              dv[index(call.args.v, b, j, hk, x)] += s[n] * g;
              mv[index(call.args.v, b, j, hk, x)] += s[n] * std::fabs(g);
            }
            const double ds = s[n] * (dp - delta);
            // delta_abs: D's f16 o rounding; do_abs * vmax / 8: the forward's o error
            // (2^-11 max|v| per element, against the 2^-8 allowed per unit of magnitude).
            const double ds_mag = s[n] * (std::fabs(dp) + std::fabs(delta) + delta_abs +
                                          do_abs * vmax / 8);
            for (int64_t x = 0; x < D; ++x) {
              const double qx = call.At(call.q, call.args.q, b, i, h, x);
              const double kx = call.At(call.k, call.args.k, b, j, hk, x);
              dq[index(call.args.q, b, i, h, x)] += scale * ds * kx;
              mq[index(call.args.q, b, i, h, x)] += scale * ds_mag * std::fabs(kx);
              dk[index(call.args.k, b, j, hk, x)] += scale * ds * qx;
              mk[index(call.args.k, b, j, hk, x)] += scale * ds_mag * std::fabs(qx);
            }
          }
        }
      }
    }
    auto compare = [&](const char* name, const std::vector<_Float16>& got,
                       const std::vector<double>& want, const std::vector<double>& mag) {
      double worst = 0;
      for (size_t x = 0; x < got.size(); ++x) {
        const double g = double(got[x]);
        if (mag[x] == 0) {
          // No term at all (an empty row, a key no query sees): exactly zero.
          ASSERT_EQ(g, 0.0) << name << "[" << x << "] has no terms";
          continue;
        }
        const double allowed = std::ldexp(mag[x], -8) + std::ldexp(std::fabs(want[x]), -11) + 1e-6;
        worst = std::max(worst, std::fabs(g - want[x]) / allowed);
        ASSERT_LE(std::fabs(g - want[x]), allowed)
            << name << "[" << x << "] = " << g << ", want " << want[x];
      }
      std::printf("%-32s worst %s error %.3f of allowed\n", c.name, name, worst);
    };
    compare("dq", call.dq, dq, mq);
    compare("dk", call.dk, dk, mk);
    compare("dv", call.dv, dv, mv);
  }
}

// With one key, P = 1 and dP = Δ exactly, so the exact dq and dk are 0. The kernel must get
// 0 too, not an f32 rounding of dP − Δ (attest's gate caught that in a first version).
TEST(HipPlugin, OneKeyGivesExactlyZeroDqAndDk) {
  const attest_kernel_desc* d = Lib().emulated;
  ASSERT_NE(d, nullptr);
  for (int64_t dv : {64, 128}) {
    Call call(MakeProblem(1, 4, 2, 129, 1, 64, dv), 77, ATTEST_DEVICE_HOST);
    std::string message;
    ASSERT_EQ(call.Run(d, &message), ATTEST_OK) << message;
    call.PrepareBackward(78);
    ASSERT_EQ(call.RunBackward(d, &message), ATTEST_OK) << message;
    for (const _Float16& x : call.dq) ASSERT_EQ(double(x), 0.0) << "dq, Dv " << dv;
    for (const _Float16& x : call.dk) ASSERT_EQ(double(x), 0.0) << "dk, Dv " << dv;
  }
}

// Reversing the query heads inside each GQA group permutes o, lse and dq and leaves dk and dv
// unchanged, bit for bit (the dK/dV kernel sums a group's heads in mirrored pairs), for
// group sizes 2, 3 and 4.
TEST(HipPlugin, ReversingTheHeadsOfAGroupIsBitwiseNeutral) {
  const attest_kernel_desc* d = Lib().emulated;
  ASSERT_NE(d, nullptr);
  for (int64_t ratio : {2, 3, 4}) {
    SCOPED_TRACE("group size " + std::to_string(ratio));
    Problem p = MakeProblem(1, 2 * ratio, 2, 33, 40, 64, 64);
    p.causal = true;
    Call base(p, 900, ATTEST_DEVICE_HOST), perm(p, 900, ATTEST_DEVICE_HOST);
    std::string message;
    ASSERT_EQ(base.Run(d, &message), ATTEST_OK) << message;
    base.PrepareBackward(901);
    ASSERT_EQ(base.RunBackward(d, &message), ATTEST_OK) << message;
    auto src = [&](int64_t h) { return h / ratio * ratio + (ratio - 1 - h % ratio); };
    const int64_t D = p.head_dim;
    for (int64_t i = 0; i < p.seqlen_q; ++i) {
      for (int64_t h = 0; h < p.heads_q; ++h) {
        for (int64_t x = 0; x < D; ++x) {
          perm.q[size_t((i * p.heads_q + h) * D + x)] = base.q[size_t((i * p.heads_q + src(h)) * D + x)];
        }
      }
    }
    ASSERT_EQ(perm.Run(d, &message), ATTEST_OK) << message;
    perm.PrepareBackward(901);
    for (int64_t i = 0; i < p.seqlen_q; ++i) {
      for (int64_t h = 0; h < p.heads_q; ++h) {
        for (int64_t x = 0; x < p.head_dim_v; ++x) {
          const size_t to = size_t((i * p.heads_q + h) * p.head_dim_v + x);
          const size_t from = size_t((i * p.heads_q + src(h)) * p.head_dim_v + x);
          perm.dout[to] = base.dout[from];
          ASSERT_EQ(std::memcmp(&perm.o[to], &base.o[from], 2), 0) << "o";
        }
        ASSERT_EQ(perm.lse[size_t(h * p.seqlen_q + i)], base.lse[size_t(src(h) * p.seqlen_q + i)]);
      }
    }
    ASSERT_EQ(perm.RunBackward(d, &message), ATTEST_OK) << message;
    for (int64_t i = 0; i < p.seqlen_q; ++i) {
      for (int64_t h = 0; h < p.heads_q; ++h) {
        for (int64_t x = 0; x < D; ++x) {
          ASSERT_EQ(std::memcmp(&perm.dq[size_t((i * p.heads_q + h) * D + x)],
                                &base.dq[size_t((i * p.heads_q + src(h)) * D + x)], 2),
                    0)
              << "dq";
        }
      }
    }
    ASSERT_EQ(std::memcmp(perm.dk.data(), base.dk.data(), base.dk.size() * 2), 0) << "dk";
    ASSERT_EQ(std::memcmp(perm.dv.data(), base.dv.data(), base.dv.size() * 2), 0) << "dv";
  }
}

}  // namespace
}  // namespace attest
