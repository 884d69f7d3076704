// The sampler's coverage guarantee (verify/metrics/sample.h): on small and medium problems of every
// mask kind, every boundary a rule promises is enumerated here independently, by brute force
// over MaskView::Visible and the problem's fields, and must be in the sample; removing any one
// rule from the sampler leaves some promised row out (so each rule is needed and the
// enumeration can fail). Also: the exact empty-row and unseen-key sets, the random budget, and
// that the same seed gives the same sample.
#include "verify/metrics/sample.h"

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "reference/problem/mask.h"

namespace attest {
namespace {

Problem P(int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t b = 1) {
  Problem p;
  p.batch = b;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = p.head_dim_v = 64;
  return p;
}

Problem Varlen(Problem p, const std::vector<int32_t>& ql, const std::vector<int32_t>& kl) {
  std::vector<int32_t> cq = {0}, ck = {0};
  for (int32_t l : ql) cq.push_back(cq.back() + l);
  for (int32_t l : kl) ck.push_back(ck.back() + l);
  p.batch = static_cast<int64_t>(ql.size());
  p.seqlen_q = *std::max_element(ql.begin(), ql.end());
  p.seqlen_k = *std::max_element(kl.begin(), kl.end());
  p.cu_seqlens_q = cq;
  p.cu_seqlens_k = ck;
  return p;
}

// Document ids from run lengths (the same runs for queries and keys when Sq = Sk).
std::vector<int32_t> Runs(const std::vector<int64_t>& lens) {
  std::vector<int32_t> ids;
  int32_t id = 0;
  for (int64_t l : lens) {
    ids.insert(ids.end(), static_cast<size_t>(l), id);
    ++id;
  }
  return ids;
}

struct Named {
  std::string name;
  Problem p;
};

std::vector<Named> Problems() {
  std::vector<Named> out;
  auto add = [&](std::string n, Problem p) {
    ASSERT_TRUE(Validate(p).ok()) << n << ": " << Validate(p).error().message;
    out.push_back({std::move(n), std::move(p)});
  };
  add("dense Sq<Sk", P(2, 2, 70, 300));
  add("dense Sq>Sk GQA", P(4, 2, 300, 70));
  for (auto align : {CausalAlign::kBottomRight, CausalAlign::kTopLeft}) {
    const std::string a = align == CausalAlign::kTopLeft ? " top-left" : "";
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{513, 513}, {200, 600}, {600, 200}}) {
      Problem p = P(4, 1, sq, sk);
      p.causal = true;
      p.causal_align = align;
      add("causal" + a + " " + std::to_string(sq) + "x" + std::to_string(sk), p);
      Problem w = P(2, 2, sq, sk);
      w.window_left = 100;
      w.window_right = 7;
      w.causal_align = align;
      add("window (100, 7)" + a + " " + std::to_string(sq) + "x" + std::to_string(sk), w);
      Problem wc = p;
      wc.window_left = 64;
      add("causal window 64" + a + " " + std::to_string(sq) + "x" + std::to_string(sk), wc);
    }
  }
  Problem right_only = P(1, 1, 400, 300);
  right_only.window_right = 20;
  add("window (-1, 20) Sq>Sk", right_only);
  // Packed documents of length 1, 2, 3 and a long one, causal; a zero-length sequence.
  Problem packed = Varlen(P(2, 1, 1, 1), {1, 3, 700, 2, 1, 0, 129}, {1, 3, 700, 2, 1, 5, 129});
  packed.causal = true;
  add("varlen causal 1..700", packed);
  add("varlen dense Sq!=Sk", Varlen(P(2, 2, 1, 1), {65, 1, 300}, {1, 257, 0}));
  Problem packed_win = Varlen(P(1, 1, 1, 1), {1, 2, 900, 3}, {1, 2, 900, 3});
  packed_win.causal = true;
  packed_win.window_left = 128;
  add("varlen causal window", packed_win);
  // Per-token documents: 1- to 3-token documents and a long one; queries and keys differ.
  Problem docs = P(2, 2, 520, 520, 2);
  const auto ids = Runs({1, 2, 3, 400, 1, 113});
  docs.document_ids_q = std::vector<std::vector<int32_t>>{ids, Runs({520})};
  docs.document_ids_k = std::vector<std::vector<int32_t>>{ids, Runs({520})};
  docs.causal = true;
  add("documents causal", docs);
  Problem docs_x = P(1, 1, 300, 260);
  {
    std::vector<int32_t> q = Runs({100, 100, 100}), k = Runs({130, 130});
    q[150] = 7;  // a query whose document has no key: an empty row inside the band
    k[5] = 9;    // a key of no query's document: unseen
    docs_x.document_ids_q = std::vector<std::vector<int32_t>>{q};
    docs_x.document_ids_k = std::vector<std::vector<int32_t>>{k};
  }
  add("documents dense Sq!=Sk", docs_x);
  Problem prefix = P(2, 1, 400, 400);
  prefix.causal = true;
  prefix.prefix_lm = 100;
  prefix.window_left = 50;
  add("prefix-LM window", prefix);
  Problem prefix_docs = prefix;
  prefix_docs.document_ids_q = std::vector<std::vector<int32_t>>{Runs({90, 310})};
  prefix_docs.document_ids_k = std::vector<std::vector<int32_t>>{Runs({90, 310})};
  add("prefix-LM documents", prefix_docs);
  Problem sparse = P(1, 1, 300, 400);
  sparse.block_sparse = BlockSparse{96, 80, {{0, 0}, {1, 2}, {2, 4}, {3, 1}}};
  add("block-sparse", sparse);
  return out;
}

