// The Kernel interface: what attest tests. A kernel has a name, declares Capabilities, and
// runs forward and backward on host tensors; a call may answer Unsupported{reason} but must
// never be silently wrong. Names: `cpu/<name>` built-in models, `mutant/<name>` seeded bugs,
// `plugin:<path.so>[:<name>]` C ABI plugins, `exec:<command line>` external workers.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kernels/shape_limits.h"
#include "reference/formats/format.h"
#include "reference/problem/problem.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

// What a kernel claims to support. An empty list means any value; a false flag means the
// kernel may answer Unsupported for that feature. The JSON form is the `capabilities`
// object of the exec protocol (docs/design.md "External kernels").
struct Capabilities {
  std::vector<DType> dtypes;
  std::vector<int64_t> head_dims;
  std::vector<int64_t> head_dims_v;
  bool causal = false;
  bool window = false;
  bool softcap = false;
  bool alibi = false;
  bool varlen = false;
  bool gqa = false;
  bool documents = false;     // per-token document ids
  bool prefix_lm = false;
  bool block_sparse = false;
  bool backward = false;
  bool deterministic = false;  // repeat runs are bitwise equal
  // Learnable sink (Problem::sink; docs/semantics.md "Learnable sink"): the kernel takes the
  // sink [Hq] through Kernel::ForwardSink and returns dsink from Kernel::BackwardSink. A kernel
  // that does not claim it never sees a problem with a sink (Covers). JSON key "sink", written
  // only when true.
  bool sink = false;
  // Learnable relative bias (Problem::rel_bias; docs/semantics.md "Learnable relative bias"):
  // the kernel takes rel_bias [Hq, Sq + Sk - 1] through Kernel::ForwardRelBias and returns
  // drel_bias from Kernel::BackwardRelBias. JSON key "rel_bias", written only when true.
  bool rel_bias = false;
  // Paged KV (Problem::page_size: k, v a page pool read through Problem::page_table) and
  // seqused (Problem::seqused_q / seqused_k); docs/semantics.md "Paged KV and seqused". A kernel
  // that does not claim them never sees such a problem. JSON keys "paged", "seqused", written
  // only when true.
  bool paged = false;
  bool seqused = false;
  // The forward returns lse. A kernel whose public API returns the output alone (PyTorch's
  // F.scaled_dot_product_attention) declares false: ForwardResult::lse is then left undefined,
  // its Backward receives an undefined lse, and checks judge o and the gradients only. An
  // adapter never computes lse for such a kernel (that would be the kernel's work done by
  // attest). JSON key "lse"; unlike the flags above, a missing key means true.
  bool lse = true;
  std::string profile;         // tolerance profile name (verify/), e.g. "bf16"
  std::string recipe;          // low-precision recipe name (reference/recipes), or ""
  // What lse holds for an empty row (no visible key): "-inf", the mathematical value (the
  // default), or "+inf", which docs/design.md "Semantics" lets a kernel declare (FlashAttention
  // writes +inf so that the backward's exp(s - lse) is 0 without a guard). Nothing else is
  // acceptable. JSON key "empty_row_lse".
  std::string empty_row_lse = "-inf";
  // The largest absolute error of the kernel's tanh where softcap applies
  // (s -> softcap * tanh(s / softcap)), for a kernel that computes it with an approximation;
  // 0 (the default, not written): an fp32 tanh within a few ulps, which the profile's
  // same-precision baseline already carries. The accuracy check widens the lse bound of a
  // softcap problem by softcap * this and o's by twice that times max |v| (lse moves by at most
  // the largest score error; Σ_j |dP_ij| by at most twice it). Declared from an exhaustive
  // measurement: PTX tanh.approx.f32 (what CuTe DSL's `cute.math.tanh(fastmath=True)` emits) on
  // an H200 errs by at most 7.98e-6 (tools/device/tanh_error.py,
  // docs/gpu-results/tanh/h200-tanh-error.json). JSON key "softcap_tanh_abs_error", in [0, 0.01].
  double softcap_tanh_abs_error = 0;
  // Restrictions of kernels whose API cannot express a problem (both default false, JSON keys
  // of the same names, written only when set): `same_head_dim_v`, Dv must equal D
  // (FlashAttention-2's and PyTorch's flash entry points take one head dim); and
  // `causal_bottom_right_only`, a diagonal rule (causal, window, ALiBi) only with the
  // bottom-right alignment, or where both alignments agree because every sequence has
  // q_len == k_len (FlashAttention's `causal` and `window_size` are bottom-right); and
  // `causal_top_left_only`, the mirror: the diagonal rules only top-left where some sequence
  // has q_len != k_len (PyTorch SDPA's `is_causal` as documented, the only causal form its
  // nested jagged tensors take: torch/nested/_internal/sdpa.py).
  bool same_head_dim_v = false;
  bool causal_bottom_right_only = false;
  bool causal_top_left_only = false;
  // Where the kernel's tensors live while it runs: "host" (the default, not written), "cuda"
  // or "hip". A plugin's comes from its descriptor's device_type; an exec worker declares it
  // (JSON key "device"). It never changes what is judged: `attest check --oracle-device auto`
  // runs the float64 oracle on the GPU for a "cuda" kernel when the CUDA oracle
  // (reference/oracle/cuda/oracle_cuda_host.h) and a GPU are there.
  std::string device = "host";
  // Shape limits (kernels/shape_limits.h; JSON object "shapes", written only when a limit is
  // set): lengths a multiple of a block, Sq = Sk, maxima. A problem outside them is outside the
  // capabilities; suites move their rows inside them (run/suite.h Instantiate).
  ShapeLimits shapes;
  // The input layouts the kernel's interface takes (verify/checks/layouts.h): "contiguous"
  // (the default, not written: a C ABI plugin's packed buffers), "inner" (any strides with
  // the last dimension contiguous: FlashAttention's and PyTorch's fused SDPA backends) or
  // "any" (PyTorch's math backend, the CPU models). JSON key "strides". An exec worker that
  // declares "inner" or "any" receives views (docs/protocol.md "Views").
  std::string strides = "contiguous";
  // The forms in which the kernel's API takes a mask as a tensor (Problem::mask_form; JSON
  // "mask_forms", written only when not empty): PyTorch SDPA's attn_mask takes "bool",
  // "additive" (input dtype) and "additive_f32". Empty: masks are the API's own arguments
  // (is_causal, window_size, a mask_mod), and rows that name a form do not apply.
  std::vector<std::string> mask_forms;
  // The split-KV counts the kernel's API accepts (Problem::num_splits; FlashAttention's
  // `num_splits`; JSON "num_splits", written only when not empty), each in [1, 1024]. Empty:
  // the kernel chooses its own split, and a problem that names a count is outside the
  // capabilities. Suites run the split rows once per declared count, each judged by the same
  // checks, and the `splits-agree` check relates the counts' outputs (docs/checks.md).
  std::vector<int64_t> num_splits;

