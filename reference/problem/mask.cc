// Mask semantics (see mask.h for the rules and their sources).
#include "reference/problem/mask.h"

namespace attest {

MaskView::MaskView(const Problem& p, int64_t b) : seq_(SequenceOf(p, b)) {
  offset_ = p.causal_align == CausalAlign::kBottomRight ? seq_.k_len - seq_.q_len : 0;
  causal_ = p.causal;
  left_ = p.window_left;
  right_ = p.window_right;
  // Causal is the window (L, 0): it caps the right bound at the diagonal.
  if (causal_) right_ = right_ < 0 ? 0 : std::min<int64_t>(right_, 0);
  prefix_ = p.prefix_lm;
  if (p.document_ids_q && p.document_ids_k) {
    doc_q_ = &(*p.document_ids_q)[static_cast<size_t>(b)];
    doc_k_ = &(*p.document_ids_k)[static_cast<size_t>(b)];
  }
  if (p.block_sparse) {
    sparse_ = &*p.block_sparse;
    sparse_set_.insert(sparse_->blocks.begin(), sparse_->blocks.end());
  }
  interval_only_ = prefix_ == 0 && doc_q_ == nullptr && sparse_ == nullptr;
}

bool MaskView::InBand(int64_t i, int64_t j) const {
  const int64_t diag = i + offset_;
  if (left_ >= 0 && j < diag - left_) return false;
  if (right_ >= 0 && j > diag + right_) return false;
  return true;
}

bool MaskView::Visible(int64_t i, int64_t j) const {
  if (i < 0 || i >= seq_.q_len || j < 0 || j >= seq_.k_len) return false;
  if (!(InBand(i, j) || j < prefix_)) return false;
  if (doc_q_ && (*doc_q_)[static_cast<size_t>(i)] != (*doc_k_)[static_cast<size_t>(j)]) {
    return false;
  }
  if (sparse_ && !sparse_set_.count({i / sparse_->block_q, j / sparse_->block_k})) return false;
  return true;
}

std::pair<int64_t, int64_t> MaskView::KeyBounds(int64_t i) const {
  const int64_t diag = i + offset_;
  int64_t lo = left_ >= 0 ? std::max<int64_t>(0, diag - left_) : 0;
  int64_t hi = right_ >= 0 ? std::min<int64_t>(seq_.k_len, diag + right_ + 1) : seq_.k_len;
  if (prefix_ > 0) {
    const int64_t p = std::min(prefix_, seq_.k_len);
    if (hi <= lo) {
      lo = 0;
      hi = p;
    } else {
      lo = 0;
      hi = std::max(hi, p);
    }
  }
  if (hi < lo) hi = lo;
  return {std::clamp<int64_t>(lo, 0, seq_.k_len), std::clamp<int64_t>(hi, 0, seq_.k_len)};
}

std::pair<int64_t, int64_t> MaskView::QueryBounds(int64_t j) const {
  if (prefix_ > 0 && j < prefix_) return {0, seq_.q_len};
  // j >= diag - L  <=>  i <= j - off + L ;  j <= diag + R  <=>  i >= j - off - R.
  int64_t lo = right_ >= 0 ? std::max<int64_t>(0, j - offset_ - right_) : 0;
  int64_t hi = left_ >= 0 ? std::min<int64_t>(seq_.q_len, j - offset_ + left_ + 1) : seq_.q_len;
  if (hi < lo) hi = lo;
  return {std::clamp<int64_t>(lo, 0, seq_.q_len), std::clamp<int64_t>(hi, 0, seq_.q_len)};
}

std::string RenderMask(const Problem& p, int64_t b) {
  const MaskView mask(p, b);
  std::string out;
  out.reserve(static_cast<size_t>(mask.q_len() * (mask.k_len() + 1)));
  for (int64_t i = 0; i < mask.q_len(); ++i) {
    for (int64_t j = 0; j < mask.k_len(); ++j) out += mask.Visible(i, j) ? 'x' : '.';
    out += '\n';
  }
  return out;
}

}  // namespace attest
