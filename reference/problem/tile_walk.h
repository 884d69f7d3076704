// The sweep over query x key tiles, written once for every layer that walks scores: the
// oracle (reference/oracle/oracle_double.cc), the gradient term scales (verify/tolerance/term_scale.cc),
// the recipe baselines (verify/tolerance/recipe_reference.cc), the consistency check (verify/checks/) and the
// CPU models (kernels/models/flash_engine*.cc). What a caller accumulates stays with the
// caller; which tiles exist, which of them some row may see, which keys each row sees, how a
// row of scores is transformed and masked, and what an empty row is, live here.
//
// Rules (mask.h states them; docs/semantics.md draws them):
// - Tiles are aligned to multiples of their size from the start of each sequence.
// - A (query tile, key tile) pair is walked only if some row may see some key of it by the
//   rows' interval bounds (MaskView::KeyBounds); exact visibility (documents, prefix,
//   block-sparse) is MaskView::Visible inside those bounds.
// - A row of scaled scores becomes TransformScore (softcap, then ALiBi) where visible and
//   -inf where masked; then softmax.
// - A row that sees no key is empty: o = 0, lse = -inf, and it adds nothing to any gradient
//   (EmptyRow).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "reference/problem/mask.h"

namespace attest {

// Half-open [begin, end) of keys (or queries) of one sequence; empty when begin >= end.
struct IndexRange {
  int64_t begin = 0, end = 0;
  bool empty() const { return begin >= end; }
};

// The union of the interval bounds of query rows [i0, i0 + tq): every key any of them may
// see lies inside it (empty when every row is empty).
IndexRange KeyRangeOf(const MaskView& mask, int64_t i0, int64_t tq);
// The same for the queries that may see keys [j0, j0 + tk) (MaskView::QueryBounds).
IndexRange QueryRangeOf(const MaskView& mask, int64_t j0, int64_t tk);

// Exact visibility of keys [j0, j0 + tk) for query i into vis[0, tk) (1 visible, 0 masked);
// returns how many are visible.
int64_t RowVisibility(const MaskView& mask, int64_t i, int64_t j0, int64_t tk, uint8_t* vis);
// Exact visibility of the tile [i0, i0 + tq) x [j0, j0 + tk), row-major into vis (resized to
// tq * tk); returns how many entries are visible (0: the tile can be skipped exactly).
int64_t TileVisibility(const MaskView& mask, int64_t i0, int64_t tq, int64_t j0, int64_t tk,
                       std::vector<uint8_t>& vis);

// fn(j) for every key j of [j0, j0 + tk) that query i sees, ascending.
template <class Fn>
void ForEachVisibleKey(const MaskView& mask, int64_t i, int64_t j0, int64_t tk, Fn&& fn) {
  const auto [lo, hi] = mask.KeyBounds(i);
  const int64_t a = std::max(lo, j0), z = std::min(hi, j0 + tk);
  for (int64_t j = a; j < z; ++j) {
    if (mask.interval_only() || mask.Visible(i, j)) fn(j);
  }
}
// Every key of the sequence.
template <class Fn>
void ForEachVisibleKey(const MaskView& mask, int64_t i, Fn&& fn) {
  ForEachVisibleKey(mask, i, 0, mask.k_len(), fn);
}

// The empty-row rule: o = 0 and lse = -inf.
template <class T>
void EmptyRow(T* o, int64_t dv, T* lse) {
  std::fill(o, o + dv, T(0));
  *lse = -std::numeric_limits<T>::infinity();
}

// One sequence's walk: the rows' key bounds, computed once, and key tiles of tile_k keys.
class TileWalk {
 public:
  TileWalk(const MaskView& mask, int64_t tile_k);

  const MaskView& mask() const { return *mask_; }
  int64_t tile_k() const { return tile_k_; }
  // ceil(k_len / tile_k).
  int64_t key_tiles() const { return (mask_->k_len() + tile_k_ - 1) / tile_k_; }
  // Keys [j0, j0 + tk) of key tile kt.
  IndexRange KeyTile(int64_t kt) const {
    const int64_t j0 = kt * tile_k_;
    return {j0, std::min(j0 + tile_k_, mask_->k_len())};
  }
  // MaskView::KeyBounds of query i (cached).
  IndexRange RowBounds(int64_t i) const {
    return {lo_[static_cast<size_t>(i)], hi_[static_cast<size_t>(i)]};
  }
  // KeyRangeOf from the cache.
  IndexRange KeyRange(int64_t i0, int64_t tq) const;
  // Whether some row of [i0, i0 + tq) may see some key of [j0, j0 + tk).
  bool MaySee(int64_t i0, int64_t tq, int64_t j0, int64_t tk) const {
    for (int64_t i = i0; i < i0 + tq; ++i) {
      const int64_t lo = lo_[static_cast<size_t>(i)], hi = hi_[static_cast<size_t>(i)];
      if (lo < hi && lo < j0 + tk && hi > j0) return true;
    }
    return false;
  }
  // fn(kt, j0, tk) for every key tile that some row of [i0, i0 + tq) may see, ascending.
  template <class Fn>
  void ForEachKeyTile(int64_t i0, int64_t tq, Fn&& fn) const {
    const IndexRange keys = KeyRange(i0, tq);
    if (keys.empty()) return;
    for (int64_t kt = keys.begin / tile_k_; kt * tile_k_ < keys.end; ++kt) {
      const IndexRange t = KeyTile(kt);
      if (MaySee(i0, tq, t.begin, t.end - t.begin)) fn(kt, t.begin, t.end - t.begin);
    }
  }

