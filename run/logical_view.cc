// The logical view of paged and seqused cases (see logical_view.h).
#include "run/logical_view.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include <fmt/format.h>

#include "reference/formats/format.h"

namespace attest {
namespace {

// Rows `rows` of a token-major tensor ([..., H, D]) in its own dtype: [rows.size(), H, D]
// (bytes copied, so a poisoned element stays poison).
Tensor GatherRowsAs(const Tensor& t, const std::vector<int64_t>& rows) {
  const Tensor c = t.contiguous() ? t : t.Clone();
  const int64_t heads = c.dim(c.rank() - 2), width = c.dim(c.rank() - 1);
  const int64_t row_bytes = heads * width * SizeOf(c.dtype());
  Tensor out = Tensor::Zeros(c.dtype(), {static_cast<int64_t>(rows.size()), heads, width});
  for (size_t n = 0; n < rows.size(); ++n) {
    std::memcpy(out.bytes() + static_cast<int64_t>(n) * row_bytes, c.bytes() + rows[n] * row_bytes,
                static_cast<size_t>(row_bytes));
  }
  return out;
}

// lse of `p`'s layout at the rows `q_rows`, in its own dtype: [Hq, q_rows.size()].
Tensor GatherLseAs(const Problem& p, const Tensor& lse, const std::vector<int64_t>& q_rows) {
  const Tensor c = lse.contiguous() ? lse : lse.Clone();
  const int64_t size = SizeOf(c.dtype());
  const auto n = static_cast<int64_t>(q_rows.size());
  Tensor out = Tensor::Zeros(c.dtype(), {p.heads_q, n});
  for (int64_t h = 0; h < p.heads_q; ++h) {
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(out.bytes() + (h * n + r) * size,
                  c.bytes() + LseFlatIndex(p, q_rows[static_cast<size_t>(r)], h) * size,
                  static_cast<size_t>(size));
    }
  }
  return out;
}

// `base` (f64) with packed row n of `packed` written at row rows[n].
Tensor PlaceRows(const Tensor& base, const Tensor& packed, const std::vector<int64_t>& rows) {
  Tensor out = ToF64(base).Clone();
  const Tensor c = ToF64(packed);
  const Tensor src = c.contiguous() ? c : c.Clone();
  const int64_t per_row = out.dim(out.rank() - 2) * out.dim(out.rank() - 1);
  for (size_t n = 0; n < rows.size(); ++n) {
    std::memcpy(out.data<double>() + rows[n] * per_row,
                src.data<const double>() + static_cast<int64_t>(n) * per_row,
                static_cast<size_t>(per_row) * sizeof(double));
  }
  return out;
}

// Rows of a token-major tensor (of `total` rows) that `rows` does not name.
std::vector<int64_t> OtherRows(int64_t total, const std::vector<int64_t>& rows) {
  std::vector<uint8_t> used(static_cast<size_t>(total), 0);
  for (int64_t r : rows) used[static_cast<size_t>(r)] = 1;
  std::vector<int64_t> out;
  for (int64_t r = 0; r < total; ++r) {
    if (!used[static_cast<size_t>(r)]) out.push_back(r);
  }
  return out;
}

// The first element of rows `rows` of `t` (token-major, [..., H, D]) that is not `want`
// (bitwise for zeros: -0 is allowed), as "row R holds X".
std::string FirstOtherThan(const Tensor& t, const std::vector<int64_t>& rows, double want) {
  const Tensor g = ToF64(GatherRowsAs(t, rows));
  const auto s = g.span<const double>();
  const int64_t per_row = g.dim(1) * g.dim(2);
  for (size_t e = 0; e < s.size(); ++e) {
    if (s[e] == want) continue;
    return fmt::format("row {} holds {}, not {}", rows[e / static_cast<size_t>(per_row)], s[e],
                       want);
  }
  return {};
}

}  // namespace

LogicalViewKernel::LogicalViewKernel(Kernel& inner, const Problem& paged,
                                     const CaseInputs& inputs)
    : inner_(inner),
      paged_(paged),
      logical_(LogicalProblem(paged)),
      rows_(LogicalRowsOf(paged)),
      inputs_(inputs) {}

Capabilities LogicalViewKernel::capabilities() const {
  Capabilities caps = inner_.capabilities();
  if (caps.Covers(paged_)) caps.varlen = true;
  return caps;
}

