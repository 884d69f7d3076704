// The row sampler (see sample.h).
#include "verify/metrics/sample.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "reference/data/generate.h"
#include "reference/oracle/oracle.h"
#include "reference/problem/mask.h"

namespace attest {
namespace {

// Philox streams of the random draws (reference/data/generate.h: auxiliary ids from
// kFirstAuxStream; the input tensors' streams are 0..3).
constexpr uint32_t kQueryStream = kFirstAuxStream + 40;
constexpr uint32_t kKeyStream = kFirstAuxStream + 41;

// The problem without the rules that are not intervals (prefix, documents, block-sparse):
// its MaskView's bounds are the causal/window band alone.
Problem BandOnly(const Problem& p) {
  Problem band = p;
  band.prefix_lm = 0;
  band.document_ids_q.reset();
  band.document_ids_k.reset();
  band.block_sparse.reset();
  return band;
}

// Positions of each document id, ascending.
std::map<int32_t, std::vector<int64_t>> Positions(const std::vector<int32_t>& ids, int64_t len) {
  std::map<int32_t, std::vector<int64_t>> at;
  for (int64_t x = 0; x < len; ++x) at[ids[static_cast<size_t>(x)]].push_back(x);
  return at;
}

// Whether `sorted` holds a value in [a, z).
bool AnyIn(const std::vector<int64_t>& sorted, int64_t a, int64_t z) {
  if (a >= z) return false;
  auto it = std::lower_bound(sorted.begin(), sorted.end(), a);
  return it != sorted.end() && *it < z;
}

// Exact emptiness of one side: rows (queries when `queries`) of sequence b that see nothing.
void MarkEmpty(const Problem& p, const Problem& band_problem, bool queries,
               std::vector<uint8_t>& out) {
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b), band(band_problem, b);
    const Sequence s = mask.sequence();
    const int64_t n = queries ? s.q_len : s.k_len;
    const int64_t begin = queries ? s.q_begin : s.k_begin;
    const int64_t other_len = queries ? s.k_len : s.q_len;
    const bool docs = p.document_ids_q.has_value() && p.document_ids_k.has_value();
    std::map<int32_t, std::vector<int64_t>> other_docs;
    if (docs) {
      const auto& ids = queries ? (*p.document_ids_k)[static_cast<size_t>(b)]
                                : (*p.document_ids_q)[static_cast<size_t>(b)];
      other_docs = Positions(ids, other_len);
    }
    const int64_t prefix = std::min(p.prefix_lm, s.k_len);
    for (int64_t x = 0; x < n; ++x) {
      bool seen = false;
      if (p.block_sparse) {
        // Block lists have no interval structure: scan the bounds.
        const auto [lo, hi] = queries ? mask.KeyBounds(x) : mask.QueryBounds(x);
        for (int64_t y = lo; y < hi && !seen; ++y) {
          seen = queries ? mask.Visible(x, y) : mask.Visible(y, x);
        }
      } else {
        // The band, and the prefix: every query sees keys j < P.
        std::vector<std::pair<int64_t, int64_t>> spans;
        spans.push_back(queries ? band.KeyBounds(x) : band.QueryBounds(x));
        if (queries && prefix > 0) spans.emplace_back(0, prefix);
        if (!queries && x < prefix) spans.emplace_back(0, s.q_len);
        for (const auto& [a, z] : spans) {
          if (!docs) {
            seen = seen || a < z;
            continue;
          }
          const auto& own = queries ? (*p.document_ids_q)[static_cast<size_t>(b)]
                                    : (*p.document_ids_k)[static_cast<size_t>(b)];
          const auto it = other_docs.find(own[static_cast<size_t>(x)]);
          seen = seen || (it != other_docs.end() && AnyIn(it->second, a, z));
        }
      }
      if (!seen) out[static_cast<size_t>(begin + x)] = 1;
    }
  }
}

void Set(std::vector<uint8_t>& flags, int64_t x) {
  if (x >= 0 && x < static_cast<int64_t>(flags.size())) flags[static_cast<size_t>(x)] = 1;
}

// Both sides of every boundary of tiles of `tile` rows in [begin, begin + len).
void MarkTiles(std::vector<uint8_t>& flags, int64_t begin, int64_t len, int64_t tile) {
  if (tile <= 0) return;
  for (int64_t m = tile; m < len; m += tile) {
    Set(flags, begin + m - 1);
    Set(flags, begin + m);
  }
}

// Both sides of every change of the band's state (empty, cut by the first, cut by the last
// row of the other side).
template <class Bounds>
void MarkBandEdges(std::vector<uint8_t>& flags, int64_t begin, int64_t len, int64_t other_len,
                   Bounds&& bounds) {
  int prev = -1;
  for (int64_t x = 0; x < len; ++x) {
    const auto [lo, hi] = bounds(x);
    const int state = lo >= hi ? 4 : (lo == 0 ? 1 : 0) | (hi == other_len ? 2 : 0);
    if (prev >= 0 && state != prev) {
      Set(flags, begin + x - 1);
      Set(flags, begin + x);
    }
    prev = state;
  }
}

// Up to `budget` more rows than the forced ones, drawn uniformly.
void Draw(std::vector<uint8_t>& flags, uint64_t seed, uint32_t stream, int64_t budget) {
  const auto total = static_cast<int64_t>(flags.size());
  int64_t count = std::count(flags.begin(), flags.end(), uint8_t{1});
  const int64_t target = count + budget;
  if (total <= target) {
    std::fill(flags.begin(), flags.end(), uint8_t{1});
    return;
  }
  // A bounded number of draws: repeats are possible, the result is the same everywhere.
  const int64_t draws = 4 * budget;
  for (int64_t n = 0; n < draws && count < target; ++n) {
    ElementStream es(seed, stream, static_cast<uint64_t>(n));
    const auto x = static_cast<size_t>(es.NextU64() % static_cast<uint64_t>(total));
    if (flags[x] == 0) {
      flags[x] = 1;
      ++count;
    }
  }
}

}  // namespace

