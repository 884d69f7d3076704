// The example HIP plugin (docs/hip.md; C ABI kernels/plugin/attest_kernel.h): fp16
// attention forward and backward on RDNA3 WMMA (hip_attention.h, hip_attention_bwd.h).
// Two kernels:
//   wmma-f16           device HIP: launches the device code (hip_attention_device.hip,
//                      embedded as an offload bundle for gfx1100 and gfx1151) through the HIP
//                      module API of the runtime that attest's adapter loaded (dlopen).
//   wmma-f16-emulated  host: the same kernel steps run lane by lane on the CPU with a model
//                      of the WMMA instruction (hip_attention_emulate.h), so the gate can
//                      judge the kernel's arithmetic on a machine without an AMD GPU.
// Forward and backward (hip_attention_bwd.h). Capabilities: f16, head dims 64 and 128 (D and
// Dv independently), causal in both alignments, sliding windows, GQA; nothing else.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/device/hip_runtime.h"
#include "kernels/plugin/attest_kernel.h"
#include "kernels/plugin/examples/hip_attention.h"
#include "kernels/plugin/examples/hip_attention_bwd.h"
#include "kernels/plugin/examples/hip_attention_emulate.h"

#if defined(ATTEST_HIP_WMMA_BUNDLE)
// The device code, embedded at build time (the bundle clang++-19 wrote; see CMake).
asm(".section .rodata\n"
    ".balign 64\n"
    ".globl attest_hip_wmma_bundle\n"
    ".hidden attest_hip_wmma_bundle\n"
    "attest_hip_wmma_bundle:\n"
    ".incbin \"" ATTEST_HIP_WMMA_BUNDLE "\"\n"
    ".globl attest_hip_wmma_bundle_end\n"
    ".hidden attest_hip_wmma_bundle_end\n"
    "attest_hip_wmma_bundle_end:\n"
    ".previous\n");
extern "C" const unsigned char attest_hip_wmma_bundle[];
extern "C" const unsigned char attest_hip_wmma_bundle_end[];
#endif

