// The tile sweep (tile_walk.h) against MaskView::Visible and TransformScore element by
// element, on random masks of every kind: the tiles it walks hold every visible pair, the
// tiles it skips hold none, and a transformed row is TransformScore where visible and -inf
// elsewhere, bit for bit. A walk that drops a tile, or a row transform that skips a rule,
// fails here.
#include "reference/problem/tile_walk.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace attest {
namespace {

// A random problem of one to three sequences with causal, window, prefix, document and
// block-sparse rules drawn independently.
Problem RandomProblem(std::mt19937_64& rng) {
  Problem p;
  p.batch = 1 + static_cast<int64_t>(rng() % 3);
  p.seqlen_q = static_cast<int64_t>(rng() % 40);
  p.seqlen_k = static_cast<int64_t>(rng() % 40);
  p.causal = rng() % 2;
  p.causal_align = rng() % 2 ? CausalAlign::kBottomRight : CausalAlign::kTopLeft;
  p.window_left = static_cast<int64_t>(rng() % 12) - 1;
  p.window_right = static_cast<int64_t>(rng() % 12) - 1;
  if (p.causal && rng() % 3 == 0) p.prefix_lm = 1 + static_cast<int64_t>(rng() % 9);
  if (rng() % 3 == 0) {
    std::vector<std::vector<int32_t>> dq(static_cast<size_t>(p.batch)),
        dk(static_cast<size_t>(p.batch));
    for (int64_t b = 0; b < p.batch; ++b) {
      int32_t d = 0;
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        dq[static_cast<size_t>(b)].push_back(d += rng() % 6 == 0);
      }
      d = 0;
      for (int64_t j = 0; j < p.seqlen_k; ++j) {
        dk[static_cast<size_t>(b)].push_back(d += rng() % 6 == 0);
      }
    }
    p.document_ids_q = dq;
    p.document_ids_k = dk;
  }
  if (rng() % 4 == 0) {
    BlockSparse bs;
    bs.block_q = 1 + static_cast<int64_t>(rng() % 8);
    bs.block_k = 1 + static_cast<int64_t>(rng() % 8);
    for (int64_t qb = 0; qb * bs.block_q < p.seqlen_q; ++qb) {
      for (int64_t kb = 0; kb * bs.block_k < p.seqlen_k; ++kb) {
        if (rng() % 2) bs.blocks.emplace_back(qb, kb);
      }
    }
    p.block_sparse = bs;
  }
  if (rng() % 3 == 0) p.softcap = 0.5 + static_cast<double>(rng() % 40) / 4;
  if (rng() % 3 == 0) {
    p.alibi_slopes = std::vector<double>{0.125 * static_cast<double>(1 + rng() % 8)};
  }
  return p;
}

TEST(TileWalk, WalkedTilesHoldEveryVisiblePairAndSkippedTilesNone) {
  std::mt19937_64 rng(20261205);
  int64_t walked = 0, skipped = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const Problem p = RandomProblem(rng);
    ASSERT_TRUE(Validate(p).ok()) << Validate(p).error().message;
    const int64_t tile_q = 1 + static_cast<int64_t>(rng() % 9);
    const int64_t tile_k = 1 + static_cast<int64_t>(rng() % 9);
    for (int64_t b = 0; b < p.batch; ++b) {
      const MaskView mask(p, b);
      const TileWalk walk(mask, tile_k);
      for (int64_t i0 = 0; i0 < mask.q_len(); i0 += tile_q) {
        const int64_t tq = std::min(tile_q, mask.q_len() - i0);
        std::vector<uint8_t> seen(static_cast<size_t>(walk.key_tiles()), 0);
        int64_t last = -1;
        walk.ForEachKeyTile(i0, tq, [&](int64_t kt, int64_t j0, int64_t tk) {
          ASSERT_GT(kt, last) << "key tiles ascend";
          last = kt;
          ASSERT_EQ(j0, kt * tile_k);
          ASSERT_EQ(tk, std::min(tile_k, mask.k_len() - j0));
          seen[static_cast<size_t>(kt)] = 1;
        });
        std::vector<uint8_t> vis;
        for (int64_t kt = 0; kt < walk.key_tiles(); ++kt) {
          const int64_t j0 = kt * tile_k, tk = std::min(tile_k, mask.k_len() - j0);
          const int64_t count = TileVisibility(mask, i0, tq, j0, tk, vis);
          int64_t expect = 0;
          for (int64_t r = 0; r < tq; ++r) {
            for (int64_t c = 0; c < tk; ++c) {
              const bool v = mask.Visible(i0 + r, j0 + c);
              expect += v;
              ASSERT_EQ(vis[static_cast<size_t>(r * tk + c)], v ? 1 : 0);
            }
          }
          ASSERT_EQ(count, expect);
          if (count > 0) ASSERT_TRUE(seen[static_cast<size_t>(kt)]) << "a visible pair skipped";
          if (!walk.MaySee(i0, tq, j0, tk)) ASSERT_EQ(count, 0);
          (seen[static_cast<size_t>(kt)] ? walked : skipped) += 1;
        }
      }
    }
  }
  EXPECT_GT(walked, 1000);
  EXPECT_GT(skipped, 1000);  // the sweep does skip tiles
}

