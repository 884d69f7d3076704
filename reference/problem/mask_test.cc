// Mask and score semantics (mask.h) against docs/design.md "Semantics": an independent
// brute-force visibility rule written from the design's words, swept over many shapes, plus
// hand-drawn masks for every boundary. Each rule shifted by one in mask.cc fails here.
#include "reference/problem/mask.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace attest {
namespace {

// --- The rules, restated from docs/design.md without looking at mask.cc ------------------------
//
// "query i sees key j iff j <= i + Sk - Sq" (bottom-right) or j <= i (top-left); a window
// (left, right) keeps i + off - left <= j <= i + off + right with -1 unbounded; prefix-LM
// keys j < P are seen by every query; document ids must match; block-sparse pairs must be
// listed. All rules AND together, except that the prefix overrides causal and window.
bool ReferenceVisible(const Problem& p, int64_t b, int64_t q_len, int64_t k_len, int64_t i,
                      int64_t j) {
  if (i < 0 || j < 0 || i >= q_len || j >= k_len) return false;
  const int64_t diagonal = p.causal_align == CausalAlign::kTopLeft ? i : i + k_len - q_len;
  bool band = true;
  if (p.causal && j > diagonal) band = false;
  if (p.window_left != -1 && j < diagonal - p.window_left) band = false;
  if (p.window_right != -1 && j > diagonal + p.window_right) band = false;
  const bool in_prefix = p.prefix_lm > 0 && j < p.prefix_lm;
  if (!band && !in_prefix) return false;
  if (p.document_ids_q) {
    const auto ub = static_cast<size_t>(b);
    if ((*p.document_ids_q)[ub][static_cast<size_t>(i)] !=
        (*p.document_ids_k)[ub][static_cast<size_t>(j)]) {
      return false;
    }
  }
  if (p.block_sparse) {
    const auto& bs = *p.block_sparse;
    bool listed = false;
    for (const auto& [qb, kb] : bs.blocks) {
      listed = listed || (qb == i / bs.block_q && kb == j / bs.block_k);
    }
    if (!listed) return false;
  }
  return true;
}

// Visibility under causal/window/prefix only: what KeyBounds/QueryBounds promise to bound
// tightly ("exact for causal/window").
bool ReferenceBandOrPrefix(const Problem& p, int64_t q_len, int64_t k_len, int64_t i, int64_t j) {
  Problem band_only = p;
  band_only.document_ids_q.reset();
  band_only.document_ids_k.reset();
  band_only.block_sparse.reset();
  return ReferenceVisible(band_only, 0, q_len, k_len, i, j);
}

// Sequence lengths, also written from docs/design.md (cu_seqlens differences, else Sq / Sk).
std::pair<int64_t, int64_t> ReferenceLengths(const Problem& p, int64_t b) {
  if (p.cu_seqlens_q) {
    const auto ub = static_cast<size_t>(b);
    return {(*p.cu_seqlens_q)[ub + 1] - (*p.cu_seqlens_q)[ub],
            (*p.cu_seqlens_k)[ub + 1] - (*p.cu_seqlens_k)[ub]};
  }
  return {p.seqlen_q, p.seqlen_k};
}

// Compares MaskView with the reference on every (i, j) of every sequence of p, including
// one index past each end. Returns the number of mismatches (reported through gtest).
int CompareWithReference(const Problem& p) {
  int failures = 0;
  auto fail = [&](const std::string& what) {
    if (failures++ < 5) ADD_FAILURE() << what << "\n  problem: " << ProblemToJson(p).dump();
  };
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const auto [q_len, k_len] = ReferenceLengths(p, b);
    if (mask.q_len() != q_len || mask.k_len() != k_len) {
      fail("sequence lengths differ");
      continue;
    }
    for (int64_t i = -1; i <= q_len; ++i) {
      for (int64_t j = -1; j <= k_len; ++j) {
        if (mask.Visible(i, j) != ReferenceVisible(p, b, q_len, k_len, i, j)) {
          fail("Visible(" + std::to_string(i) + ", " + std::to_string(j) + ") of sequence " +
               std::to_string(b) + " is " + (mask.Visible(i, j) ? "true" : "false"));
        }
      }
    }
    // KeyBounds: the tight hull of the causal/window/prefix set, containing every visible key.
    for (int64_t i = 0; i < q_len; ++i) {
      int64_t lo = k_len, hi = 0;
      for (int64_t j = 0; j < k_len; ++j) {
        if (ReferenceBandOrPrefix(p, q_len, k_len, i, j)) lo = std::min(lo, j), hi = j + 1;
      }
      const auto [klo, khi] = mask.KeyBounds(i);
      const std::string where = "KeyBounds(" + std::to_string(i) + ") = [" + std::to_string(klo) +
                                ", " + std::to_string(khi) + ")";
      if (klo < 0 || khi > k_len) fail(where + " leaves [0, Sk)");
      if (lo >= hi) {
        if (klo < khi) fail(where + " for an empty row");
      } else if (klo != lo || khi != hi) {
        fail(where + ", expected [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
      }
      for (int64_t j = 0; j < k_len; ++j) {
        if (mask.Visible(i, j) && (j < klo || j >= khi)) fail(where + " excludes a visible key");
      }
      // interval_only promises the visible set IS the interval.
      if (mask.interval_only()) {
        for (int64_t j = klo; j < khi; ++j) {
          if (!mask.Visible(i, j)) fail(where + " (interval_only) includes a hidden key");
        }
      }
    }
    // QueryBounds, symmetrically.
    for (int64_t j = 0; j < k_len; ++j) {
      int64_t lo = q_len, hi = 0;
      for (int64_t i = 0; i < q_len; ++i) {
        if (ReferenceBandOrPrefix(p, q_len, k_len, i, j)) lo = std::min(lo, i), hi = i + 1;
      }
      const auto [qlo, qhi] = mask.QueryBounds(j);
      const std::string where = "QueryBounds(" + std::to_string(j) + ") = [" + std::to_string(qlo) +
                                ", " + std::to_string(qhi) + ")";
      if (qlo < 0 || qhi > q_len) fail(where + " leaves [0, Sq)");
      if (lo >= hi) {
        if (qlo < qhi) fail(where + " for a key no query sees");
      } else if (qlo != lo || qhi != hi) {
        fail(where + ", expected [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
      }
      for (int64_t i = 0; i < q_len; ++i) {
        if (mask.Visible(i, j) && (i < qlo || i >= qhi)) fail(where + " excludes a query");
      }
    }
    // The ALiBi distance is measured from the same diagonal.
    for (int64_t i = 0; i < q_len; ++i) {
      for (int64_t j = 0; j < k_len; ++j) {
        const int64_t diagonal = p.causal_align == CausalAlign::kTopLeft ? i : i + k_len - q_len;
        if (mask.AlibiDistance(i, j) != std::abs(diagonal - j)) fail("AlibiDistance");
      }
    }
  }
  return failures;
}

Problem Shape2(int64_t sq, int64_t sk) {
  Problem p;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  return p;
}

// --- Sweeps --------------------------------------------------------------------------------

constexpr int64_t kLens[] = {0, 1, 2, 3, 5, 8, 13};
constexpr int64_t kWindows[] = {-1, 0, 1, 2, 7, 20};

TEST(MaskSweep, CausalAndWindowsMatchTheDesignRules) {
  int configs = 0;
  for (int64_t sq : kLens) {
    for (int64_t sk : kLens) {
      for (bool causal : {false, true}) {
        for (auto align : {CausalAlign::kBottomRight, CausalAlign::kTopLeft}) {
          for (int64_t left : kWindows) {
            for (int64_t right : kWindows) {
              Problem p = Shape2(sq, sk);
              p.causal = causal;
              p.causal_align = align;
              p.window_left = left;
              p.window_right = right;
              ASSERT_TRUE(Validate(p).ok());
              ASSERT_EQ(CompareWithReference(p), 0);
              ++configs;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(configs, 7 * 7 * 2 * 2 * 6 * 6);
}

TEST(MaskSweep, PrefixLmMatchesTheDesignRules) {
  for (int64_t sq : kLens) {
    for (int64_t sk : kLens) {
      for (int64_t prefix : {1, 2, 3, 6, 20}) {
        for (auto align : {CausalAlign::kBottomRight, CausalAlign::kTopLeft}) {
          for (int64_t left : {-1, 0, 2}) {
            Problem p = Shape2(sq, sk);
            p.causal = true;
            p.causal_align = align;
            p.prefix_lm = prefix;
            p.window_left = left;
            ASSERT_TRUE(Validate(p).ok());
            ASSERT_EQ(CompareWithReference(p), 0);
          }
        }
      }
    }
  }
}

TEST(MaskSweep, DocumentIdsAndBlockSparseMatchTheDesignRules) {
  std::mt19937_64 rng(20261202);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t batch = 1 + static_cast<int64_t>(rng() % 3);
    Problem p = Shape2(static_cast<int64_t>(rng() % 12), static_cast<int64_t>(rng() % 12));
    p.batch = batch;
    p.causal = rng() % 2;
    p.causal_align = rng() % 2 ? CausalAlign::kBottomRight : CausalAlign::kTopLeft;
    p.window_left = static_cast<int64_t>(rng() % 5) - 1;
    p.window_right = static_cast<int64_t>(rng() % 5) - 1;
    if (p.causal && rng() % 3 == 0) p.prefix_lm = 1 + static_cast<int64_t>(rng() % 6);
    if (rng() % 2) {
      // Sorted ids: contiguous documents, as packing produces (a few ids only, so many match).
      std::vector<std::vector<int32_t>> dq(static_cast<size_t>(batch)),
          dk(static_cast<size_t>(batch));
      for (int64_t b = 0; b < batch; ++b) {
        int32_t d = 0;
        for (int64_t i = 0; i < p.seqlen_q; ++i) {
          d += rng() % 4 == 0;
          dq[static_cast<size_t>(b)].push_back(d);
        }
        d = 0;
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          d += rng() % 4 == 0;
          dk[static_cast<size_t>(b)].push_back(d);
        }
      }
      p.document_ids_q = dq;
      p.document_ids_k = dk;
    }
    if (rng() % 2) {
      BlockSparse bs;
      bs.block_q = 1 + static_cast<int64_t>(rng() % 4);
      bs.block_k = 1 + static_cast<int64_t>(rng() % 4);
      const int64_t nq = (p.seqlen_q + bs.block_q - 1) / bs.block_q;
      const int64_t nk = (p.seqlen_k + bs.block_k - 1) / bs.block_k;
      for (int64_t qb = 0; qb < nq; ++qb) {
        for (int64_t kb = 0; kb < nk; ++kb) {
          if (rng() % 2) bs.blocks.emplace_back(qb, kb);
        }
      }
      p.block_sparse = bs;
    }
    ASSERT_TRUE(Validate(p).ok()) << Validate(p).error().message;
    ASSERT_EQ(CompareWithReference(p), 0);
  }
}

TEST(MaskSweep, VarlenSequencesIncludingEmptyOnes) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Problem p;
    p.batch = 1 + static_cast<int64_t>(rng() % 5);
    std::vector<int32_t> cq{0}, ck{0};
    p.seqlen_q = p.seqlen_k = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      const auto lq = static_cast<int32_t>(rng() % 7), lk = static_cast<int32_t>(rng() % 7);
      cq.push_back(cq.back() + lq);
      ck.push_back(ck.back() + lk);
      p.seqlen_q = std::max<int64_t>(p.seqlen_q, lq);
      p.seqlen_k = std::max<int64_t>(p.seqlen_k, lk);
    }
    p.cu_seqlens_q = cq;
    p.cu_seqlens_k = ck;
    p.causal = rng() % 2;
    p.window_left = static_cast<int64_t>(rng() % 4) - 1;
    ASSERT_TRUE(Validate(p).ok()) << Validate(p).error().message;
    ASSERT_EQ(CompareWithReference(p), 0);
    for (int64_t b = 0; b < p.batch; ++b) {
      const Sequence s = SequenceOf(p, b);
      EXPECT_EQ(s.q_begin, cq[static_cast<size_t>(b)]);
      EXPECT_EQ(s.k_begin, ck[static_cast<size_t>(b)]);
    }
  }
}

// --- Hand-drawn masks ('x' visible) ------------------------------------------------------------

std::vector<std::string> Draw(const Problem& p, int64_t b = 0) {
  const MaskView mask(p, b);
  std::vector<std::string> rows;
  for (int64_t i = 0; i < mask.q_len(); ++i) {
    std::string row;
    for (int64_t j = 0; j < mask.k_len(); ++j) row += mask.Visible(i, j) ? 'x' : '.';
    rows.push_back(row);
  }
  return rows;
}

using Rows = std::vector<std::string>;

std::pair<int64_t, int64_t> Range(int64_t lo, int64_t hi) { return {lo, hi}; }

TEST(MaskDrawn, CausalBottomRightWithMoreKeysThanQueries) {
  Problem p = Shape2(4, 6);
  p.causal = true;
  EXPECT_EQ(Draw(p), (Rows{"xxx...",  //
                           "xxxx..",  //
                           "xxxxx.",  //
                           "xxxxxx"}));
}

TEST(MaskDrawn, CausalBottomRightWithMoreQueriesThanKeysLeavesTopRowsEmpty) {
  Problem p = Shape2(6, 4);
  p.causal = true;
  EXPECT_EQ(Draw(p), (Rows{"....",  //
                           "....",  //
                           "x...",  //
                           "xx..",  //
                           "xxx.",  //
                           "xxxx"}));
  const MaskView mask(p, 0);
  EXPECT_GE(mask.KeyBounds(0).first, mask.KeyBounds(0).second);
  EXPECT_GE(mask.KeyBounds(1).first, mask.KeyBounds(1).second);
  EXPECT_EQ(mask.KeyBounds(2), Range(0, 1));
  EXPECT_EQ(mask.QueryBounds(3), Range(5, 6));
}

TEST(MaskDrawn, CausalTopLeft) {
  Problem p = Shape2(4, 6);
  p.causal = true;
  p.causal_align = CausalAlign::kTopLeft;
  EXPECT_EQ(Draw(p), (Rows{"x.....",  //
                           "xx....",  //
                           "xxx...",  //
                           "xxxx.."}));
  p = Shape2(6, 4);
  p.causal = true;
  p.causal_align = CausalAlign::kTopLeft;
  EXPECT_EQ(Draw(p), (Rows{"x...", "xx..", "xxx.", "xxxx", "xxxx", "xxxx"}));
}

TEST(MaskDrawn, SlidingWindowLeftOneRightZero) {
  Problem p = Shape2(4, 6);
  p.window_left = 1;
  p.window_right = 0;
  EXPECT_EQ(Draw(p), (Rows{".xx...",  //
                           "..xx..",  //
                           "...xx.",  //
                           "....xx"}));
}

TEST(MaskDrawn, WindowRightBound) {
  Problem p = Shape2(4, 4);
  p.window_right = 1;
  EXPECT_EQ(Draw(p), (Rows{"xx..", "xxx.", "xxxx", "xxxx"}));
  // Causal caps a right bound at the diagonal (flash-attention: causal = window (L, 0)).
  p.causal = true;
  EXPECT_EQ(Draw(p), (Rows{"x...", "xx..", "xxx.", "xxxx"}));
}

TEST(MaskDrawn, WindowLeftBound) {
  Problem p = Shape2(5, 5);
  p.window_left = 2;
  EXPECT_EQ(Draw(p), (Rows{"xxxxx",  //
                           "xxxxx",  //
                           "xxxxx",  //
                           ".xxxx",  //
                           "..xxx"}));
}

TEST(MaskDrawn, EmptyWindowRows) {
  // (0, 0) is the diagonal alone; with Sq > Sk bottom-right its first rows fall before key 0.
  Problem p = Shape2(6, 4);
  p.window_left = 0;
  p.window_right = 0;
  EXPECT_EQ(Draw(p), (Rows{"....", "....", "x...", ".x..", "..x.", "...x"}));
  // Top-left with Sq > Sk: the diagonal runs past the last key.
  p = Shape2(4, 2);
  p.causal_align = CausalAlign::kTopLeft;
  p.window_left = 0;
  p.window_right = 0;
  EXPECT_EQ(Draw(p), (Rows{"x.", ".x", "..", ".."}));
  // A window wider than Sk on both sides hides nothing.
  p = Shape2(3, 4);
  p.window_left = 10;
  p.window_right = 10;
  EXPECT_EQ(Draw(p), (Rows{"xxxx", "xxxx", "xxxx"}));
}

TEST(MaskDrawn, ZeroLengthSequences) {
  Problem p = Shape2(0, 5);
  p.causal = true;
  EXPECT_TRUE(Draw(p).empty());
  EXPECT_FALSE(MaskView(p, 0).Visible(0, 0));
  p = Shape2(3, 0);
  p.causal = true;
  EXPECT_EQ(Draw(p), (Rows{"", "", ""}));
  const MaskView mask(p, 0);
  for (int64_t i = 0; i < 3; ++i) EXPECT_GE(mask.KeyBounds(i).first, mask.KeyBounds(i).second);
  // Packed: the middle sequence has no queries, the last no keys.
  Problem v;
  v.batch = 3;
  v.seqlen_q = 2;
  v.seqlen_k = 3;
  v.cu_seqlens_q = std::vector<int32_t>{0, 2, 2, 4};
  v.cu_seqlens_k = std::vector<int32_t>{0, 3, 5, 5};
  v.causal = true;
  ASSERT_TRUE(Validate(v).ok());
  EXPECT_EQ(Draw(v, 0), (Rows{"xx.", "xxx"}));
  EXPECT_TRUE(Draw(v, 1).empty());
  EXPECT_EQ(Draw(v, 2), (Rows{"", ""}));
  EXPECT_EQ(SequenceOf(v, 2).q_begin, 2);
  EXPECT_EQ(SequenceOf(v, 2).k_begin, 5);
}

TEST(MaskDrawn, PrefixBoundary) {
  Problem p = Shape2(5, 5);
  p.causal = true;
  p.prefix_lm = 3;
  EXPECT_EQ(Draw(p), (Rows{"xxx..",  //
                           "xxx..",  //
                           "xxx..",  //
                           "xxxx.",  //
                           "xxxxx"}));
  // With a sliding window the prefix stays visible past the window's left edge.
  p = Shape2(6, 6);
  p.causal = true;
  p.window_left = 1;
  p.prefix_lm = 2;
  EXPECT_EQ(Draw(p), (Rows{"xx....",  //
                           "xx....",  //
                           "xxx...",  //
                           "xxxx..",  //
                           "xx.xx.",  //
                           "xx..xx"}));
  const MaskView mask(p, 0);
  EXPECT_EQ(mask.KeyBounds(5), Range(0, 6));
  EXPECT_EQ(mask.QueryBounds(1), Range(0, 6));
  EXPECT_EQ(mask.QueryBounds(2), Range(2, 4));
}

TEST(MaskDrawn, DocumentBoundary) {
  Problem p = Shape2(5, 5);
  p.document_ids_q = std::vector<std::vector<int32_t>>{{0, 0, 1, 1, 1}};
  p.document_ids_k = std::vector<std::vector<int32_t>>{{0, 0, 1, 1, 1}};
  EXPECT_EQ(Draw(p), (Rows{"xx...", "xx...", "..xxx", "..xxx", "..xxx"}));
  p.causal = true;
  EXPECT_EQ(Draw(p), (Rows{"x....", "xx...", "..x..", "..xx.", "..xxx"}));
  // Unequal lengths: the query of document 2 has no key of its document.
  p = Shape2(3, 4);
  p.document_ids_q = std::vector<std::vector<int32_t>>{{0, 1, 2}};
  p.document_ids_k = std::vector<std::vector<int32_t>>{{0, 0, 1, 1}};
  EXPECT_EQ(Draw(p), (Rows{"xx..", "..xx", "...."}));
}

TEST(MaskDrawn, BlockBoundary) {
  Problem p = Shape2(4, 6);
  p.block_sparse = BlockSparse{2, 3, {{0, 0}, {1, 1}}};
  EXPECT_EQ(Draw(p), (Rows{"xxx...", "xxx...", "...xxx", "...xxx"}));
  // Partial last blocks and a causal mask on top.
  p = Shape2(5, 5);
  p.causal = true;
  p.block_sparse = BlockSparse{2, 2, {{0, 0}, {1, 1}, {2, 0}, {2, 2}}};
  EXPECT_EQ(Draw(p), (Rows{"x....", "xx...", "..x..", "..xx.", "xx..x"}));
}

// --- Score transform -------------------------------------------------------------------------

TEST(TransformScore, SoftcapIsCapTimesTanhOfScoreOverCap) {
  EXPECT_EQ(TransformScore(3.0, 0.0, 0.0, 0), 3.0);  // cap 0: off
  EXPECT_DOUBLE_EQ(TransformScore(3.0, 2.0, 0.0, 0), 2.0 * std::tanh(1.5));
  EXPECT_DOUBLE_EQ(TransformScore(-3.0, 2.0, 0.0, 0), -2.0 * std::tanh(1.5));
  EXPECT_LT(TransformScore(1e6, 30.0, 0.0, 0), 30.0 + 1e-12);  // bounded by the cap
  EXPECT_GT(TransformScore(1e6, 30.0, 0.0, 0), 30.0 - 1e-9);
  // Not s * tanh(s) (flash-attention PR #2402): for small s the cap is nearly the identity.
  EXPECT_NEAR(TransformScore(1e-3, 50.0, 0.0, 0), 1e-3, 1e-12);
}

TEST(TransformScore, AlibiSubtractsSlopeTimesDistanceAfterSoftcap) {
  EXPECT_EQ(TransformScore(1.0, 0.0, 0.5, 4), 1.0 - 2.0);  // a penalty, never a bonus
  EXPECT_EQ(TransformScore(1.0, 0.0, 0.5, 0), 1.0);
  // Order: softcap first, then ALiBi (cap * tanh(s / cap) - slope * d, not tanh of the sum).
  EXPECT_DOUBLE_EQ(TransformScore(10.0, 1.0, 1.0, 5), std::tanh(10.0) - 5.0);
}

TEST(TransformScore, AlibiDistanceIsMeasuredFromTheAlignedDiagonal) {
  Problem p = Shape2(2, 5);  // bottom-right: diagonal of query i is key i + 3
  const MaskView br(p, 0);
  EXPECT_EQ(br.AlibiDistance(0, 3), 0);
  EXPECT_EQ(br.AlibiDistance(0, 0), 3);
  EXPECT_EQ(br.AlibiDistance(0, 4), 1);  // keys right of the diagonal (non-causal) count too
  EXPECT_EQ(br.AlibiDistance(1, 0), 4);
  p.causal_align = CausalAlign::kTopLeft;
  const MaskView tl(p, 0);
  EXPECT_EQ(tl.AlibiDistance(0, 3), 3);
  EXPECT_EQ(tl.AlibiDistance(1, 1), 0);
}

TEST(TransformScore, WorksForLongDouble) {
  const long double s = TransformScore<long double>(3.0L, 2.0, 0.25, 2);
  EXPECT_NEAR(static_cast<double>(s), 2.0 * std::tanh(1.5) - 0.5, 1e-15);
}

}  // namespace
}  // namespace attest
