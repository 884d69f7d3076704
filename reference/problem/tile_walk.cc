// The tile sweep (tile_walk.h).
#include "reference/problem/tile_walk.h"

namespace attest {

IndexRange KeyRangeOf(const MaskView& mask, int64_t i0, int64_t tq) {
  int64_t lo = mask.k_len(), hi = 0;
  for (int64_t i = i0; i < i0 + tq; ++i) {
    const auto [l, r] = mask.KeyBounds(i);
    if (l < r) lo = std::min(lo, l), hi = std::max(hi, r);
  }
  return {lo, hi};
}

IndexRange QueryRangeOf(const MaskView& mask, int64_t j0, int64_t tk) {
  int64_t lo = mask.q_len(), hi = 0;
  for (int64_t j = j0; j < j0 + tk; ++j) {
    const auto [l, r] = mask.QueryBounds(j);
    if (l < r) lo = std::min(lo, l), hi = std::max(hi, r);
  }
  return {lo, hi};
}

int64_t RowVisibility(const MaskView& mask, int64_t i, int64_t j0, int64_t tk, uint8_t* vis) {
  std::fill(vis, vis + tk, uint8_t{0});
  int64_t count = 0;
  ForEachVisibleKey(mask, i, j0, tk, [&](int64_t j) {
    vis[j - j0] = 1;
    ++count;
  });
  return count;
}

int64_t TileVisibility(const MaskView& mask, int64_t i0, int64_t tq, int64_t j0, int64_t tk,
                       std::vector<uint8_t>& vis) {
  vis.resize(static_cast<size_t>(tq * tk));
  int64_t count = 0;
  for (int64_t r = 0; r < tq; ++r) {
    count += RowVisibility(mask, i0 + r, j0, tk, vis.data() + r * tk);
  }
  return count;
}

TileWalk::TileWalk(const MaskView& mask, int64_t tile_k) : mask_(&mask), tile_k_(tile_k) {
  lo_.resize(static_cast<size_t>(mask.q_len()));
  hi_.resize(static_cast<size_t>(mask.q_len()));
  for (int64_t i = 0; i < mask.q_len(); ++i) {
    const auto [lo, hi] = mask.KeyBounds(i);
    lo_[static_cast<size_t>(i)] = lo;
    hi_[static_cast<size_t>(i)] = hi < lo ? lo : hi;
  }
}

IndexRange TileWalk::KeyRange(int64_t i0, int64_t tq) const {
  int64_t lo = mask_->k_len(), hi = 0;
  for (int64_t i = i0; i < i0 + tq; ++i) {
    const int64_t l = lo_[static_cast<size_t>(i)], r = hi_[static_cast<size_t>(i)];
    if (l < r) lo = std::min(lo, l), hi = std::max(hi, r);
  }
  return {lo, hi};
}

}  // namespace attest
