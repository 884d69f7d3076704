// The exact relation of a zero relative-bias table (see relbias_relation.h).
#include "verify/checks/relbias_relation.h"

#include <string_view>

#include <fmt/format.h>

namespace attest {

void JudgeZeroRelBias(CheckContext& ctx, std::vector<Verdict>& out) {
  constexpr std::string_view kCheck = "special-values";
  const Problem& p = ctx.case_.problem;
  if (!p.rel_bias || !ctx.inputs.rel_bias.defined()) return;
  const CaseInputs& in = ctx.inputs;
  const Tensor zero = Tensor::FromF64(
      p.RelBiasShape(), std::vector<double>(static_cast<size_t>(p.heads_q * p.RelBiasWidth())));
  Problem plain = p;
  plain.rel_bias = false;
  const KernelAnswer<ForwardResult> with = ctx.kernel->ForwardRelBias(p, in.q, in.k, in.v, zero,
                                                                      in.sink);
  const KernelAnswer<ForwardResult> without =
      p.sink ? ctx.kernel->ForwardSink(plain, in.q, in.k, in.v, in.sink)
             : ctx.kernel->Forward(plain, in.q, in.k, in.v);
  for (const auto* answer : {&with, &without}) {
    if (const auto* e = std::get_if<Error>(answer)) {
      out.push_back(KernelError(*ctx.kernel,
                                answer == &with ? "forward with a zero rel_bias (special-values)"
                                                : "forward without rel_bias (special-values)",
                                e->message));
      return;
    }
  }
  const auto* a = std::get_if<ForwardResult>(&with);
  const auto* b = std::get_if<ForwardResult>(&without);
  if (a == nullptr || b == nullptr) return;  // refused: nothing to relate
  const std::string policy = "a zero rel_bias table is bitwise the call without the bias";
  for (const char* name : {"o", "lse"}) {
    const bool is_o = std::string_view(name) == "o";
    if (!is_o && !JudgesLse(*ctx.kernel)) continue;
    const Tensor& x = is_o ? a->o : a->lse;
    const Tensor& y = is_o ? b->o : b->lse;
    const Shape shape = is_o ? p.OShape() : p.LseShape();
    if (!CheckOutputTensor(x, name, shape).ok() || !CheckOutputTensor(y, name, shape).ok()) {
      continue;  // unwritten-outputs and accuracy name a malformed output
    }
    const BitwiseDiff d = DiffBitwise(x, y);
    if (d.differing == 0) {
      out.push_back(Passing(kCheck, name, policy,
                            fmt::format("{} {} elements bitwise equal", x.numel(), name)));
      continue;
    }
    Verdict v = Failure(kCheck, name, policy,
                        fmt::format("{} {} elements differ from the call without the bias; first "
                                    "at flat {} ({} vs {})",
                                    d.differing, name, d.first, d.a, d.b));
    v.worst = LocateElement(p, name, shape, d.first);
    out.push_back(std::move(v));
  }
}

}  // namespace attest