std::optional<Format> LogicalViewKernel::BackwardDpFormat(const Problem& p) const {
  (void)p;
  return inner_.BackwardDpFormat(paged_);
}

void LogicalViewKernel::RequireLogical(const Problem& p) const {
  // A check that calls with a problem of its own would be judged on the paged one.
  if (!(p == logical_)) {
    throw InfrastructureError("the logical view of a paged or seqused problem was called with "
                              "another problem (run/run.cc OnLogicalView lists a relation)");
  }
}

void LogicalViewKernel::Violation(std::string line) {
  for (const std::string& v : violations_) {
    if (v == line) return;
  }
  violations_.push_back(std::move(line));
}

KernelAnswer<ForwardResult> LogicalViewKernel::CallForward(const Problem& p, const Tensor& q,
                                                           const Tensor& k, const Tensor& v,
                                                           const Tensor* sink) {
  RequireLogical(p);
  const Tensor pq = PlaceRows(inputs_.q, q, rows_.q);
  const Tensor pk = PlaceRows(inputs_.k, k, rows_.k);
  const Tensor pv = PlaceRows(inputs_.v, v, rows_.k);
  auto answer = sink != nullptr ? inner_.ForwardSink(paged_, pq, pk, pv, *sink)
                                : inner_.Forward(paged_, pq, pk, pv);
  auto* out = std::get_if<ForwardResult>(&answer);
  if (out == nullptr) return answer;
  ForwardResult logical = *out;  // a tensor of the wrong shape goes to the check as it is
  const bool lse = out->lse.defined() && CheckOutputTensor(out->lse, "lse", paged_.LseShape()).ok();
  if (CheckOutputTensor(out->o, "o", paged_.OShape()).ok()) {
    logical.o = GatherRowsAs(out->o, rows_.q);
    const std::vector<int64_t> rest = OtherRows(paged_.TotalQ(), rows_.q);
    if (std::string bad = FirstOtherThan(out->o, rest, 0.0); !bad.empty()) {
      Violation("o: query " + bad + " (a row past seqused_q is empty: o = 0)");
    }
    if (lse) {
      const double want = EmptyRowLse(inner_.capabilities());
      const Tensor all = ToF64(out->lse);
      for (int64_t r : rest) {
        for (int64_t h = 0; h < paged_.heads_q; ++h) {
          const double x = all.span<const double>()[LseFlatIndex(paged_, r, h)];
          if (x == want) continue;
          Violation(fmt::format("lse: query row {} head {} holds {}, not {} (a row past "
                                "seqused_q is empty)",
                                r, h, x, want));
          r = paged_.TotalQ();
          break;
        }
      }
    }
  }
  if (lse) logical.lse = GatherLseAs(paged_, out->lse, rows_.q);
  last_paged_ = *out;
  last_logical_ = logical;
  return logical;
}

