// `attest audit`'s leak maps (Auditor::MeasureLeakMaps; see audit.h, docs/audit.md): the
// non-interference check's perturbation (largest finite values written into inputs a row
// must not see) swept block by block over keys and over queries, so that a leak shows where
// it happens.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "reference/case/inputs.h"
#include "reference/formats/format.h"
#include "reference/problem/mask.h"
#include "run/audit/audit_internal.h"

namespace attest::audit_internal {
namespace {

// Size of a change between two values as the non-interference check counts it: 0 when the
// bits are equal, |a - b| otherwise (the smallest positive double for +0 / -0, inf when not
// finite), so that a nonzero cell always means "some bit moved".
double Change(double a, double b) {
  if (std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b)) return 0;
  const double d = std::fabs(a - b);
  if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
  return d > 0 ? d : std::numeric_limits<double>::denorm_min();
}

double MaxAbs(const Tensor& t) {
  double m = 0;
  for (double x : t.span<const double>()) {
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

// The non-interference check's "large" perturbation (noninterference.cc explains the 2^60 /
// 2^16 limits): the value that moves a shared block scale the most while keeping every
// product finite.
double LargeValue(double x, Format f, bool query_side) {
  const double sign = std::signbit(x) ? -1.0 : 1.0;
  return sign * std::min(MaxFinite(f), query_side ? 0x1p16 : 0x1p60);
}

}  // namespace

Status Auditor::MeasureLeakMaps(AuditResult& r) {
  const AuditPlan& plan = opt_.plan;
  Problem p = MakeProblem(plan.leak_seqlen, plan.seqlen_head_dim, true);
  p.heads_q = p.heads_kv = 1;
  r.leak.problem = p;
  const int64_t bs = plan.leak_block;
  const int64_t nb = (p.seqlen_q + bs - 1) / bs;
  const int64_t s = p.seqlen_q;
  const Case c = MakeCase(p, "gaussian", ++row_);
  auto in = MakeCaseInputs(c);
  if (!in.ok()) return in.error();
  const Format fmt = FormatOf(dtype_).value_or(Format::kBF16);
  const MaskView mask(p, 0);
  const bool bwd = backward_;

  auto new_map = [&](std::string tensor, std::string rows, std::string cols, std::string pert) {
    LeakMap m;
    m.tensor = std::move(tensor);
    m.row_label = std::move(rows);
    m.col_label = std::move(cols);
    m.perturbation = std::move(pert);
    m.block = bs;
    m.rows = m.cols = nb;
    m.cells.assign(static_cast<size_t>(nb * nb), std::numeric_limits<double>::quiet_NaN());
    return m;
  };
  // "2^60" when the value is a power of two, else its shortest decimal.
  auto value_text = [](double v) {
    int e = 0;
    return std::frexp(v, &e) == 0.5 ? fmt::format("2^{}", e - 1) : fmt::format("{:g}", v);
  };
  const std::string key_pert =
      fmt::format("k and v of every key of the column's block set to ±{}, sign kept",
                  value_text(std::min(MaxFinite(fmt), 0x1p60)));
  const std::string query_pert =
      fmt::format("q and dO of every query of the column's block set to ±{}, sign kept",
                  value_text(std::min(MaxFinite(fmt), 0x1p16)));
  LeakMap mo = new_map("o", "query block", "perturbed key block", key_pert);
  LeakMap mdq = new_map("dq", "query block", "perturbed key block", key_pert);
  LeakMap mkv = new_map("dk,dv", "key block", "perturbed query block", query_pert);

  const Outputs base = RunKernel(kernel_, p, in->q, in->k, in->v, in->dout, bwd);
  if (!base.ok()) {
    mo.note = mdq.note = mkv.note = base.note;
    r.leak.maps = {mo};
    if (bwd) r.leak.maps.push_back(mdq), r.leak.maps.push_back(mkv);
    return {};
  }
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  // Per-row largest change of a [1, S, 1, width] tensor, relative to max |base|.
  auto row_changes = [&](const Tensor& a, const Tensor& b, int64_t width) {
    std::vector<double> out(static_cast<size_t>(s), 0.0);
    if (!a.defined() || !b.defined()) return out;
    const double norm = std::max(MaxAbs(a), std::numeric_limits<double>::min());
    const auto x = a.span<const double>();
    const auto y = b.span<const double>();
    for (int64_t i = 0; i < s; ++i) {
      double m = 0;
      for (int64_t e = i * width; e < (i + 1) * width; ++e) {
        m = std::max(m, Change(x[static_cast<size_t>(e)], y[static_cast<size_t>(e)]));
      }
      out[static_cast<size_t>(i)] = m / norm;
    }
    return out;
  };
  auto set_rows = [&](Tensor& t, int64_t begin, int64_t end, int64_t width, bool query_side) {
    t = t.Clone();
    auto span = t.span<double>();
    for (int64_t e = begin * width; e < std::min(end, s) * width; ++e) {
      span[static_cast<size_t>(e)] = LargeValue(span[static_cast<size_t>(e)], fmt, query_side);
    }
  };
  // Forward direction: perturb key block kb; judge o and dq of rows blind to every key of it.
  for (int64_t kb = 0; kb < nb; ++kb) {
    Step(fmt::format("leak map: keys {}..{}", kb * bs, std::min(s, (kb + 1) * bs) - 1));
    Tensor k = in->k, v = in->v;
    set_rows(k, kb * bs, (kb + 1) * bs, d, false);
    set_rows(v, kb * bs, (kb + 1) * bs, dv, false);
    const Outputs pert = RunKernel(kernel_, p, in->q, k, v, in->dout, bwd);
    if (!pert.ok()) {
      mo.note = "kernel gave no outputs on a perturbed input: " + pert.note;
      continue;
    }
    const std::vector<double> co = row_changes(base.o, pert.o, dv);
    const std::vector<double> cq = row_changes(base.dq, pert.dq, d);
    for (int64_t qb = 0; qb < nb; ++qb) {
      double wo = -1, wq = -1;
      for (int64_t i = qb * bs; i < std::min(s, (qb + 1) * bs); ++i) {
        bool blind = true;
        for (int64_t j = kb * bs; j < std::min(s, (kb + 1) * bs) && blind; ++j) {
          blind = !mask.Visible(i, j);
        }
        if (!blind) continue;
        wo = std::max(wo, co[static_cast<size_t>(i)]);
        wq = std::max(wq, cq[static_cast<size_t>(i)]);
      }
      if (wo >= 0) mo.cells[static_cast<size_t>(qb * nb + kb)] = wo;
      if (wq >= 0 && bwd) mdq.cells[static_cast<size_t>(qb * nb + kb)] = wq;
    }
  }
  // Backward direction: perturb q and dO of query block qb; judge dk and dv of keys that no
  // query of the block sees.
  if (bwd) {
    for (int64_t qb = 0; qb < nb; ++qb) {
      Step(fmt::format("leak map: queries {}..{}", qb * bs, std::min(s, (qb + 1) * bs) - 1));
      Tensor q = in->q, dout = in->dout;
      set_rows(q, qb * bs, (qb + 1) * bs, d, true);
      set_rows(dout, qb * bs, (qb + 1) * bs, dv, true);
      const Outputs pert = RunKernel(kernel_, p, q, in->k, in->v, dout, true);
      if (!pert.ok() || !pert.dk.defined()) {
        mkv.note = "kernel gave no outputs on a perturbed input: " + pert.note;
        continue;
      }
      const std::vector<double> ck = row_changes(base.dk, pert.dk, d);
      const std::vector<double> cv = row_changes(base.dv, pert.dv, dv);
      for (int64_t kb = 0; kb < nb; ++kb) {
        double w = -1;
        for (int64_t j = kb * bs; j < std::min(s, (kb + 1) * bs); ++j) {
          bool unseen = true;
          for (int64_t i = qb * bs; i < std::min(s, (qb + 1) * bs) && unseen; ++i) {
            unseen = !mask.Visible(i, j);
          }
          if (!unseen) continue;
          w = std::max({w, ck[static_cast<size_t>(j)], cv[static_cast<size_t>(j)]});
        }
        if (w >= 0) mkv.cells[static_cast<size_t>(kb * nb + qb)] = w;
      }
    }
  }
  r.leak.maps = {std::move(mo)};
  if (bwd) {
    r.leak.maps.push_back(std::move(mdq));
    r.leak.maps.push_back(std::move(mkv));
  } else {
    mdq.note = mkv.note = "the kernel has no backward";
  }
  for (LeakMap& m : r.leak.maps) {
    for (double x : m.cells) {
      if (std::isnan(x)) continue;
      ++m.judged_cells;
      if (x != 0) ++m.leaking_cells;
      m.max_change = std::max(m.max_change, x);
    }
  }
  return {};
}

}  // namespace attest::audit_internal
