// The learnable relative-bias rows of the mutant catalogue (mutants.h RelBiasFault;
// docs/kernels.md "Mutants"): wrappers around the parent's relative-bias entry points
// (Kernel::ForwardRelBias / BackwardRelBias) that read or return the bias where a buggy kernel
// does. The other entry points are the parent's, untouched.
#include <functional>
#include <map>

#include "kernels/mutants/mutants.h"
#include "reference/formats/format.h"
#include "reference/problem/mask.h"

namespace attest {
namespace {

// `t` (any float dtype) with f(flat index, value) applied to every element, in t's dtype.
Tensor MapValues(const Tensor& t, const std::function<double(size_t, double)>& f) {
  Tensor w = ToF64(t).Clone();
  auto s = w.span<double>();
  for (size_t e = 0; e < s.size(); ++e) s[e] = f(e, s[e]);
  Expected<Tensor> converted = Convert(w, FormatOf(t.dtype()).value_or(Format::kF32));
  return converted.ok() ? std::move(converted).value() : w;
}

// The table a kernel reads for sequence-local (i, j) when it indexes with packed positions:
// element d + shift, shift = q_begin - k_begin (0 past the table's edge).
Tensor Shifted(const Problem& p, const Tensor& rel_bias, int64_t shift) {
  const Tensor w = ToF64(rel_bias);
  const auto src = w.span<const double>();
  const int64_t W = p.RelBiasWidth();
  return MapValues(rel_bias, [&](size_t e, double) {
    const int64_t d = static_cast<int64_t>(e) % W + shift;
    return d >= 0 && d < W ? src[e + static_cast<size_t>(shift)] : 0.0;
  });
}

constexpr std::string_view kParent = "cpu/flash2-bf16";

Problem BiasCase(bool varlen) {
  Problem p;
  p.heads_q = 8;
  p.heads_kv = 2;
  p.head_dim = p.head_dim_v = 64;
  p.dtype = DType::kBF16;
  p.causal = true;
  p.rel_bias = true;
  if (varlen) {  // sequences whose q and k start at different packed offsets
    p.batch = 3;
    p.heads_q = p.heads_kv = 2;
    p.cu_seqlens_q = std::vector<int32_t>{0, 65, 66, 86};
    p.cu_seqlens_k = std::vector<int32_t>{0, 40, 169, 189};
    p.seqlen_q = 65;
    p.seqlen_k = 129;
  } else {
    p.batch = 2;
    p.seqlen_q = p.seqlen_k = 96;
  }
  return p;
}

GeneratorSpec DrawnTable(uint64_t seed) {
  return GeneratorSpec{"gaussian", seed, {{"rel_bias", {{"std", 2.0}}}}};
}

}  // namespace

void AddRelBiasMutants(std::vector<MutantSpec>& rows) {
  const auto add = [&](MutantSpec s) { rows.push_back(std::move(s)); };
  add({.name = "drel-bias-diagonal-off-by-one",
       .parent = kParent,
       .parent_recipe = "bf16",
       .bug = "the relative bias's gradient summed over the wrong diagonal: element d holds "
              "diagonal d + 1's sum (an off-by-one in the gradient's index)",
       .change = "wrapper: drel_bias[h, d] = parent drel_bias[h, d + 1], the last 0",
       .bug_class = "accuracy",
       .rel_bias_fault = RelBiasFault::kDiagonalOffByOne,
       .problem = BiasCase(false),
       .generator = DrawnTable(150),
       .differs = {"drel_bias"}});
  add({.name = "drel-bias-zero",
       .parent = kParent,
       .parent_recipe = "bf16",
       .bug = "the relative bias's gradient returned as zeros (not written back)",
       .change = "wrapper: drel_bias = 0",
       .bug_class = "accuracy",
       .rel_bias_fault = RelBiasFault::kDrelZero,
       .problem = BiasCase(false),
       .generator = DrawnTable(151),
       .differs = {"drel_bias"}});
  add({.name = "rel-bias-global-positions",
       .parent = kParent,
       .parent_recipe = "bf16",
       .bug = "the relative bias indexed with packed (global) token positions instead of "
              "sequence-local ones: sequence b reads element d + q_begin - k_begin (0 past the "
              "table's edge)",
       .change = "wrapper: each sequence's forward rows from the parent with the table shifted "
                 "by q_begin - k_begin; the backward is the parent's",
       .bug_class = "accuracy",
       .rel_bias_fault = RelBiasFault::kGlobalPositions,
       .problem = BiasCase(true),
       .generator = DrawnTable(152),
       .differs = {"o", "lse", "dq", "dk", "dv", "drel_bias"}});
}

KernelAnswer<ForwardResult> MutantKernel::ForwardRelBias(const Problem& p, const Tensor& q,
                                                         const Tensor& k, const Tensor& v,
                                                         const Tensor& rel_bias,
                                                         const Tensor& sink) {
  route_ = "mutant forward, rel_bias";
  std::string why;
  if (!caps_.Covers(p, &why)) return Unsupported{name() + ": " + why};
  KernelAnswer<ForwardResult> out = parent_->ForwardRelBias(p, q, k, v, rel_bias, sink);
  auto* r = std::get_if<ForwardResult>(&out);
  if (r == nullptr || spec_->rel_bias_fault != RelBiasFault::kGlobalPositions) return out;
  // Each sequence's rows from the parent's call with that sequence's shifted table.
  std::map<int64_t, ForwardResult> runs;
  std::vector<int64_t> shift_of_token(static_cast<size_t>(p.TotalQ()), 0);
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence s = SequenceOf(p, b);
    const int64_t shift = s.q_begin - s.k_begin;
    for (int64_t i = 0; i < s.q_len; ++i) shift_of_token[static_cast<size_t>(s.q_begin + i)] = shift;
    if (runs.count(shift) != 0) continue;
    KernelAnswer<ForwardResult> a =
        parent_->ForwardRelBias(p, q, k, v, Shifted(p, rel_bias, shift), sink);
    auto* ar = std::get_if<ForwardResult>(&a);
    if (ar == nullptr) return a;
    runs.emplace(shift, std::move(*ar));
  }
  std::map<int64_t, Tensor> o64, lse64;
  for (const auto& [shift, run] : runs) {
    o64.emplace(shift, ToF64(run.o));
    lse64.emplace(shift, ToF64(run.lse));
  }
  const int64_t H = p.heads_q, T = p.TotalQ();
  r->o = MapValues(r->o, [&](size_t e, double) {
    const int64_t t = static_cast<int64_t>(e) / (H * p.head_dim_v);
    return o64.at(shift_of_token[static_cast<size_t>(t)]).span<const double>()[e];
  });
  r->lse = MapValues(r->lse, [&](size_t e, double) {
    // lse [H, total_q] packed, [B, H, Sq] padded (token b Sq + i).
    const int64_t x = static_cast<int64_t>(e);
    const int64_t t = p.varlen() ? x % T : (x / (H * p.seqlen_q)) * p.seqlen_q + x % p.seqlen_q;
    return lse64.at(shift_of_token[static_cast<size_t>(t)]).span<const double>()[e];
  });
  return out;
}