  // Whether `p` lies inside these capabilities; if not, `why` says which feature.
  bool Covers(const Problem& p, std::string* why = nullptr) const;
};

// The lse an empty row must hold under `caps`: -inf, or +inf when declared.
double EmptyRowLse(const Capabilities& caps);

nlohmann::json CapabilitiesToJson(const Capabilities& caps);
Expected<Capabilities> CapabilitiesFromJson(const nlohmann::json& j);

// The byte a harness fills every output buffer with before a kernel call (docs/design.md "Checks":
// unwritten outputs are found through NaN-poisoned buffers; the CUDA and HIP adapters memset
// 0xFF, and a model that simulates an unwritten tile starts from the same bytes). All-ones is
// a NaN in every float dtype attest reads (f64, f32, bf16, f16, e4m3fn, e5m2) whose payload
// arithmetic does not produce: a NaN computed from finite inputs is the platform's default
// NaN (x86 0xFFC00000, Arm 0x7FC00000, CUDA 0x7FFFFFFF) and conversions keep or canonicalise
// it, so an element still holding all ones was never written.
inline constexpr unsigned char kOutputPoisonByte = 0xFF;
// Whether element `flat` (row-major) of `t` holds the poison in its own dtype.
bool IsOutputPoison(const Tensor& t, int64_t flat);
// A float32 holding the poison's bits (for models that simulate an unwritten output).
float OutputPoisonF32();

// The tensor in the problem's input dtype, as an adapter hands it to a kernel (attest passes
// kernels the dtype-rounded values, possibly held in f64, e.g. dO; the conversion is then
// exact): the exec protocol's worker and the Python package's in-process kernel receive q,
// k, v and dO in `dtype`. `name` names the tensor in the error.
Expected<Tensor> InInputDType(const Tensor& t, DType dtype, std::string_view name);

struct Unsupported {
  std::string reason;
};

struct ForwardResult {
  Tensor o;    // [B, Sq, Hq, Dv] (packed: [total_q, Hq, Dv]), any float dtype
  Tensor lse;  // [B, Hq, Sq] (packed: [Hq, total_q]), natural log; undefined when the
               // kernel declares Capabilities::lse = false
};

