// Paged and seqused problems judged by the checks written for contiguous problems
// (docs/semantics.md "Paged KV and seqused"). The checks see the logical problem
// (reference/problem/paged.h LogicalProblem: packed varlen over the used rows) and its
// gathered inputs; their kernel is LogicalViewKernel, which places the inputs it is handed
// into the paged layout (the case's own inputs everywhere nothing is read), calls the real
// kernel on the paged problem and gathers its outputs back. The kernel still does all the
// paged work: the adapter only moves rows. What the logical view does not show, the values
// attest defines outside the used rows (o = 0, lse = the empty-row lse and dq = 0 past
// seqused_q; dk = dv = 0 on every pool slot no sequence reads), the adapter judges on every
// call; special-values reports them (run/run.cc).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "reference/problem/paged.h"
#include "verify/checks/check.h"

namespace attest {

class LogicalViewKernel : public Kernel {
 public:
  // `paged` is the case's problem (HasLogicalView), `inputs` its inputs.
  LogicalViewKernel(Kernel& inner, const Problem& paged, const CaseInputs& inputs);

  std::string name() const override { return inner_.name(); }
  // The inner kernel's, claiming packed varlen when it covers the paged problem (the logical
  // problem is packed only as attest's view of it).
  Capabilities capabilities() const override;
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override;
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override;
  KernelAnswer<ForwardResult> ForwardSink(const Problem& p, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const Tensor& sink) override;
  KernelAnswer<BackwardResult> BackwardSink(const Problem& p, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const Tensor& o, const Tensor& lse,
                                            const Tensor& dout, const Tensor& sink) override;
  std::string last_route() const override { return inner_.last_route(); }
  std::optional<Format> BackwardDpFormat(const Problem& p) const override;

  const Problem& logical() const { return logical_; }
  const LogicalRows& rows() const { return rows_; }
  // The defined values outside the used rows that calls so far broke, one line each
  // ("o: query row 37 (past seqused_q) holds 0.25, not 0").
  const std::vector<std::string>& violations() const { return violations_; }

 private:
  KernelAnswer<ForwardResult> CallForward(const Problem& p, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const Tensor* sink);
  KernelAnswer<BackwardResult> CallBackward(const Problem& p, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const Tensor& o, const Tensor& lse,
                                            const Tensor& dout, const Tensor* sink);
  void RequireLogical(const Problem& p) const;
  void Violation(std::string line);

  Kernel& inner_;
  Problem paged_, logical_;
  LogicalRows rows_;
  CaseInputs inputs_;  // the paged case's, f64
  // The last forward's outputs in the paged layout and as handed to the check, so that a
  // backward of that forward gets the kernel's own o and lse.
  ForwardResult last_paged_, last_logical_;
  std::vector<std::string> violations_;
};

// A paged or seqused case's view for the checks: the adapter and the context they run on.
struct LogicalView {
  std::unique_ptr<LogicalViewKernel> kernel;
  CheckContext ctx;
};
// The view of `ctx`'s case (HasLogicalView): the logical problem, gathered inputs, the
// context's options; a sampled case samples the logical problem's rows.
std::unique_ptr<LogicalView> MakeLogicalView(const CheckContext& ctx);

// The relation of paged and contiguous calls (run/run.cc runs it as the `layouts` row of a
// paged or seqused case: the page pool is one more layout of k and v): the kernel's outputs
// on the paged problem, gathered, equal bitwise its outputs on the logical problem with
// contiguous k and v. For kernels that claim determinism and cover the logical problem;
// otherwise not applicable, with the reason in view.ctx.not_applicable.
inline constexpr std::string_view kPagedAgreementCheck = "layouts";
std::vector<Verdict> PagedAgreesWithContiguous(LogicalView& view, Kernel& inner);

}  // namespace attest