KernelAnswer<BackwardResult> LogicalViewKernel::CallBackward(const Problem& p, const Tensor& q,
                                                             const Tensor& k, const Tensor& v,
                                                             const Tensor& o, const Tensor& lse,
                                                             const Tensor& dout,
                                                             const Tensor* sink) {
  RequireLogical(p);
  const Tensor pq = PlaceRows(inputs_.q, q, rows_.q);
  const Tensor pk = PlaceRows(inputs_.k, k, rows_.k);
  const Tensor pv = PlaceRows(inputs_.v, v, rows_.k);
  const Tensor pdo = PlaceRows(inputs_.dout, dout, rows_.q);
  // The kernel's own forward outputs where the check hands back what the adapter gave it;
  // otherwise (a check's own o or lse) the defined values outside the used rows.
  const bool own_o = last_logical_.o.defined() && o.defined() &&
                     o.shape() == last_logical_.o.shape() && o.BitwiseEqual(last_logical_.o);
  const bool own_lse = !lse.defined() || (last_logical_.lse.defined() &&
                                          lse.shape() == last_logical_.lse.shape() &&
                                          lse.BitwiseEqual(last_logical_.lse));
  Tensor po = own_o ? last_paged_.o
                    : FromF64(ScatterRows(o, rows_.q, paged_.OShape(), 0.0), o.dtype()).value();
  Tensor plse;
  if (lse.defined()) {
    plse = own_lse ? last_paged_.lse
                   : FromF64(ScatterLse(paged_, lse, rows_.q, EmptyRowLse(inner_.capabilities())),
                             lse.dtype())
                         .value();
  }
  auto answer = sink != nullptr ? inner_.BackwardSink(paged_, pq, pk, pv, po, plse, pdo, *sink)
                                : inner_.Backward(paged_, pq, pk, pv, po, plse, pdo);
  auto* out = std::get_if<BackwardResult>(&answer);
  if (out == nullptr) return answer;
  BackwardResult logical = *out;
  if (CheckOutputTensor(out->dq, "dq", paged_.QShape()).ok()) {
    logical.dq = GatherRowsAs(out->dq, rows_.q);
    const std::string bad = FirstOtherThan(out->dq, OtherRows(paged_.TotalQ(), rows_.q), 0.0);
    if (!bad.empty()) Violation("dq: query " + bad + " (a row past seqused_q has dq = 0)");
  }
  const Shape ks = paged_.KShape();  // [rows..., Hkv, D]: the pool's slots, flattened
  const int64_t pool_rows = Tensor::NumElements(ks) / (ks[ks.size() - 2] * ks.back());
  const std::vector<int64_t> unread = OtherRows(pool_rows, rows_.k);
  for (auto [name, t, shape] : {std::tuple{"dk", &out->dk, paged_.KShape()},
                                std::tuple{"dv", &out->dv, paged_.VShape()}}) {
    if (!CheckOutputTensor(*t, name, shape).ok()) continue;
    Tensor& dst = std::string_view(name) == "dk" ? logical.dk : logical.dv;
    dst = GatherRowsAs(*t, rows_.k);
    if (std::string bad = FirstOtherThan(*t, unread, 0.0); !bad.empty()) {
      Violation(fmt::format("{}: key {} (a slot no sequence reads has {} = 0)", name, bad, name));
    }
  }
  return logical;
}

KernelAnswer<ForwardResult> LogicalViewKernel::Forward(const Problem& p, const Tensor& q,
                                                       const Tensor& k, const Tensor& v) {
  return CallForward(p, q, k, v, nullptr);
}
KernelAnswer<BackwardResult> LogicalViewKernel::Backward(const Problem& p, const Tensor& q,
                                                         const Tensor& k, const Tensor& v,
                                                         const Tensor& o, const Tensor& lse,
                                                         const Tensor& dout) {
  return CallBackward(p, q, k, v, o, lse, dout, nullptr);
}
KernelAnswer<ForwardResult> LogicalViewKernel::ForwardSink(const Problem& p, const Tensor& q,
                                                           const Tensor& k, const Tensor& v,
                                                           const Tensor& sink) {
  return CallForward(p, q, k, v, &sink);
}
KernelAnswer<BackwardResult> LogicalViewKernel::BackwardSink(const Problem& p, const Tensor& q,
                                                             const Tensor& k, const Tensor& v,
                                                             const Tensor& o, const Tensor& lse,
                                                             const Tensor& dout,
                                                             const Tensor& sink) {
  return CallBackward(p, q, k, v, o, lse, dout, &sink);
}

namespace {

// One output of the paged call against the contiguous call: bitwise.
Verdict Agreement(const Problem& p, const char* name, const Tensor& paged,
                  const Tensor& contiguous) {
  constexpr std::string_view kPolicy = "paged call bitwise equal to the contiguous call";
  if (paged.shape() != contiguous.shape() || paged.dtype() != contiguous.dtype()) {
    return Failure(kPagedAgreementCheck, name, std::string(kPolicy),
                   fmt::format("{}: the paged call returned {}, the contiguous call {}", name,
                               paged.Describe(), contiguous.Describe()));
  }
  const BitwiseDiff d = DiffBitwise(contiguous, paged);
  Verdict v;
  v.check = std::string(kPagedAgreementCheck);
  v.tensor = name;
  v.policy = std::string(kPolicy);
  v.observed = static_cast<double>(d.differing);
  v.pass = d.differing == 0;
  v.margin = v.pass ? 0.0 : std::numeric_limits<double>::infinity();
  if (v.pass) {
    v.message = fmt::format("{}: the paged call equals the contiguous call bitwise", name);
    return v;
  }
  v.worst = LocateElement(p, name, paged.shape(), d.first);
  v.worst.observed = d.b;
  v.worst.reference = d.a;
  v.message = fmt::format("{}: the paged call differs from the contiguous call of the same "
                          "logical problem in {} element(s), first at {} (contiguous: {:.9g})",
                          name, d.differing, v.worst.Coordinates(), d.a);
  return v;
}

}  // namespace

