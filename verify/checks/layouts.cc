// The "layouts" check (see layouts.h): the same problem through strided views of the inputs.
#include "verify/checks/layouts.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "reference/formats/format.h"

namespace attest {
namespace {

constexpr std::string_view kCheck = "layouts";
constexpr double kInf = std::numeric_limits<double>::infinity();

enum class ViewLayout { kFusedProjection, kHeadsMajor, kHeadGap, kEveryOther };

std::string_view Name(ViewLayout l) {
  switch (l) {
    case ViewLayout::kFusedProjection: return "fused projection";
    case ViewLayout::kHeadsMajor: return "heads-major";
    case ViewLayout::kHeadGap: return "head gap";
    case ViewLayout::kEveryOther: return "every other element";
  }
  return "?";
}

// Storage whose every byte is kOutputPoisonByte: NaN in every float dtype (kernels/kernel.h),
// so that a kernel reading a gap or a neighbour's slot instead of its own element reads NaN.
Tensor NanStorage(DType dtype, Shape shape) {
  Tensor s = Tensor::Zeros(dtype, std::move(shape));
  std::memset(s.bytes(), kOutputPoisonByte, static_cast<size_t>(s.nbytes()));
  return s;
}

// A view of `storage` (kept alive by `keep`) with `shape`, `strides` and an element offset.
Tensor ViewOf(const Tensor& storage, const Shape& shape, const Shape& strides, int64_t offset,
              std::vector<Tensor>& keep) {
  keep.push_back(storage);
  return Tensor::View(storage.dtype(), shape, strides,
                      storage.bytes() + offset * SizeOf(storage.dtype()));
}

// `t` ([B, S, H, X] or packed [T, H, X]) laid out as `layout` says (not the fused projection,
// which lays out three tensors at once), holding the same values.
Tensor Relaid(const Tensor& t, ViewLayout layout, std::vector<Tensor>& keep) {
  const int64_t r = t.rank();
  Tensor view;
  switch (layout) {
    case ViewLayout::kHeadsMajor: {
      // [B, H, S, X] (packed: [H, T, X]) storage, seen through a transpose.
      Shape s = t.shape();
      std::swap(s[static_cast<size_t>(r - 3)], s[static_cast<size_t>(r - 2)]);
      Tensor storage = NanStorage(t.dtype(), s);
      keep.push_back(storage);
      view = r == 4 ? storage.Permute({0, 2, 1, 3}) : storage.Permute({1, 0, 2});
      break;
    }
    case ViewLayout::kEveryOther: {
      Shape s = t.shape();
      s.back() *= 2;
      const Tensor storage = NanStorage(t.dtype(), s);
      Shape strides = storage.strides();
      strides.back() = 2;
      view = ViewOf(storage, t.shape(), strides, 0, keep);
      break;
    }
    case ViewLayout::kHeadGap:
    case ViewLayout::kFusedProjection: {
      // Heads 1..H of an [.., H + 1, X] buffer: a gap (head 0, NaN) before every token's heads.
      Shape s = t.shape();
      s[static_cast<size_t>(r - 2)] += 1;
      Tensor storage = NanStorage(t.dtype(), s);
      keep.push_back(storage);
      view = storage.Narrow(r - 2, 1, t.dim(r - 2));
      break;
    }
  }
  view.CopyFrom(t);
  return view;
}

// q, k and v as slices of one fused projection's output, [.., S, Hq·D + Hkv·D + Hkv·Dv] (the
// `qkv.view(..., 3, H, D)` of a model; GQA and Dv != D give unequal slices), or, when the
// query and key token axes differ, q with a head gap and k, v slices of one [.., Sk,
// Hkv·(D + Dv)] buffer (a cross-attention's fused kv projection).
void FusedProjection(Tensor& q, Tensor& k, Tensor& v, std::vector<Tensor>& keep) {
  const int64_t r = q.rank();
  const Shape lead_q(q.shape().begin(), q.shape().end() - 2);
  const Shape lead_k(k.shape().begin(), k.shape().end() - 2);
  const int64_t hq = q.dim(r - 2), hk = k.dim(r - 2), d = q.dim(r - 1), dv = v.dim(r - 1);
  const bool joint = lead_q == lead_k;
  const int64_t width = (joint ? hq * d : 0) + hk * d + hk * dv;
  Shape s = lead_k;
  s.push_back(width);
  const Tensor storage = NanStorage(q.dtype(), s);
  auto slice = [&](const Tensor& t, int64_t offset) {
    Shape strides(storage.strides().begin(), storage.strides().end() - 1);
    strides.push_back(t.dim(r - 1));
    strides.push_back(1);
    Tensor view = ViewOf(storage, t.shape(), strides, offset, keep);
    view.CopyFrom(t);
    return view;
  };
  int64_t at = 0;
  if (joint) {
    q = slice(q, at);
    at += hq * d;
  } else {
    q = Relaid(q, ViewLayout::kHeadGap, keep);
  }
  k = slice(k, at);
  at += hk * d;
  v = slice(v, at);
}

struct Outputs {
  std::optional<std::vector<Verdict>> stop;  // set: no outputs (the verdicts say why)
  ForwardResult fwd;
  std::optional<BackwardResult> bwd;
};

// One forward (and backward on its own o and lse) on the given tensors; the backward reads o
// laid out as `layout` (the fused projection's o: with a head gap).
Outputs Run(Kernel& kernel, const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
            const Tensor& dout, bool backward, std::optional<ViewLayout> layout,
            std::vector<Tensor>& keep) {
  Outputs r;
  const std::string what = layout ? fmt::format("forward ({})", Name(*layout)) : "forward";
  auto f = kernel.Forward(p, q, k, v);
  if (auto s = NonOutputVerdicts(kCheck, kernel, p, f, what)) {
    r.stop = std::move(s);
    return r;
  }
  r.fwd = std::get<ForwardResult>(std::move(f));
  if (!backward) return r;
  Tensor o = r.fwd.o;
  if (layout && o.defined() && o.numel() > 0) {
    o = Relaid(o, *layout == ViewLayout::kFusedProjection ? ViewLayout::kHeadGap : *layout, keep);
  }
  auto b = kernel.Backward(p, q, k, v, o, r.fwd.lse, dout);
  const std::string bwhat = layout ? fmt::format("backward ({})", Name(*layout)) : "backward";
  if (auto s = NonOutputVerdicts(kCheck, kernel, p, b, bwhat)) {
    r.stop = std::move(s);
    return r;
  }
  r.bwd = std::get<BackwardResult>(std::move(b));
  return r;
}

// How two results of one tensor differ.
struct Diff {
  int64_t differing = 0;   // elements whose bits differ
  int64_t elements = 0;
  double largest = 0;      // largest |a − b| (inf: a non-finite value on one side only)
  int64_t where = -1;      // flat index of `largest`
  bool shape_mismatch = false;
};

Diff Compare(const Tensor& a, const Tensor& b) {
  Diff d;
  if (!a.defined() || !b.defined() || a.shape() != b.shape()) {
    d.shape_mismatch = a.defined() != b.defined() || (a.defined() && a.shape() != b.shape());
    return d;
  }
  const Tensor x = ToF64(a), y = ToF64(b);
  const auto sx = x.span<const double>(), sy = y.span<const double>();
  d.elements = static_cast<int64_t>(sx.size());
  for (size_t i = 0; i < sx.size(); ++i) {
    if (std::memcmp(&sx[i], &sy[i], sizeof(double)) == 0) continue;
    ++d.differing;
    const double e = std::isfinite(sx[i]) && std::isfinite(sy[i]) ? std::fabs(sx[i] - sy[i])
                     : (std::isnan(sx[i]) && std::isnan(sy[i])) ? 0.0
                                                                 : kInf;
    if (e > d.largest || d.where < 0) {
      d.largest = e;
      d.where = static_cast<int64_t>(i);
    }
  }
  return d;
}

// The tensors a run returns, by name, in verdict order.
std::vector<std::pair<std::string_view, const Tensor*>> Named(const Outputs& r, bool lse) {
  std::vector<std::pair<std::string_view, const Tensor*>> out = {{"o", &r.fwd.o}};
  if (lse) out.push_back({"lse", &r.fwd.lse});
  if (r.bwd) {
    out.push_back({"dq", &r.bwd->dq});
    out.push_back({"dk", &r.bwd->dk});
    out.push_back({"dv", &r.bwd->dv});
  }
  return out;
}

}  // namespace

std::vector<Verdict> RunLayouts(CheckContext& ctx) {
  const Problem& p = ctx.case_.problem;
  const Capabilities caps = ctx.kernel->capabilities();
  // 1. Where the check applies: an interface that takes views, a claimed problem, tokens.
  if (caps.strides != "any" && caps.strides != "inner") {
    ctx.not_applicable = "the kernel's interface takes contiguous tensors only "
                         "(capabilities.strides)";
    return {};
  }
  if (!caps.Covers(p) || p.TotalQ() == 0 || p.TotalK() == 0) {
    ctx.not_applicable = "no tokens to lay out, or outside the capabilities";
    return {};
  }
  const CaseInputs& in = ctx.inputs;
  const bool backward = ctx.WantsBackward();
  // 2. The contiguous call, in the input dtype as every adapter hands it over (twice for a
  // kernel that does not claim determinism: its run-to-run spread bounds the comparison).
  auto input = [&](const Tensor& t, const char* name) {
    auto c = InInputDType(t, p.dtype, name);
    if (!c.ok()) throw HarnessError("layouts: " + c.error().message);
    return c->contiguous() ? *c : c->Clone();
  };
  const Tensor q = input(in.q, "q"), k = input(in.k, "k"), v = input(in.v, "v");
  const Tensor dout = backward ? input(in.dout, "do") : Tensor();
  std::vector<Tensor> keep;
  const Outputs base = Run(*ctx.kernel, p, q, k, v, dout, backward, std::nullopt, keep);
  if (base.stop) return *base.stop;
  const bool lse = JudgesLse(*ctx.kernel);
  std::vector<double> spread(5, 0.0);
  if (!caps.deterministic) {
    const Outputs again = Run(*ctx.kernel, p, q, k, v, dout, backward, std::nullopt, keep);
    if (again.stop) return *again.stop;
    const auto a = Named(base, lse), b = Named(again, lse);
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      spread[i] = Compare(*a[i].second, *b[i].second).largest;
    }
  }
  // 3. Each layout: the same problem, the same values, other strides.
  std::vector<ViewLayout> layouts = {ViewLayout::kFusedProjection, ViewLayout::kHeadsMajor, ViewLayout::kHeadGap};
  if (caps.strides == "any") layouts.push_back(ViewLayout::kEveryOther);
  struct Worst {
    Diff diff;
    std::string layout;  // the first layout whose result differed beyond the allowance
    std::vector<std::string> agreed;
  };
  const auto names = Named(base, lse);
  std::vector<Worst> worst(names.size());
  std::vector<Verdict> out;
  std::vector<std::string> refused;
  for (ViewLayout layout : layouts) {
    Tensor lq = q, lk = k, lv = v;
    if (layout == ViewLayout::kFusedProjection) {
      FusedProjection(lq, lk, lv, keep);
    } else {
      lq = Relaid(q, layout, keep);
      lk = Relaid(k, layout, keep);
      lv = Relaid(v, layout, keep);
    }
    const Tensor ldo = backward ? Relaid(dout, layout == ViewLayout::kFusedProjection
                                                    ? ViewLayout::kHeadGap
                                                    : layout,
                                         keep)
                                : Tensor();
    const Outputs got = Run(*ctx.kernel, p, lq, lk, lv, ldo, backward, layout, keep);
    if (got.stop) {
      if (got.stop->empty()) {  // Unsupported: the interface refused the view, honestly
        refused.emplace_back(Name(layout));
      }
      for (const Verdict& x : *got.stop) out.push_back(x);
      continue;
    }
    const auto have = Named(got, lse);
    for (size_t i = 0; i < names.size(); ++i) {
      const Tensor* t = i < have.size() ? have[i].second : nullptr;
      Diff d = t != nullptr ? Compare(*names[i].second, *t) : Diff{};
      if (t == nullptr) d.shape_mismatch = true;
      const double allowed = 2 * spread[i];
      const bool ok = !d.shape_mismatch &&
                      (allowed == 0 ? d.differing == 0 : d.largest <= allowed);
      Worst& w = worst[i];
      if (ok) {
        w.agreed.emplace_back(Name(layout));
      } else if (w.layout.empty() || d.shape_mismatch || d.largest > w.diff.largest) {
        w.diff = d;
        w.layout = std::string(Name(layout));
      }
    }
  }
  // 4. One verdict per output: bitwise equal (or within the spread) under every layout run.
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string tensor(names[i].first);
    const double allowed = 2 * spread[i];
    const std::string policy = allowed == 0 ? "bitwise equal to the contiguous call"
                                            : "within twice the kernel's run-to-run spread";
    const Worst& w = worst[i];
    if (w.layout.empty()) {
      if (w.agreed.empty()) continue;  // every layout refused or failed: said above
      Verdict ok = Passing(kCheck, tensor, policy,
                           fmt::format("{}: the contiguous call's values under {}", tensor,
                                       fmt::join(w.agreed, ", ")));
      ok.allowed = allowed;
      out.push_back(std::move(ok));
      continue;
    }
    Verdict bad;
    if (w.diff.shape_mismatch) {
      bad = Failure(kCheck, tensor, policy,
                    fmt::format("{}: under {} the output is missing or of another shape", tensor,
                                w.layout));
    } else {
      bad = Failure(kCheck, tensor, policy,
                    fmt::format("{}: under {} {} of {} element(s) differ from the contiguous "
                                "call; largest |diff| {:.3g} (allowed {:.3g}): the kernel reads "
                                "its inputs as if they were laid out otherwise",
                                tensor, w.layout, w.diff.differing, w.diff.elements,
                                w.diff.largest, allowed));
      bad.observed = w.diff.largest;
      bad.allowed = allowed;
      bad.margin = Margin(w.diff.largest, allowed);
      const Tensor& ref = *names[i].second;
      if (w.diff.where >= 0) bad.worst = LocateElement(p, tensor, ref.shape(), w.diff.where);
    }
    out.push_back(std::move(bad));
  }
  if (!refused.empty()) {
    out.push_back(Passing(kCheck, "", "a layout the interface does not take is refused",
                          fmt::format("honest refusal of {}", fmt::join(refused, ", "))));
  }
  return out;
}

}  // namespace attest
