// The learnable-sink rows of the mutant catalogue (mutants.h SinkFault; docs/kernels.md
// "Mutants"): wrappers around the parent's sink entry points (Kernel::ForwardSink /
// BackwardSink) that apply the sink where a buggy kernel applies it. The plain entry points
// are the parent's, untouched.
#include <cmath>
#include <functional>
#include <limits>

#include "kernels/mutants/mutants.h"
#include "kernels/models/flash_engine.h"
#include "kernels/models/flash_models.h"
#include "kernels/mutants/deviations.h"
#include "reference/formats/format.h"

namespace attest {
namespace {

// `t` (any float dtype) with f(flat index, value) applied to every element, in t's dtype.
Tensor MapElements(const Tensor& t, const std::function<double(size_t, double)>& f) {
  Tensor w = ToF64(t).Clone();
  auto s = w.span<double>();
  for (size_t e = 0; e < s.size(); ++e) s[e] = f(e, s[e]);
  Expected<Tensor> converted = Convert(w, FormatOf(t.dtype()).value_or(Format::kF32));
  return converted.ok() ? std::move(converted).value() : w;
}

// The parent's answer to the same problem without its sink (what a kernel that leaves the sink
// out computes).
KernelAnswer<ForwardResult> WithoutSink(Kernel& parent, const Problem& p, const Tensor& q,
                                        const Tensor& k, const Tensor& v) {
  Problem plain = p;
  plain.sink = false;
  return parent.Forward(plain, q, k, v);
}

constexpr std::string_view kParent = "cpu/flash2-bf16";

Problem SinkCase(int64_t hq, int64_t hkv, int64_t sq, int64_t sk) {
  Problem p;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = p.head_dim_v = 64;
  p.dtype = DType::kBF16;
  p.causal = true;  // bottom-right: Sq > Sk leaves the first rows without a key
  p.sink = true;
  return p;
}

// Sinks near 2.5 weigh about a tenth of a row of 64 keys drawn N(0, 1).
GeneratorSpec DrawnSinks(uint64_t seed) {
  return GeneratorSpec{"gaussian", seed, {{"sink", {{"mean", 2.5}, {"std", 1.0}}}}};
}

}  // namespace

void AddSinkMutants(std::vector<MutantSpec>& rows) {
  const auto add = [&](MutantSpec s) { rows.push_back(std::move(s)); };
  add({.name = "sink-after-normalisation",
       .parent = kParent,
       .parent_recipe = "bf16",
       .bug = "the learnable sink added after normalisation: o divided by the keys' sum alone, "
              "lse with the sink (o too large by 1 + exp(sink - lse_keys))",
       .change = "wrapper: o from the parent's forward without the sink, lse with it",
       .bug_class = "accuracy",
       .sink_fault = SinkFault::kNotInO,
       .problem = SinkCase(4, 2, 96, 64),
       .generator = DrawnSinks(140),
       .differs = {"o", "dq", "dk", "dsink"}});
  add({.name = "sink-not-in-lse",
       .parent = kParent,
       .parent_recipe = "bf16",
       .bug = "lse without the learnable sink while o has it (the backward's P = exp(s - lse) "
              "then sums to more than 1)",
       .change = "wrapper: lse from the parent's forward without the sink where that is finite "
                 "(empty rows keep lse = sink)",
       .bug_class = "accuracy",
       .sink_fault = SinkFault::kNotInLse,
       .problem = SinkCase(4, 2, 96, 64),
       .generator = DrawnSinks(141),
       .differs = {"lse", "dq", "dk", "dv", "dsink"}});
  add({.name = "dsink-zero",
       .parent = kParent,
       .parent_recipe = "bf16",
       .bug = "the sink's gradient returned as zeros (TransformerEngine PR #3551: dsink not "
              "written back)",
       .change = "wrapper: dsink = 0",
       .bug_class = "accuracy",
       .sink_fault = SinkFault::kDsinkZero,
       .problem = SinkCase(4, 2, 96, 64),
       .generator = DrawnSinks(142),
       .differs = {"dsink"}});
  add({.name = "sink-empty-row-nan",
       .parent = kParent,
       .parent_recipe = "bf16",
       .bug = "a row with no visible key and a finite sink gives lse = NaN (flash-attention PR "
              "#2752: the log of the empty row's zero sum)",
       .change = "wrapper: lse = NaN where the row sees no key and the sink is finite",
       .bug_class = "special-values",
       .sink_fault = SinkFault::kEmptyRowNanLse,
       .problem = SinkCase(4, 2, 96, 64),
       .generator = DrawnSinks(143),
       .differs = {"lse", "dsink"}});
  add({.name = "dsink-sign",
       .parent = kParent,
       .parent_recipe = "bf16",
       .bug = "dsink with the wrong sign: +sum_i exp(sink - lse_i) D_i (the softmax backward's "
              "minus dropped)",
       .change = "wrapper: dsink negated",
       .bug_class = "accuracy",
       .sink_fault = SinkFault::kDsinkSign,
       .problem = SinkCase(4, 2, 96, 64),
       .generator = DrawnSinks(144),
       .differs = {"dsink"}});
}

void AddSplitKvSinkMutants(std::vector<MutantSpec>& rows) {
  Problem p = SinkCase(8, 2, 1, 300);  // a decode row over five 64-key tiles
  p.num_splits = 3;
  const auto add = [&](MutantSpec s) { rows.push_back(std::move(s)); };
  add({.name = "splitkv-sink-per-split",
                  .parent = kSplitKvModelName,
                  .parent_recipe = "bf16",
                  .bug = "the learnable sink folded into every split's partial sum before the "
                         "combine, so the combined denominator counts exp(sink) once per split "
                         "that saw a key (ROCm/ROCm issue 12227)",
                  .change = "hook CombineKvSplits: lse_s := log(exp(lse_s) + exp(sink)) per split",
                  .bug_class = "splits-agree",
                  .hooks = &SplitKvSinkPerSplitHooks(),
                  .sink_fault = SinkFault::kInHooks,
                  .problem = p,
                  .generator = GeneratorSpec{"gaussian", 145,
                                             {{"q", {{"std", 2.0}}},
                                              {"sink", {{"mean", 2.5}, {"std", 1.0}}}}},
                  .differs = {"o", "lse", "dq", "dk", "dv", "dsink"}});
}

KernelAnswer<ForwardResult> MutantKernel::ForwardSink(const Problem& p, const Tensor& q,
                                                      const Tensor& k, const Tensor& v,
                                                      const Tensor& sink) {
  route_ = "mutant forward, sink";
  std::string why;
  if (!caps_.Covers(p, &why)) return Unsupported{name() + ": " + why};
  if (spec_->sink_fault == SinkFault::kInHooks) {
    EngineOptions options = options_;
    options.hooks = spec_->hooks;
    options.sink = &sink;
    return FlashForward(p, MutantRecipe(*spec_), q, k, v, options);
  }
  KernelAnswer<ForwardResult> out = parent_->ForwardSink(p, q, k, v, sink);
  auto* r = std::get_if<ForwardResult>(&out);
  if (r == nullptr) return out;
  const SinkFault fault = spec_->sink_fault;
  if (fault == SinkFault::kNotInO || fault == SinkFault::kNotInLse ||
      fault == SinkFault::kEmptyRowNanLse) {
    KernelAnswer<ForwardResult> plain = WithoutSink(*parent_, p, q, k, v);
    const auto* pr = std::get_if<ForwardResult>(&plain);
    if (pr == nullptr) return plain;
    const Tensor plain_lse = ToF64(pr->lse);
    const auto pl = plain_lse.span<const double>();
    if (fault == SinkFault::kNotInO) r->o = pr->o;
    if (fault == SinkFault::kNotInLse) {
      r->lse = MapElements(r->lse, [&](size_t e, double x) {
        return std::isfinite(pl[e]) ? pl[e] : x;
      });
    }
    if (fault == SinkFault::kEmptyRowNanLse) {
      // An empty row: no key (the plain lse is -inf) while the sink made lse finite.
      r->lse = MapElements(r->lse, [&](size_t e, double x) {
        return std::isinf(pl[e]) && std::isfinite(x) ? std::numeric_limits<double>::quiet_NaN()
                                                      : x;
      });
    }
  }
  return out;
}

KernelAnswer<BackwardResult> MutantKernel::BackwardSink(const Problem& p, const Tensor& q,
                                                        const Tensor& k, const Tensor& v,
                                                        const Tensor& o, const Tensor& lse,
                                                        const Tensor& dout, const Tensor& sink) {
  route_ = "mutant backward, sink";
  std::string why;
  if (!caps_.Covers(p, &why)) return Unsupported{name() + ": " + why};
  if (spec_->sink_fault == SinkFault::kInHooks) {
    EngineOptions options = options_;
    options.hooks = spec_->hooks;
    options.sink = &sink;
    return FlashBackward(p, MutantRecipe(*spec_), q, k, v, o, lse, dout, options);
  }
  KernelAnswer<BackwardResult> out = parent_->BackwardSink(p, q, k, v, o, lse, dout, sink);
  auto* r = std::get_if<BackwardResult>(&out);
  if (r == nullptr || !r->dsink.defined()) return out;
  if (spec_->sink_fault == SinkFault::kDsinkZero) {
    r->dsink = MapElements(r->dsink, [](size_t, double) { return 0.0; });
  } else if (spec_->sink_fault == SinkFault::kDsinkSign) {
    r->dsink = MapElements(r->dsink, [](size_t, double x) { return -x; });
  }
  return out;
}

}  // namespace attest