TEST(TileWalk, TransformedRowIsTransformScoreWhereVisibleAndMinusInfElsewhere) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 4.0);
  int64_t visible = 0, masked = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const Problem p = RandomProblem(rng);
    ASSERT_TRUE(Validate(p).ok());
    const int64_t tile_k = 1 + static_cast<int64_t>(rng() % 17);
    const double slope = p.alibi_slopes ? (*p.alibi_slopes)[0] : 0.0;
    for (int64_t b = 0; b < p.batch; ++b) {
      const MaskView mask(p, b);
      const TileWalk walk(mask, tile_k);
      for (int64_t i = 0; i < mask.q_len(); ++i) {
        for (int64_t kt = 0; kt < walk.key_tiles(); ++kt) {
          const IndexRange keys = walk.KeyTile(kt);
          const int64_t tk = keys.end - keys.begin;
          std::vector<double> raw(static_cast<size_t>(tk)), s, th(raw.size(), 7.0);
          for (double& x : raw) x = normal(rng);
          s = raw;
          std::vector<uint8_t> vis(raw.size(), 9);
          const IndexRange span =
              walk.TransformRow(i, keys.begin, tk, p.softcap, slope, s.data(), th.data(),
                                vis.data());
          for (int64_t c = 0; c < tk; ++c) {
            const int64_t j = keys.begin + c;
            const size_t uc = static_cast<size_t>(c);
            if (!mask.Visible(i, j)) {
              ++masked;
              ASSERT_EQ(s[uc], -std::numeric_limits<double>::infinity());
              ASSERT_EQ(vis[uc], 0);
              continue;
            }
            ++visible;
            ASSERT_TRUE(c >= span.begin && c < span.end);
            ASSERT_EQ(vis[uc], 1);
            const double want =
                TransformScore(raw[uc], p.softcap, slope, mask.AlibiDistance(i, j));
            ASSERT_EQ(std::bit_cast<uint64_t>(s[uc]), std::bit_cast<uint64_t>(want));
            if (p.softcap > 0) ASSERT_EQ(th[uc], std::tanh(raw[uc] / p.softcap));
          }
        }
      }
    }
  }
  EXPECT_GT(visible, 10000);
  EXPECT_GT(masked, 10000);
}

TEST(TileWalk, EmptyRowIsZeroOutputAndMinusInfLse) {
  std::vector<float> o{1, 2, 3};
  float lse = 5;
  EmptyRow(o.data(), 3, &lse);
  EXPECT_EQ(o, (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(lse, -std::numeric_limits<float>::infinity());
}

TEST(TileWalk, ForEachVisibleKeyMatchesVisible) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const Problem p = RandomProblem(rng);
    for (int64_t b = 0; b < p.batch; ++b) {
      const MaskView mask(p, b);
      for (int64_t i = 0; i < mask.q_len(); ++i) {
        std::vector<int64_t> got, want;
        ForEachVisibleKey(mask, i, [&](int64_t j) { got.push_back(j); });
        for (int64_t j = 0; j < mask.k_len(); ++j) {
          if (mask.Visible(i, j)) want.push_back(j);
        }
        ASSERT_EQ(got, want);
      }
    }
  }
}

}  // namespace
}  // namespace attest