using Flags = std::vector<uint8_t>;

// The independent enumeration: every row each rule promises.
struct Promised {
  Flags q[7], k[7];  // indexed by rule bit
};

int Bit(SampleRule r) { return __builtin_ctz(static_cast<unsigned>(r)); }

Promised Enumerate(const Problem& p) {
  Promised e;
  const int64_t tq = p.TotalQ(), tk = p.TotalK();
  for (auto& f : e.q) f.assign(static_cast<size_t>(tq), 0);
  for (auto& f : e.k) f.assign(static_cast<size_t>(tk), 0);
  auto set = [](Flags& f, int64_t x) {
    if (x >= 0 && x < static_cast<int64_t>(f.size())) f[static_cast<size_t>(x)] = 1;
  };
  Problem band_p = p;
  band_p.prefix_lm = 0;
  band_p.document_ids_q.reset();
  band_p.document_ids_k.reset();
  band_p.block_sparse.reset();
  std::vector<int64_t> q_tiles = {64, 128, 256, 128}, k_tiles = {64, 128, 256, 128};
  if (p.block_sparse) {
    q_tiles.push_back(p.block_sparse->block_q);
    k_tiles.push_back(p.block_sparse->block_k);
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    // Sequence extents straight from the fields.
    int64_t q0 = b * p.seqlen_q, k0 = b * p.seqlen_k, nq = p.seqlen_q, nk = p.seqlen_k;
    if (p.varlen()) {
      q0 = (*p.cu_seqlens_q)[static_cast<size_t>(b)];
      k0 = (*p.cu_seqlens_k)[static_cast<size_t>(b)];
      nq = (*p.cu_seqlens_q)[static_cast<size_t>(b + 1)] - q0;
      nk = (*p.cu_seqlens_k)[static_cast<size_t>(b + 1)] - k0;
    }
    Flags& sq = e.q[Bit(kRuleSequenceEdges)];
    Flags& sk = e.k[Bit(kRuleSequenceEdges)];
    if (nq > 0) set(sq, q0), set(sq, q0 + nq - 1);
    if (nk > 0) set(sk, k0), set(sk, k0 + nk - 1);
    if (p.document_ids_q) {
      const auto& dq = (*p.document_ids_q)[static_cast<size_t>(b)];
      const auto& dk = (*p.document_ids_k)[static_cast<size_t>(b)];
      // First and last row of every document: where the id differs from a neighbour.
      for (int64_t i = 0; i < nq; ++i) {
        const int32_t d = dq[static_cast<size_t>(i)];
        const bool first = i == 0 || dq[static_cast<size_t>(i - 1)] != d;
        const bool last = i == nq - 1 || dq[static_cast<size_t>(i + 1)] != d;
        if (first || last) set(e.q[Bit(kRuleDocumentEdges)], q0 + i);
      }
      for (int64_t j = 0; j < nk; ++j) {
        const int32_t d = dk[static_cast<size_t>(j)];
        const bool first = j == 0 || dk[static_cast<size_t>(j - 1)] != d;
        const bool last = j == nk - 1 || dk[static_cast<size_t>(j + 1)] != d;
        if (first || last) set(e.k[Bit(kRuleDocumentEdges)], k0 + j);
      }
    }
    // Tile boundaries: rows r with (r mod T == 0 or (r + 1) mod T == 0), not at the ends.
    for (int64_t i = 0; i < nq; ++i) {
      for (int64_t t : q_tiles) {
        if ((i % t == 0 && i > 0) || ((i + 1) % t == 0 && i + 1 < nq)) {
          set(e.q[Bit(kRuleTileBoundaries)], q0 + i);
        }
      }
    }
    for (int64_t j = 0; j < nk; ++j) {
      for (int64_t t : k_tiles) {
        if ((j % t == 0 && j > 0) || ((j + 1) % t == 0 && j + 1 < nk)) {
          set(e.k[Bit(kRuleTileBoundaries)], k0 + j);
        }
      }
    }
    // Brute force over the whole mask.
    const MaskView mask(p, b), band(band_p, b);
    std::vector<int> q_state(static_cast<size_t>(nq)), k_state(static_cast<size_t>(nk));
    std::vector<int64_t> k_first(static_cast<size_t>(nk), -1), k_last(static_cast<size_t>(nk), -1);
    std::vector<uint8_t> k_seen(static_cast<size_t>(nk), 0);
    for (int64_t i = 0; i < nq; ++i) {
      bool any = false;
      int64_t first = -1, last = -1;
      for (int64_t j = 0; j < nk; ++j) {
        if (mask.Visible(i, j)) {
          any = true;
          k_seen[static_cast<size_t>(j)] = 1;
        }
        if (band.Visible(i, j)) {
          if (first < 0) first = j;
          last = j;
          if (k_first[static_cast<size_t>(j)] < 0) k_first[static_cast<size_t>(j)] = i;
          k_last[static_cast<size_t>(j)] = i;
        }
      }
      if (!any) set(e.q[Bit(kRuleEmpty)], q0 + i);
      q_state[static_cast<size_t>(i)] = first < 0 ? 4 : (first == 0) | (last == nk - 1) << 1;
    }
    for (int64_t j = 0; j < nk; ++j) {
      if (!k_seen[static_cast<size_t>(j)]) set(e.k[Bit(kRuleEmpty)], k0 + j);
      const int64_t f = k_first[static_cast<size_t>(j)], l = k_last[static_cast<size_t>(j)];
      k_state[static_cast<size_t>(j)] = f < 0 ? 4 : (f == 0) | (l == nq - 1) << 1;
    }
    // Band edges: both sides of every change of (empty, reaches key 0, reaches the last key).
    for (int64_t i = 1; i < nq; ++i) {
      if (q_state[static_cast<size_t>(i)] == q_state[static_cast<size_t>(i - 1)]) continue;
      set(e.q[Bit(kRuleBandEdges)], q0 + i - 1);
      set(e.q[Bit(kRuleBandEdges)], q0 + i);
    }
    for (int64_t j = 1; j < nk; ++j) {
      if (k_state[static_cast<size_t>(j)] == k_state[static_cast<size_t>(j - 1)]) continue;
      set(e.k[Bit(kRuleBandEdges)], k0 + j - 1);
      set(e.k[Bit(kRuleBandEdges)], k0 + j);
    }
    if (p.prefix_lm > 0) {
      for (int64_t j : {p.prefix_lm - 1, p.prefix_lm}) {
        if (j < nk) set(e.k[Bit(kRuleBandEdges)], k0 + j);
      }
    }
  }
  for (int64_t x = 1; x <= 3; ++x) {
    set(e.q[Bit(kRuleTensorEnd)], tq - x);
    set(e.k[Bit(kRuleTensorEnd)], tk - x);
  }
  return e;
}