namespace {

using attest::hip_example::AttentionParams;
using attest::hip_example::BackwardParams;

constexpr char kCapabilities[] =
    R"({"dtypes":["f16"],"head_dims":[64,128],"head_dims_v":[64,128],"causal":true,)"
    R"("window":true,"gqa":true,"backward":true,"deterministic":true,"profile":"f16"})";

int32_t Say(char* message, size_t size, int32_t status, const std::string& text) {
  if (message && size > 0) std::snprintf(message, size, "%s", text.c_str());
  return status;
}

// True when `json` has `key` with a value other than null, 0, false or an empty list: a
// problem feature (documents, prefix-LM, block-sparse) this kernel does not implement.
bool HasFeature(const char* json, const char* key) {
  if (!json) return false;
  const std::string quoted = std::string("\"") + key + "\"";
  const char* at = std::strstr(json, quoted.c_str());
  if (!at) return false;
  at += quoted.size();
  while (*at == ' ' || *at == ':' || *at == '\n' || *at == '\t') ++at;
  return !(std::strncmp(at, "null", 4) == 0 || std::strncmp(at, "false", 5) == 0 ||
           std::strncmp(at, "[]", 2) == 0 || (at[0] == '0' && (at[1] < '0' || at[1] > '9')));
}

// Checks one tensor's dtype, rank, shape and device; "" when it is as expected.
std::string CheckTensor(const attest_tensor& t, const char* name, int32_t dtype, int32_t ndim,
                        const int64_t* shape, int32_t device_type) {
  if (t.dtype != dtype) return std::string(name) + ": dtype " + std::to_string(t.dtype);
  if (t.ndim != ndim) return std::string(name) + ": ndim " + std::to_string(t.ndim);
  for (int d = 0; d < ndim; ++d) {
    if (t.shape[d] != shape[d]) {
      return std::string(name) + ": shape[" + std::to_string(d) + "] is " +
             std::to_string(t.shape[d]) + ", expected " + std::to_string(shape[d]);
    }
  }
  if (t.device_type != device_type) {
    return std::string(name) + ": device_type " + std::to_string(t.device_type);
  }
  return "";
}

// Validates the call and fills the kernel arguments. Returns ATTEST_OK, or
// ATTEST_UNSUPPORTED / ATTEST_ERROR with `message` written.
// The tensors both calls share (the forward's outputs are the backward's inputs).
struct Tensors {
  const attest_tensor *q, *k, *v, *o, *lse;
};

int32_t MakeParams(const attest_problem& p, const Tensors& t, int32_t device_type,
                   AttentionParams* out, char* message, size_t size) {
  if (p.dtype != ATTEST_DTYPE_F16) return Say(message, size, ATTEST_UNSUPPORTED, "dtype: f16 only");
  if (p.head_dim != 64 && p.head_dim != 128) {
    return Say(message, size, ATTEST_UNSUPPORTED, "head_dim " + std::to_string(p.head_dim));
  }
  if (p.head_dim_v != 64 && p.head_dim_v != 128) {
    return Say(message, size, ATTEST_UNSUPPORTED, "head_dim_v " + std::to_string(p.head_dim_v));
  }
  if (p.softcap != 0) return Say(message, size, ATTEST_UNSUPPORTED, "softcap");
  if (p.alibi_slopes) return Say(message, size, ATTEST_UNSUPPORTED, "alibi");
  if (p.cu_seqlens_q || p.cu_seqlens_k) return Say(message, size, ATTEST_UNSUPPORTED, "varlen");
  for (const char* feature : {"document_ids_q", "document_ids_k", "prefix_lm", "block_sparse"}) {
    if (HasFeature(p.problem_json, feature)) {
      return Say(message, size, ATTEST_UNSUPPORTED, feature);
    }
  }
  if (p.heads_kv <= 0 || p.heads_q % p.heads_kv != 0) {
    return Say(message, size, ATTEST_UNSUPPORTED,
               "heads_q " + std::to_string(p.heads_q) + " not a multiple of heads_kv " +
                   std::to_string(p.heads_kv));
  }
  const int64_t q_shape[4] = {p.batch, p.seqlen_q, p.heads_q, p.head_dim};
  const int64_t k_shape[4] = {p.batch, p.seqlen_k, p.heads_kv, p.head_dim};
  const int64_t v_shape[4] = {p.batch, p.seqlen_k, p.heads_kv, p.head_dim_v};
  const int64_t o_shape[4] = {p.batch, p.seqlen_q, p.heads_q, p.head_dim_v};
  const int64_t lse_shape[3] = {p.batch, p.heads_q, p.seqlen_q};
  for (const std::string& bad :
       {CheckTensor(*t.q, "q", ATTEST_DTYPE_F16, 4, q_shape, device_type),
        CheckTensor(*t.k, "k", ATTEST_DTYPE_F16, 4, k_shape, device_type),
        CheckTensor(*t.v, "v", ATTEST_DTYPE_F16, 4, v_shape, device_type),
        CheckTensor(*t.o, "o", ATTEST_DTYPE_F16, 4, o_shape, device_type),
        CheckTensor(*t.lse, "lse", ATTEST_DTYPE_F32, 3, lse_shape, device_type)}) {
    if (!bad.empty()) return Say(message, size, ATTEST_ERROR, "tensor " + bad);
  }
  AttentionParams& k = *out;
  k = AttentionParams{};
  k.q = static_cast<const _Float16*>(t.q->data);
  k.k = static_cast<const _Float16*>(t.k->data);
  k.v = static_cast<const _Float16*>(t.v->data);
  k.o = static_cast<_Float16*>(t.o->data);
  k.lse = static_cast<float*>(t.lse->data);
  for (int d = 0; d < 4; ++d) {
    k.q_stride[d] = t.q->strides[d];
    k.k_stride[d] = t.k->strides[d];
    k.v_stride[d] = t.v->strides[d];
    k.o_stride[d] = t.o->strides[d];
  }
  for (int d = 0; d < 3; ++d) k.lse_stride[d] = t.lse->strides[d];
  k.batch = p.batch;
  k.heads_q = p.heads_q;
  k.heads_kv = p.heads_kv;
  k.seqlen_q = p.seqlen_q;
  k.seqlen_k = p.seqlen_k;
  k.window_left = p.window_left;
  // Causal is the window (L, 0) (docs/design.md; reference/problem/mask.cc).
  k.window_right = p.causal ? (p.window_right < 0 ? 0 : std::min<int64_t>(p.window_right, 0))
                            : p.window_right;
  k.diag_offset = p.causal_top_left ? 0 : p.seqlen_k - p.seqlen_q;
  // scale * log2(e) in float: the kernel's scores live in log2 units.
  k.scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  return ATTEST_OK;
}

int32_t MakeForwardParams(const attest_forward_args* args, int32_t device_type,
                          AttentionParams* out, char* message, size_t size) {
  if (!args || args->struct_size < sizeof(attest_forward_args) || !args->problem) {
    return Say(message, size, ATTEST_ERROR, "forward args: missing or too small");
  }
  return MakeParams(*args->problem, {&args->q, &args->k, &args->v, &args->o, &args->lse},
                    device_type, out, message, size);
}

int32_t MakeBackwardParams(const attest_backward_args* args, int32_t device_type,
                           BackwardParams* out, char* message, size_t size) {
  if (!args || args->struct_size < sizeof(attest_backward_args) || !args->problem) {
    return Say(message, size, ATTEST_ERROR, "backward args: missing or too small");
  }
  *out = BackwardParams{};
  const int32_t s = MakeParams(*args->problem, {&args->q, &args->k, &args->v, &args->o, &args->lse},
                               device_type, &out->fwd, message, size);
  if (s != ATTEST_OK) return s;
  // dout has o's shape, the gradients their inputs' shapes.
  for (const auto& [t, like, name] :
       {std::tuple{&args->dout, &args->o, "dout"}, std::tuple{&args->dq, &args->q, "dq"},
        std::tuple{&args->dk, &args->k, "dk"}, std::tuple{&args->dv, &args->v, "dv"}}) {
    const std::string bad = CheckTensor(*t, name, ATTEST_DTYPE_F16, 4, like->shape, device_type);
    if (!bad.empty()) return Say(message, size, ATTEST_ERROR, "tensor " + bad);
  }
  out->dout = static_cast<const _Float16*>(args->dout.data);
  out->dq = static_cast<_Float16*>(args->dq.data);
  out->dk = static_cast<_Float16*>(args->dk.data);
  out->dv = static_cast<_Float16*>(args->dv.data);
  for (int d = 0; d < 4; ++d) {
    out->do_stride[d] = args->dout.strides[d];
    out->dq_stride[d] = args->dq.strides[d];
    out->dk_stride[d] = args->dk.strides[d];
    out->dv_stride[d] = args->dv.strides[d];
  }
  out->scale = static_cast<float>(args->problem->scale);
  return ATTEST_OK;
}

int KernelIndex(int64_t d, int64_t dv) { return (d == 128 ? 2 : 0) + (dv == 128 ? 1 : 0); }

// Per KernelIndex: forward, then backward dQ, then backward dK/dV.
constexpr int kForward = 0, kBackwardDq = 4, kBackwardDkDv = 8, kNumFunctions = 12;
constexpr const char* kKernelNames[kNumFunctions] = {
    "attest_hip_wmma_fwd_d64_dv64",       "attest_hip_wmma_fwd_d64_dv128",
    "attest_hip_wmma_fwd_d128_dv64",      "attest_hip_wmma_fwd_d128_dv128",
    "attest_hip_wmma_bwd_dq_d64_dv64",    "attest_hip_wmma_bwd_dq_d64_dv128",
    "attest_hip_wmma_bwd_dq_d128_dv64",   "attest_hip_wmma_bwd_dq_d128_dv128",
    "attest_hip_wmma_bwd_dkdv_d64_dv64",  "attest_hip_wmma_bwd_dkdv_d64_dv128",
    "attest_hip_wmma_bwd_dkdv_d128_dv64", "attest_hip_wmma_bwd_dkdv_d128_dv128"};

// The loaded device code: built once per process on the first device call.
struct DeviceCode {
  std::shared_ptr<const attest::HipApi> api;
  void* module = nullptr;
  void* functions[kNumFunctions] = {};
  std::string failure;  // why there is no device code, for every call
};

const DeviceCode& LoadDeviceCode() {
  static DeviceCode code;
  static std::once_flag once;
  std::call_once(once, [] {
#if !defined(ATTEST_HIP_WMMA_BUNDLE)
    code.failure = "this build of the plugin has no device code (clang++-19 was not found)";
#else
    auto api = attest::HipApi::Load();
    if (!api) {
      code.failure = api.error().message;
      return;
    }
    const attest::HipApi& hip = **api;
    int count = 0;
    if (int e = hip.get_device_count(&count); e != attest::kHipSuccess || count == 0) {
      code.failure = "no HIP device: hipGetDeviceCount returned " +
                     (e != attest::kHipSuccess ? hip.Describe(e) : std::string("0 devices"));
      return;
    }
    if (int e = hip.module_load_data(&code.module, attest_hip_wmma_bundle); e != attest::kHipSuccess) {
      code.failure = "hipModuleLoadData (gfx1100/gfx1151 bundle of " +
                     std::to_string(attest_hip_wmma_bundle_end - attest_hip_wmma_bundle) +
                     " bytes) returned " + hip.Describe(e);
      return;
    }
    for (int i = 0; i < kNumFunctions; ++i) {
      if (int e = hip.module_get_function(&code.functions[i], code.module, kKernelNames[i]);
          e != attest::kHipSuccess) {
        code.failure = std::string("hipModuleGetFunction(") + kKernelNames[i] + ") returned " +
                       hip.Describe(e);
        return;
      }
    }
    code.api = *api;
#endif
  });
  return code;
}

// Launches kernel `which` on a (x, y, z) grid of one-wave blocks with `params` as its only
// argument. ATTEST_OK for an empty grid (HIP refuses zero-sized grids; nothing to write).
template <class Params>
int32_t Launch(const DeviceCode& code, int which, int64_t x, int64_t y, int64_t z,
               Params* params, void* stream, char* message, size_t size) {
  if (x == 0 || y == 0 || z == 0) return ATTEST_OK;
  if (x > 0x7fffffff || y > 65535 || z > 65535) {
    return Say(message, size, ATTEST_UNSUPPORTED, "grid too large for one launch");
  }
  void* kernel_args[] = {params};
  if (int e = code.api->module_launch_kernel(
          code.functions[which], static_cast<unsigned>(x), static_cast<unsigned>(y),
          static_cast<unsigned>(z), attest::wmma::kWave, 1, 1, /*sharedMemBytes=*/0, stream,
          kernel_args, nullptr);
      e != attest::kHipSuccess) {
    return Say(message, size, ATTEST_ERROR,
               std::string("hipModuleLaunchKernel(") + kKernelNames[which] + ") returned " +
                   code.api->Describe(e));
  }
  return ATTEST_OK;  // attest's adapter synchronises and reports asynchronous faults
}

int64_t Tiles(int64_t n) { return (n + attest::wmma::kTile - 1) / attest::wmma::kTile; }

int32_t ForwardDevice(void*, const attest_forward_args* args, char* message, size_t size) {
  AttentionParams params;
  if (int32_t s = MakeForwardParams(args, ATTEST_DEVICE_HIP, &params, message, size);
      s != ATTEST_OK) {
    return s;
  }
  const DeviceCode& code = LoadDeviceCode();
  if (!code.failure.empty()) return Say(message, size, ATTEST_ERROR, code.failure);
  const int which = kForward + KernelIndex(args->problem->head_dim, args->problem->head_dim_v);
  return Launch(code, which, Tiles(params.seqlen_q), params.heads_q, params.batch, &params,
                args->stream, message, size);
}

int32_t BackwardDevice(void*, const attest_backward_args* args, char* message, size_t size) {
  BackwardParams params;
  if (int32_t s = MakeBackwardParams(args, ATTEST_DEVICE_HIP, &params, message, size);
      s != ATTEST_OK) {
    return s;
  }
  const DeviceCode& code = LoadDeviceCode();
  if (!code.failure.empty()) return Say(message, size, ATTEST_ERROR, code.failure);
  const int index = KernelIndex(args->problem->head_dim, args->problem->head_dim_v);
  const AttentionParams& f = params.fwd;
  // Two launches on one stream: dQ, then dK/dV; they write disjoint outputs.
  if (int32_t s = Launch(code, kBackwardDq + index, Tiles(f.seqlen_q), f.heads_q, f.batch,
                         &params, args->stream, message, size);
      s != ATTEST_OK) {
    return s;
  }
  return Launch(code, kBackwardDkDv + index, Tiles(f.seqlen_k), f.heads_kv, f.batch, &params,
                args->stream, message, size);
}

int32_t ForwardEmulated(void*, const attest_forward_args* args, char* message, size_t size) {
  AttentionParams params;
  if (int32_t s = MakeForwardParams(args, ATTEST_DEVICE_HOST, &params, message, size);
      s != ATTEST_OK) {
    return s;
  }
  using attest::hip_example::EmulateForward;
  std::string why;
  bool ok = false;
  switch (KernelIndex(args->problem->head_dim, args->problem->head_dim_v)) {
    case 0: ok = EmulateForward<64, 64>(params, &why); break;
    case 1: ok = EmulateForward<64, 128>(params, &why); break;
    case 2: ok = EmulateForward<128, 64>(params, &why); break;
    default: ok = EmulateForward<128, 128>(params, &why); break;
  }
  if (!ok) return Say(message, size, ATTEST_ERROR, "WMMA emulation: " + why);
  return ATTEST_OK;
}

int32_t BackwardEmulated(void*, const attest_backward_args* args, char* message, size_t size) {
  BackwardParams params;
  if (int32_t s = MakeBackwardParams(args, ATTEST_DEVICE_HOST, &params, message, size);
      s != ATTEST_OK) {
    return s;
  }
  using attest::hip_example::EmulateBackward;
  std::string why;
  bool ok = false;
  switch (KernelIndex(args->problem->head_dim, args->problem->head_dim_v)) {
    case 0: ok = EmulateBackward<64, 64>(params, &why); break;
    case 1: ok = EmulateBackward<64, 128>(params, &why); break;
    case 2: ok = EmulateBackward<128, 64>(params, &why); break;
    default: ok = EmulateBackward<128, 128>(params, &why); break;
  }
  if (!ok) return Say(message, size, ATTEST_ERROR, "WMMA emulation: " + why);
  return ATTEST_OK;
}

const attest_kernel_desc kKernels[] = {
    {ATTEST_KERNEL_ABI_VERSION, sizeof(attest_kernel_desc), "wmma-f16", kCapabilities,
     ATTEST_DEVICE_HIP, 0, &ForwardDevice, &BackwardDevice, nullptr},
    {ATTEST_KERNEL_ABI_VERSION, sizeof(attest_kernel_desc), "wmma-f16-emulated", kCapabilities,
     ATTEST_DEVICE_HOST, 0, &ForwardEmulated, &BackwardEmulated, nullptr},
};

}  // namespace

extern "C" {

ATTEST_KERNEL_EXPORT uint32_t attest_kernel_abi_version(void) {
  return ATTEST_KERNEL_ABI_VERSION;
}

ATTEST_KERNEL_EXPORT int32_t attest_kernel_count(void) {
  return static_cast<int32_t>(sizeof(kKernels) / sizeof(kKernels[0]));
}

ATTEST_KERNEL_EXPORT const attest_kernel_desc* attest_kernel_get(int32_t index) {
  if (index < 0 || index >= attest_kernel_count()) return nullptr;
  return &kKernels[index];
}

}  // extern "C"
