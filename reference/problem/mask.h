// Mask and score semantics, written once (docs/design.md "Semantics"). Every layer that asks
// "may query i see key j?" or "what is score s_ij?" calls these.
//
// Indices i, j are local to one sequence (0 <= i < q_len, 0 <= j < k_len). The diagonal
// offset is `k_len - q_len` for bottom-right alignment (flash-attention, the default) and 0
// for top-left (PyTorch SDPA is_causal). With that offset:
//   causal:          j <= i + off
//   window (L, R):   i + off - L <= j <= i + off + R   (a bound of -1 is unbounded)
//   prefix-LM (P):   j < P is visible regardless of causal/window
//   documents:       doc_q[i] == doc_k[j]
//   block-sparse:    (i / block_q, j / block_k) listed
// Score order: s = scale * q.k; softcap: cap * tanh(s / cap); ALiBi: s - slope_h * |i + off - j|;
// then the mask (-inf); then softmax (flash-attention `attention_ref`).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "reference/problem/problem.h"

namespace attest {

class MaskView {
 public:
  MaskView(const Problem& p, int64_t b);

  int64_t q_len() const { return seq_.q_len; }
  int64_t k_len() const { return seq_.k_len; }
  const Sequence& sequence() const { return seq_; }
  // Diagonal offset: query i's diagonal key is i + offset().
  int64_t offset() const { return offset_; }

  bool Visible(int64_t i, int64_t j) const;
  // A half-open key range [lo, hi) outside of which nothing is visible to query i
  // (exact for causal/window; document, prefix and block-sparse rules may hide more
  // inside it). Empty (lo >= hi) when the row is certainly empty.
  std::pair<int64_t, int64_t> KeyBounds(int64_t i) const;
  // Symmetric: [lo, hi) of queries that may see key j.
  std::pair<int64_t, int64_t> QueryBounds(int64_t j) const;
  // True when the rule set is exactly the interval of KeyBounds (no document, prefix or
  // block-sparse rule), so tiled code may skip the per-element test.
  bool interval_only() const { return interval_only_; }
  // |i + off - j|, the ALiBi distance.
  int64_t AlibiDistance(int64_t i, int64_t j) const {
    const int64_t d = i + offset_ - j;
    return d < 0 ? -d : d;
  }

 private:
  bool InBand(int64_t i, int64_t j) const;

  Sequence seq_;
  int64_t offset_ = 0;
  bool causal_ = false;
  int64_t left_ = -1;   // effective left bound (-1 unbounded)
  int64_t right_ = -1;  // effective right bound (causal makes it min(R, 0))
  int64_t prefix_ = 0;
  const std::vector<int32_t>* doc_q_ = nullptr;
  const std::vector<int32_t>* doc_k_ = nullptr;
  const BlockSparse* sparse_ = nullptr;
  std::set<std::pair<int64_t, int64_t>> sparse_set_;
  bool interval_only_ = true;
};

// Draws the mask of sequence b: one line per query i, one character per key j, 'x' where
// Visible(i, j) and '.' elsewhere, each line ending in '\n'. docs/semantics.md shows these
// drawings and semantics_doc_test checks them against this function.
std::string RenderMask(const Problem& p, int64_t b = 0);

// The score transform before masking (scale already applied to `s`), generic in the scalar
// so the multiprecision oracle uses the same rule. `tanh` is found by ADL for MP types.
template <class T>
T TransformScore(const T& scaled_dot, double softcap, double alibi_slope, int64_t distance) {
  using std::tanh;
  T s = scaled_dot;
  if (softcap > 0) s = T(softcap) * tanh(s / T(softcap));
  if (alibi_slope != 0) s -= T(alibi_slope) * T(static_cast<double>(distance));
  return s;
}

}  // namespace attest