std::vector<uint8_t> EmptyQueryRows(const Problem& p) {
  std::vector<uint8_t> out(static_cast<size_t>(p.TotalQ()), 0);
  MarkEmpty(p, BandOnly(p), true, out);
  return out;
}

std::vector<uint8_t> UnseenKeyRows(const Problem& p) {
  std::vector<uint8_t> out(static_cast<size_t>(p.TotalK()), 0);
  MarkEmpty(p, BandOnly(p), false, out);
  return out;
}

int64_t BandPairs(const Problem& p) {
  int64_t pairs = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    for (int64_t i = 0; i < mask.q_len(); ++i) {
      const auto [lo, hi] = mask.KeyBounds(i);
      pairs += std::max<int64_t>(0, hi - lo);
    }
  }
  return pairs;
}

double ForwardMacs(const Problem& p) {
  double dense = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence s = SequenceOf(p, b);
    dense += static_cast<double>(s.q_len) * static_cast<double>(s.k_len);
  }
  return std::max(static_cast<double>(BandPairs(p)), dense) * static_cast<double>(p.heads_q) *
         static_cast<double>(p.head_dim + p.head_dim_v);
}

bool ShouldSample(const Problem& p, double above) { return ForwardMacs(p) > above; }

std::string RowSample::Describe() const {
  return fmt::format("sampled: {} of {} query rows, {} of {} keys", queries, total_q, keys,
                     total_k);
}

RowSample SampleRows(const Problem& p, const SampleOptions& options) {
  RowSample s;
  s.total_q = p.TotalQ();
  s.total_k = p.TotalK();
  s.query_rows.assign(static_cast<size_t>(s.total_q), 0);
  s.key_rows.assign(static_cast<size_t>(s.total_k), 0);
  auto& qf = s.query_rows;
  auto& kf = s.key_rows;
  const uint32_t rules = options.rules;
  const Problem band_problem = BandOnly(p);

  std::vector<int64_t> q_tiles(std::begin(kSampleTiles), std::end(kSampleTiles));
  std::vector<int64_t> k_tiles = q_tiles;
  const OracleTiles oracle = AutoTiles(p);
  q_tiles.push_back(oracle.q);
  k_tiles.push_back(oracle.k);
  if (p.block_sparse) {
    q_tiles.push_back(p.block_sparse->block_q);
    k_tiles.push_back(p.block_sparse->block_k);
  }

  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView band(band_problem, b);
    const Sequence seq = band.sequence();
    if (rules & kRuleSequenceEdges) {
      if (seq.q_len > 0) {
        Set(qf, seq.q_begin);
        Set(qf, seq.q_begin + seq.q_len - 1);
      }
      if (seq.k_len > 0) {
        Set(kf, seq.k_begin);
        Set(kf, seq.k_begin + seq.k_len - 1);
      }
    }
    if ((rules & kRuleDocumentEdges) && p.document_ids_q && p.document_ids_k) {
      const auto& dq = (*p.document_ids_q)[static_cast<size_t>(b)];
      const auto& dk = (*p.document_ids_k)[static_cast<size_t>(b)];
      for (int64_t i = 1; i < seq.q_len; ++i) {
        if (dq[static_cast<size_t>(i)] == dq[static_cast<size_t>(i - 1)]) continue;
        Set(qf, seq.q_begin + i - 1);
        Set(qf, seq.q_begin + i);
      }
      for (int64_t j = 1; j < seq.k_len; ++j) {
        if (dk[static_cast<size_t>(j)] == dk[static_cast<size_t>(j - 1)]) continue;
        Set(kf, seq.k_begin + j - 1);
        Set(kf, seq.k_begin + j);
      }
    }
    if (rules & kRuleTileBoundaries) {
      for (int64_t t : q_tiles) MarkTiles(qf, seq.q_begin, seq.q_len, t);
      for (int64_t t : k_tiles) MarkTiles(kf, seq.k_begin, seq.k_len, t);
    }
    if (rules & kRuleBandEdges) {
      MarkBandEdges(qf, seq.q_begin, seq.q_len, seq.k_len,
                    [&](int64_t i) { return band.KeyBounds(i); });
      MarkBandEdges(kf, seq.k_begin, seq.k_len, seq.q_len,
                    [&](int64_t j) { return band.QueryBounds(j); });
      if (p.prefix_lm > 0 && p.prefix_lm <= seq.k_len) {
        Set(kf, seq.k_begin + p.prefix_lm - 1);
        if (p.prefix_lm < seq.k_len) Set(kf, seq.k_begin + p.prefix_lm);
      }
    }
  }
  if (rules & kRuleEmpty) {
    MarkEmpty(p, band_problem, true, qf);
    MarkEmpty(p, band_problem, false, kf);
  }
  if (rules & kRuleTensorEnd) {
    for (int64_t x = 1; x <= kLastRows; ++x) {
      Set(qf, s.total_q - x);
      Set(kf, s.total_k - x);
    }
  }
  if (rules & kRuleRandom) {
    Draw(qf, options.seed, kQueryStream, options.query_budget);
    Draw(kf, options.seed, kKeyStream, options.key_budget);
  }
  s.queries = std::count(qf.begin(), qf.end(), uint8_t{1});
  s.keys = std::count(kf.begin(), kf.end(), uint8_t{1});
  return s;
}

}  // namespace attest