KernelAnswer<BackwardResult> MutantKernel::BackwardRelBias(
    const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
    const Tensor& lse, const Tensor& dout, const Tensor& rel_bias, const Tensor& sink) {
  route_ = "mutant backward, rel_bias";
  std::string why;
  if (!caps_.Covers(p, &why)) return Unsupported{name() + ": " + why};
  KernelAnswer<BackwardResult> out =
      parent_->BackwardRelBias(p, q, k, v, o, lse, dout, rel_bias, sink);
  auto* r = std::get_if<BackwardResult>(&out);
  if (r == nullptr || !r->drel_bias.defined()) return out;
  if (spec_->rel_bias_fault == RelBiasFault::kDrelZero) {
    r->drel_bias = MapValues(r->drel_bias, [](size_t, double) { return 0.0; });
  } else if (spec_->rel_bias_fault == RelBiasFault::kDiagonalOffByOne) {
    const Tensor w = ToF64(r->drel_bias);
    const auto src = w.span<const double>();
    const int64_t W = p.RelBiasWidth();
    r->drel_bias = MapValues(r->drel_bias, [&](size_t e, double) {
      return static_cast<int64_t>(e) % W + 1 < W ? src[e + 1] : 0.0;
    });
  }
  return out;
}

}  // namespace attest