// Rows promised by `bit` that the sample lacks: "query 17, key 3, ..." (at most 5 named).
std::string Missing(const Promised& e, const RowSample& s, int bit, int64_t* count) {
  std::string out;
  *count = 0;
  auto scan = [&](const Flags& want, const Flags& have, const char* what) {
    for (size_t x = 0; x < want.size(); ++x) {
      if (!want[x] || have[x]) continue;
      if ((*count)++ < 5) out += std::string(what) + " " + std::to_string(x) + ", ";
    }
  };
  scan(e.q[bit], s.query_rows, "query");
  scan(e.k[bit], s.key_rows, "key");
  return out;
}

constexpr SampleRule kForcedRules[] = {kRuleSequenceEdges, kRuleDocumentEdges,
                                       kRuleTileBoundaries, kRuleEmpty, kRuleBandEdges,
                                       kRuleTensorEnd};

TEST(Sample, HoldsEveryPromisedRow) {
  for (const Named& n : Problems()) {
    SCOPED_TRACE(n.name);
    const Promised e = Enumerate(n.p);
    // A small budget: the forced rows must be there by rule, not by the random draws.
    const RowSample s = SampleRows(n.p, {.seed = 7, .query_budget = 8, .key_budget = 8});
    for (SampleRule r : kForcedRules) {
      int64_t count = 0;
      const std::string missing = Missing(e, s, Bit(r), &count);
      EXPECT_EQ(count, 0) << "rule bit " << Bit(r) << " misses " << missing;
    }
  }
}

