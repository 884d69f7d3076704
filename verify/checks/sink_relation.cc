// The exact relation of a sink of -inf (docs/semantics.md "Learnable sink": -inf means no
// sink in that head, bitwise): part of special-values (basic.h RunSpecialValues).
#include "verify/checks/sink_relation.h"

#include <cmath>
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace attest {

void JudgeMinusInfSinkHeads(CheckContext& ctx, const ForwardResult& fwd,
                            std::vector<Verdict>& out) {
  constexpr std::string_view kCheck = "special-values";
  const Problem& p = ctx.case_.problem;
  if (!p.sink || !ctx.inputs.sink.defined()) return;
  const Tensor sink = ToF64(ctx.inputs.sink);
  std::vector<int64_t> heads;
  for (int64_t h = 0; h < p.heads_q; ++h) {
    if (std::isinf(sink.at<double>({h})) && sink.at<double>({h}) < 0) heads.push_back(h);
  }
  if (heads.empty()) return;
  Problem plain = p;
  plain.sink = false;
  const CaseInputs& in = ctx.inputs;
  // With a relative bias, the call without the sink keeps the bias (kernels/kernel.h).
  const KernelAnswer<ForwardResult> answer =
      p.rel_bias ? ctx.kernel->ForwardRelBias(plain, in.q, in.k, in.v, in.rel_bias, Tensor())
                 : ctx.kernel->Forward(plain, in.q, in.k, in.v);
  if (const auto* e = std::get_if<Error>(&answer)) {
    out.push_back(KernelError(*ctx.kernel, "forward without the sink (special-values)",
                              e->message));
    return;
  }
  const auto* ref = std::get_if<ForwardResult>(&answer);
  if (ref == nullptr) return;  // the plain problem refused: nothing to relate
  const bool judge_lse = JudgesLse(*ctx.kernel);
  const std::string policy = "a head whose sink is -inf is bitwise the call without a sink";
  for (const char* name : {"o", "lse"}) {
    const bool is_o = std::string_view(name) == "o";
    if (!is_o && !judge_lse) continue;
    const Tensor& a = is_o ? fwd.o : fwd.lse;
    const Tensor& b = is_o ? ref->o : ref->lse;
    const Shape shape = is_o ? p.OShape() : p.LseShape();
    if (!CheckOutputTensor(b, name, shape).ok() || !CheckOutputTensor(a, name, shape).ok()) {
      continue;  // unwritten-outputs and accuracy name a malformed output
    }
    const Tensor wa = ToF64(a), wb = ToF64(b);
    const auto sa = wa.span<const double>(), sb = wb.span<const double>();
    int64_t checked = 0, differing = 0, first = -1;
    for (size_t e = 0; e < sa.size(); ++e) {
      // o [.., tokens, H, Dv]: head (e / Dv) % H; lse [B, H, Sq] / [H, total_q].
      const int64_t head =
          is_o ? (static_cast<int64_t>(e) / p.head_dim_v) % p.heads_q
               : (p.varlen() ? static_cast<int64_t>(e) / p.TotalQ()
                             : (static_cast<int64_t>(e) / p.seqlen_q) % p.heads_q);
      if (std::find(heads.begin(), heads.end(), head) == heads.end()) continue;
      ++checked;
      if (std::memcmp(&sa[e], &sb[e], sizeof(double)) != 0 && differing++ == 0) {
        first = static_cast<int64_t>(e);
      }
    }
    if (differing == 0) {
      out.push_back(Passing(kCheck, name, policy,
                            fmt::format("{} {} elements of {} -inf-sink head(s) bitwise equal",
                                        checked, name, heads.size())));
      continue;
    }
    Verdict v = Failure(kCheck, name, policy,
                        fmt::format("{} of {} {} elements of -inf-sink heads differ from the "
                                    "call without a sink; first at flat {} ({} vs {})",
                                    differing, checked, name, first,
                                    sa[static_cast<size_t>(first)],
                                    sb[static_cast<size_t>(first)]));
    v.worst = LocateElement(p, name, shape, first);
    out.push_back(std::move(v));
  }
}

}  // namespace attest
