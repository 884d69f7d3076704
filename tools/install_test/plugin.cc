// A kernel repository's plugin, built against the installed package with attest_add_plugin
// (<attest/attest_kernel.h>): float32 attention forward, computed in double and rounded
// once, with bottom-right and top-left causal masks, GQA and packed variable length. It
// refuses every other feature. -DCONSUMER_PLUGIN_BROKEN scales the scores by 1.25 (a kernel
// that applies its own scale on top of the one it is given), which attest must catch.
#include <attest/attest_kernel.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

namespace {

int32_t Refuse(char* message, size_t size, const char* why) {
  std::snprintf(message, size, "%s", why);
  return ATTEST_UNSUPPORTED;
}

// Element (a, b, c) of a 3-d view or (x, a, b, c) of a 4-d one.
float* At(const attest_tensor& t, int64_t x, int64_t a, int64_t b, int64_t c) {
  const int64_t* s = t.strides;
  const int64_t off = t.ndim == 4 ? x * s[0] + a * s[1] + b * s[2] + c * s[3]
                                  : a * s[0] + b * s[1] + c * s[2];
  return static_cast<float*>(t.data) + off;
}

int32_t Forward(void*, const attest_forward_args* args, char* message, size_t size) {
  const attest_problem& p = *args->problem;
  if (p.dtype != ATTEST_DTYPE_F32) return Refuse(message, size, "dtype: f32 only");
  if (p.window_left >= 0 || p.window_right >= 0) return Refuse(message, size, "window");
  if (p.softcap > 0) return Refuse(message, size, "softcap");
  if (p.alibi_slopes != nullptr) return Refuse(message, size, "alibi");
  for (const char* key : {"document_ids_q", "prefix_lm", "block_sparse"}) {
    if (std::strstr(p.problem_json, key) != nullptr) return Refuse(message, size, key);
  }
#ifdef CONSUMER_PLUGIN_BROKEN
  const double scale = p.scale * 1.25;
#else
  const double scale = p.scale;
#endif
  const bool packed = p.cu_seqlens_q != nullptr;
  const int64_t group = p.heads_q / p.heads_kv;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t q0 = packed ? p.cu_seqlens_q[b] : 0, k0 = packed ? p.cu_seqlens_k[b] : 0;
    const int64_t sq = packed ? p.cu_seqlens_q[b + 1] - q0 : p.seqlen_q;
    const int64_t sk = packed ? p.cu_seqlens_k[b + 1] - k0 : p.seqlen_k;
    const int64_t x = packed ? 0 : b;  // the batch index of 4-d views
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < sq; ++i) {
        // Query i sees key j iff j <= i + offset (bottom-right: offset Sk - Sq).
        const int64_t last = !p.causal ? sk - 1 : i + (p.causal_top_left ? 0 : sk - sq);
        std::vector<double> s;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < sk && j <= last; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < p.head_dim; ++d) {
            dot += double(*At(args->q, x, q0 + i, h, d)) * *At(args->k, x, k0 + j, g, d);
          }
          s.push_back(scale * dot);
          m = std::max(m, s.back());
        }
        double l = 0;
        for (double& e : s) l += (e = std::exp(e - m));
        float* lse = args->lse.ndim == 3 ? static_cast<float*>(args->lse.data) +
                                               b * args->lse.strides[0] +
                                               h * args->lse.strides[1] + i * args->lse.strides[2]
                                         : static_cast<float*>(args->lse.data) +
                                               h * args->lse.strides[0] +
                                               (q0 + i) * args->lse.strides[1];
        *lse = s.empty() ? -std::numeric_limits<float>::infinity() : float(m + std::log(l));
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          double o = 0;
          for (size_t j = 0; j < s.size(); ++j) {
            o += s[j] / l * *At(args->v, x, k0 + int64_t(j), g, d);
          }
          *At(args->o, x, q0 + i, h, d) = float(o);  // an empty row: o = 0
        }
      }
    }
  }
  return ATTEST_OK;
}

attest_kernel_desc g_desc;

}  // namespace

extern "C" {

ATTEST_KERNEL_EXPORT uint32_t attest_kernel_abi_version(void) { return ATTEST_KERNEL_ABI_VERSION; }
ATTEST_KERNEL_EXPORT int32_t attest_kernel_count(void) { return 1; }
ATTEST_KERNEL_EXPORT const attest_kernel_desc* attest_kernel_get(int32_t index) {
  if (index != 0) return nullptr;
  g_desc.abi_version = ATTEST_KERNEL_ABI_VERSION;
  g_desc.struct_size = sizeof(attest_kernel_desc);
  g_desc.name = "consumer-f32";
  g_desc.capabilities_json =
      R"({"dtypes":["f32"],"causal":true,"gqa":true,"varlen":true,"deterministic":true,)"
      R"("profile":"f32"})";
  g_desc.device_type = ATTEST_DEVICE_HOST;
  g_desc.forward = Forward;
  g_desc.backward = nullptr;
  g_desc.self = nullptr;
  return &g_desc;
}

}  // extern "C"