// Each rule is needed: without it, some problem's promised rows of that rule are missing
// (the enumeration above can fail, and no other rule covers for it).
TEST(Sample, EveryRuleIsNeeded) {
  const std::vector<Named> problems = Problems();
  for (SampleRule r : kForcedRules) {
    int64_t missed = 0;
    for (const Named& n : problems) {
      const Promised e = Enumerate(n.p);
      SampleOptions o{.seed = 7, .query_budget = 0, .key_budget = 0};
      o.rules = kAllSampleRules & ~static_cast<uint32_t>(r) & ~static_cast<uint32_t>(kRuleRandom);
      int64_t count = 0;
      Missing(e, SampleRows(n.p, o), Bit(r), &count);
      missed += count;
    }
    EXPECT_GT(missed, 0) << "removing rule bit " << Bit(r) << " loses nothing";
  }
}

TEST(Sample, EmptyRowsAndUnseenKeysAreExact) {
  for (const Named& n : Problems()) {
    SCOPED_TRACE(n.name);
    const Promised e = Enumerate(n.p);
    EXPECT_EQ(EmptyQueryRows(n.p), e.q[Bit(kRuleEmpty)]);
    EXPECT_EQ(UnseenKeyRows(n.p), e.k[Bit(kRuleEmpty)]);
  }
}

TEST(Sample, RandomRowsReachTheBudgetAndFollowTheSeed) {
  Problem p = P(1, 1, 5000, 7000);
  p.causal = true;
  const RowSample a = SampleRows(p, {.seed = 1, .query_budget = 300, .key_budget = 200});
  const RowSample b = SampleRows(p, {.seed = 1, .query_budget = 300, .key_budget = 200});
  const RowSample c = SampleRows(p, {.seed = 2, .query_budget = 300, .key_budget = 200});
  EXPECT_EQ(a.query_rows, b.query_rows);
  EXPECT_EQ(a.key_rows, b.key_rows);
  EXPECT_NE(a.query_rows, c.query_rows);
  // Random rows beyond the forced ones (2 x 5000/64 tile-boundary rows and a few more).
  const RowSample forced = SampleRows(p, {.seed = 1, .query_budget = 0, .key_budget = 0});
  EXPECT_GE(a.queries, forced.queries + 250);  // 300 draws, a few repeating a row
  EXPECT_LE(a.queries, forced.queries + 300);
  EXPECT_GE(a.keys, forced.keys + 150);
  EXPECT_LT(a.queries, p.TotalQ());
  EXPECT_EQ(a.Describe(), "sampled: " + std::to_string(a.queries) + " of 5000 query rows, " +
                              std::to_string(a.keys) + " of 7000 keys");
  // A budget that covers the rows takes every row.
  const RowSample all = SampleRows(P(1, 1, 50, 60), {.seed = 1, .query_budget = 48});
  EXPECT_EQ(all.queries, 50);
  // Random rows beyond the forced ones: a problem with few forced rows.
  const RowSample few = SampleRows(P(1, 1, 100000, 10), {.seed = 3, .query_budget = 4000});
  EXPECT_GE(few.queries, 4000);
}

// The same seed gives bit-identical flags: a golden count and hash of one sample, so that a
// change of the draws (or a platform difference) shows.
TEST(Sample, GoldenSample) {
  Problem p = P(1, 1, 3000, 3000);
  p.window_left = 200;
  p.window_right = 0;
  const RowSample s = SampleRows(p, {.seed = 42, .query_budget = 500, .key_budget = 500});
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the flags
  for (uint8_t f : s.query_rows) h = (h ^ f) * 1099511628211ull;
  for (uint8_t f : s.key_rows) h = (h ^ f) * 1099511628211ull;
  RecordProperty("hash", std::to_string(h));
  EXPECT_EQ(s.queries, 598);  // the forced rows and up to 500 drawn
  EXPECT_EQ(s.keys, 599);
  EXPECT_EQ(h, 18313934197717485152u) << "golden hash; update only when the draws change on purpose";
}

}  // namespace
}  // namespace attest
