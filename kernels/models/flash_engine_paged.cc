// The engine on paged and seqused problems (docs/semantics.md "Paged KV and seqused"): the
// rows a sequence uses are read through the page table (EngineHooks::PagedKeyRow) into the
// logical problem (reference/problem/paged.h, a packed varlen problem), the engine runs on
// it, and the outputs go back to the problem's layout: o, dq 0 and lse -inf past seqused_q,
// dk, dv 0 on pool slots no sequence reads. What the kernel sees of the pool is exactly the
// used keys, so a recipe's tensor-wide scales and every tile follow the logical problem alone.
#include <algorithm>
#include <limits>

#include "kernels/models/flash_engine.h"
#include "kernels/models/flash_engine_internal.h"
#include "reference/formats/format.h"
#include "reference/problem/paged.h"

namespace attest {
namespace {

struct Layout {
  Problem logical;
  LogicalRows rows;
};

// The logical problem the hooks read: the used queries, and UsedKeys keys per sequence at
// PagedKeyRow (the correct hooks give LogicalProblem and LogicalRowsOf exactly).
Layout LayoutOf(const Problem& p, const EngineHooks& hooks, bool backward) {
  Layout l{LogicalProblem(p), {}};
  l.rows.q = LogicalRowsOf(p).q;
  std::vector<int32_t> cu{0};
  int64_t longest = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t n = hooks.UsedKeys(p, b, backward);
    cu.push_back(static_cast<int32_t>(cu.back() + n));
    longest = std::max(longest, n);
    for (int64_t j = 0; j < n; ++j) l.rows.k.push_back(hooks.PagedKeyRow(p, b, j));
  }
  l.logical.cu_seqlens_k = std::move(cu);
  l.logical.seqlen_k = std::max(p.seqlen_k, longest);
  return l;
}

// ScatterRows in the packed tensor's own dtype (its values are exact there).
Tensor Scatter(const Tensor& packed, const std::vector<int64_t>& rows, const Shape& shape,
               double fill) {
  return FromF64(ScatterRows(packed, rows, shape, fill), packed.dtype()).value();
}

Tensor ScatterLseAs(const Problem& p, const Tensor& packed, const std::vector<int64_t>& rows) {
  const Tensor t = ScatterLse(p, packed, rows, -std::numeric_limits<double>::infinity());
  return FromF64(t, packed.dtype()).value();
}

}  // namespace

int64_t EngineHooks::PagedKeyRow(const Problem& p, int64_t b, int64_t j) const {
  return KeyRow(p, b, j);
}

int64_t EngineHooks::UsedKeys(const Problem& p, int64_t b, bool backward) const {
  (void)backward;
  return UsedKLen(p, b);
}

namespace engine_detail {

KernelAnswer<ForwardResult> PagedForward(const Problem& p, const Recipe& recipe, const Tensor& q,
                                         const Tensor& k, const Tensor& v,
                                         const EngineOptions& options) {
  const Layout l = LayoutOf(p, HooksOf(options), false);
  auto r = FlashForward(l.logical, recipe, GatherRows(q, l.rows.q), GatherRows(k, l.rows.k),
                        GatherRows(v, l.rows.k), options);
  auto* f = std::get_if<ForwardResult>(&r);
  if (f == nullptr) return r;
  f->o = Scatter(f->o, l.rows.q, p.OShape(), 0.0);
  if (f->lse.defined()) f->lse = ScatterLseAs(p, f->lse, l.rows.q);
  return r;
}

KernelAnswer<BackwardResult> PagedBackward(const Problem& p, const Recipe& recipe,
                                           const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& o, const Tensor& lse,
                                           const Tensor& dout, const EngineOptions& options) {
  const Layout l = LayoutOf(p, HooksOf(options), true);
  const Tensor packed_lse = lse.defined() ? GatherLse(p, lse, l.rows.q) : Tensor();
  auto r = FlashBackward(l.logical, recipe, GatherRows(q, l.rows.q), GatherRows(k, l.rows.k),
                         GatherRows(v, l.rows.k), GatherRows(o, l.rows.q), packed_lse,
                         GatherRows(dout, l.rows.q), options);
  auto* g = std::get_if<BackwardResult>(&r);
  if (g == nullptr) return r;
  g->dq = Scatter(g->dq, l.rows.q, p.QShape(), 0.0);
  g->dk = Scatter(g->dk, l.rows.k, p.KShape(), 0.0);
  g->dv = Scatter(g->dv, l.rows.k, p.VShape(), 0.0);
  return r;
}

}  // namespace engine_detail
}  // namespace attest