  // fn(kt, j0, tk) for every key tile that some row of rows[0, n) may see (rows ascending or
  // not), ascending: ForEachKeyTile for a gathered set of rows (the oracle's sampled forward).
  template <class Fn>
  void ForEachKeyTileOfRows(const int64_t* rows, int64_t n, Fn&& fn) const {
    std::vector<uint8_t> seen(static_cast<size_t>(key_tiles()), 0);
    bool any = false;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t lo = lo_[static_cast<size_t>(rows[r])], hi = hi_[static_cast<size_t>(rows[r])];
      if (lo >= hi) continue;
      any = true;
      for (int64_t kt = lo / tile_k_; kt * tile_k_ < hi; ++kt) seen[static_cast<size_t>(kt)] = 1;
    }
    if (!any) return;
    for (int64_t kt = 0; kt < key_tiles(); ++kt) {
      if (!seen[static_cast<size_t>(kt)]) continue;
      const IndexRange t = KeyTile(kt);
      fn(kt, t.begin, t.end - t.begin);
    }
  }

  // Row i's scores of keys [j0, j0 + tk), scale already applied, transformed and masked in
  // place: TransformScore (mask.h) where visible, -inf elsewhere; with softcap, th (if not
  // null) receives tanh(s / cap) at the row's bound range (the backward's derivative), and
  // vis (if not null) 1 where visible, 0 where masked (a visible score may itself be -inf).
  // Returns that range [lo, hi), tile-relative: everything outside it is masked. The same
  // operations in the same order as TransformScore, element by element.
  template <class T>
  IndexRange TransformRow(int64_t i, int64_t j0, int64_t tk, double softcap, double slope,
                          T* s, T* th, uint8_t* vis = nullptr) const;

 private:
  const MaskView* mask_;
  int64_t tile_k_;
  std::vector<int64_t> lo_, hi_;
};

template <class T>
IndexRange TileWalk::TransformRow(int64_t i, int64_t j0, int64_t tk, double softcap,
                                  double slope, T* s, T* th, uint8_t* vis) const {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const int64_t lo = std::clamp<int64_t>(lo_[static_cast<size_t>(i)] - j0, 0, tk);
  const int64_t hi = std::clamp<int64_t>(hi_[static_cast<size_t>(i)] - j0, lo, tk);
  for (int64_t c = 0; c < lo; ++c) s[c] = kNegInf;
  for (int64_t c = hi; c < tk; ++c) s[c] = kNegInf;
  if (vis != nullptr) {
    std::fill(vis, vis + lo, uint8_t{0});
    std::fill(vis + lo, vis + hi, uint8_t{1});
    std::fill(vis + hi, vis + tk, uint8_t{0});
  }
  if (lo >= hi) return {lo, hi};
  // Loops per rule rather than TransformScore per element, so that they vectorise; the
  // same operations on every element as TransformScore.
  if (softcap > 0) {
    const T cap = T(softcap);
    for (int64_t c = lo; c < hi; ++c) {
      using std::tanh;
      const T t = tanh(s[c] / cap);
      if (th != nullptr) th[c] = t;
      s[c] = cap * t;
    }
  }
  if (slope != 0) {
    const int64_t diag = i + mask_->offset();
    for (int64_t c = lo; c < hi; ++c) {
      const int64_t dist = std::abs(diag - (j0 + c));
      s[c] -= T(slope) * T(static_cast<double>(dist));
    }
  }
  if (!mask_->interval_only()) {
    for (int64_t c = lo; c < hi; ++c) {
      if (mask_->Visible(i, j0 + c)) continue;
      s[c] = kNegInf;
      if (vis != nullptr) vis[c] = 0;
    }
  }
  return {lo, hi};
}

}  // namespace attest