struct BackwardResult {
  Tensor dq, dk, dv;
  Tensor dsink;  // [Hq], any float dtype: from Kernel::BackwardSink only (Problem::sink)
  // [Hq, Sq + Sk - 1], any float dtype: from Kernel::BackwardRelBias only (Problem::rel_bias)
  Tensor drel_bias;
};

// A kernel call's answer: outputs, an honest refusal, or an error (a finding: crash,
// device error, protocol violation).
template <class T>
using KernelAnswer = std::variant<T, Unsupported, Error>;

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual std::string name() const = 0;
  virtual Capabilities capabilities() const = 0;
  // Inputs are the problem's dtype-rounded values (dtype as the problem says).
  virtual KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q,
                                              const Tensor& k, const Tensor& v) = 0;
  // `o` and `lse` are what this kernel's Forward returned for the same inputs (`lse`
  // undefined for a kernel that declares Capabilities::lse = false).
  virtual KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q,
                                                const Tensor& k, const Tensor& v,
                                                const Tensor& o, const Tensor& lse,
                                                const Tensor& dout) = 0;
  // The same calls for a problem with a learnable sink (Problem::sink, Capabilities::sink):
  // `sink` is [Hq] f64 holding float32 values (finite, or -inf for none in that head), and
  // BackwardResult::dsink [Hq] must be set. The plain Forward / Backward are never called with
  // a sink problem by attest. Defaults: Unsupported (kernels that do not claim sinks).
  virtual KernelAnswer<ForwardResult> ForwardSink(const Problem& p, const Tensor& q,
                                                  const Tensor& k, const Tensor& v,
                                                  const Tensor& sink);
  virtual KernelAnswer<BackwardResult> BackwardSink(const Problem& p, const Tensor& q,
                                                    const Tensor& k, const Tensor& v,
                                                    const Tensor& o, const Tensor& lse,
                                                    const Tensor& dout, const Tensor& sink);
  // The same calls for a problem with a learnable relative bias (Problem::rel_bias,
  // Capabilities::rel_bias): `rel_bias` [Hq, Sq + Sk - 1] f64 holding float32 values, `sink`
  // the sink when the problem also has one (else an undefined tensor); dsink (with a sink)
  // and drel_bias must be set. Defaults: Unsupported.
  virtual KernelAnswer<ForwardResult> ForwardRelBias(const Problem& p, const Tensor& q,
                                                     const Tensor& k, const Tensor& v,
                                                     const Tensor& rel_bias, const Tensor& sink);
  virtual KernelAnswer<BackwardResult> BackwardRelBias(const Problem& p, const Tensor& q,
                                                       const Tensor& k, const Tensor& v,
                                                       const Tensor& o, const Tensor& lse,
                                                       const Tensor& dout, const Tensor& rel_bias,
                                                       const Tensor& sink);
  // Free-form notes about the last call (e.g. which code path a hybrid kernel took).
  virtual std::string last_route() const { return {}; }
  // The format Backward rounds dP = dO·Vᵀ to on `p` before forming dS (a rounding point
  // that recipes without a `dp` do not have: e.g. an fp16-output WMMA), or nullopt when dP
  // stays in fp32. Checks that bound the backward's rounding include it; a kernel that rounds
  // dP and does not say so is judged against the tighter fp32-dP bound.
  virtual std::optional<Format> BackwardDpFormat(const Problem& p) const {
    (void)p;
    return std::nullopt;
  }
};

// Built once at start-up: built-in kernels register a factory under their name; prefixes
// (`plugin:`, `exec:`) register a factory that receives the rest of the spec.
class KernelRegistry {
 public:
  using Factory = std::function<Expected<std::unique_ptr<Kernel>>(std::string_view arg)>;

  static KernelRegistry& Global();
  void Register(std::string name, std::string description, Factory factory);
  void RegisterPrefix(std::string prefix, Factory factory);
  // Named kernels, sorted.
  std::vector<std::string> Names() const;
  std::string Description(const std::string& name) const;
  // "cpu/flash2-bf16", "plugin:/path/lib.so:name", "exec:python3 worker.py".
  Expected<std::unique_ptr<Kernel>> Create(std::string_view spec) const;

 private:
  struct Entry {
    std::string description;
    Factory factory;
  };
  std::map<std::string, Entry, std::less<>> named_;
  std::map<std::string, Factory, std::less<>> prefixes_;
};

}  // namespace attest