std::vector<Verdict> PagedAgreesWithContiguous(LogicalView& view, Kernel& inner) {
  CheckContext& ctx = view.ctx;
  const Problem& p = ctx.case_.problem;
  const Capabilities caps = inner.capabilities();
  if (!caps.Covers(p)) {
    ctx.not_applicable = "the kernel does not take the logical problem with contiguous k, v";
    return {};
  }
  if (!caps.deterministic) {
    ctx.not_applicable = "paged vs contiguous is judged bitwise, for deterministic kernels";
    return {};
  }
  const CaseInputs& in = ctx.inputs;
  const auto& paged = ctx.KernelForward();
  if (auto v = NonOutputVerdicts(kPagedAgreementCheck, *ctx.kernel, p, paged, "forward")) {
    return *v;
  }
  auto flat = p.sink ? inner.ForwardSink(p, in.q, in.k, in.v, in.sink)
                     : inner.Forward(p, in.q, in.k, in.v);
  if (auto v = NonOutputVerdicts(kPagedAgreementCheck, inner, p, flat, "forward")) return *v;
  const ForwardResult& pf = std::get<ForwardResult>(paged);
  const ForwardResult& cf = std::get<ForwardResult>(flat);
  std::vector<Verdict> out = {Agreement(p, "o", pf.o, cf.o)};
  if (JudgesLse(inner)) out.push_back(Agreement(p, "lse", pf.lse, cf.lse));
  if (!ctx.WantsBackward()) return out;
  const auto& pb = ctx.KernelBackward();
  if (auto v = NonOutputVerdicts(kPagedAgreementCheck, *ctx.kernel, p, pb, "backward")) {
    return *v;
  }
  auto cb = p.sink ? inner.BackwardSink(p, in.q, in.k, in.v, cf.o, cf.lse, in.dout, in.sink)
                   : inner.Backward(p, in.q, in.k, in.v, cf.o, cf.lse, in.dout);
  if (auto v = NonOutputVerdicts(kPagedAgreementCheck, inner, p, cb, "backward")) return *v;
  const BackwardResult& b1 = std::get<BackwardResult>(pb);
  const BackwardResult& b2 = std::get<BackwardResult>(cb);
  out.push_back(Agreement(p, "dq", b1.dq, b2.dq));
  out.push_back(Agreement(p, "dk", b1.dk, b2.dk));
  out.push_back(Agreement(p, "dv", b1.dv, b2.dv));
  return out;
}

std::unique_ptr<LogicalView> MakeLogicalView(const CheckContext& ctx) {
  auto view = std::make_unique<LogicalView>();
  const Problem& p = ctx.case_.problem;
  view->kernel = std::make_unique<LogicalViewKernel>(*ctx.kernel, p, ctx.inputs);
  const LogicalRows& rows = view->kernel->rows();
  CheckContext& l = view->ctx;
  l.kernel = view->kernel.get();
  l.kernel_spec = ctx.kernel_spec;
  l.case_ = ctx.case_;
  l.case_.problem = view->kernel->logical();
  l.inputs.q = GatherRows(ctx.inputs.q, rows.q);
  l.inputs.k = GatherRows(ctx.inputs.k, rows.k);
  l.inputs.v = GatherRows(ctx.inputs.v, rows.k);
  if (ctx.inputs.dout.defined()) l.inputs.dout = GatherRows(ctx.inputs.dout, rows.q);
  l.inputs.sink = ctx.inputs.sink;
  l.profile = ctx.profile;
  l.oracle_options = ctx.oracle_options;
  l.cuda_oracle = ctx.cuda_oracle;
  l.seed = ctx.seed;
  if (ctx.sample) {
    l.sample = SampleRows(l.case_.problem, {.seed = ctx.seed,
                                            .query_budget = kSampleBudget,
                                            .key_budget = kSampleBudget});
  }
  return view;
}

}  // namespace attest
