// Sampled rows (docs/checks.md "Sampled rows"): for long problems, where the float64 oracle
// of every row would cost too much, checks judge a deterministic subset of the query rows and
// key rows. The subset always holds every row where kernels' bugs concentrate, found exactly
// from the mask rules of reference/problem/mask.h, and seeded random rows up to a budget:
//   - the first and last row of every sequence and of every document (document ids);
//   - both sides of every tile boundary, counted from each sequence's start
//     (reference/problem/tile_walk.h), for tiles of 64, 128 and 256 rows, the oracle's own
//     tiles (reference/oracle/oracle.h AutoTiles) and the block-sparse blocks;
//   - every empty row (no visible key) and every key seen by no query;
//   - both sides of every place where a row's band of visible keys (causal diagonal, window)
//     starts or stops being cut by the sequence's first or last key, and the same for keys'
//     bands of queries; both sides of the prefix-LM boundary;
//   - the last kLastRows rows of the whole query and key tensors;
//   - then up to a budget of further rows drawn from Philox streams (reference/data/generate.h
//     ElementStream) under the seed: the same seed gives the same sample everywhere.
// Flags are per flattened row ([total_q], [total_k]) and apply to every head, the form of
// OracleOptions::query_rows / key_rows. verify/metrics/sample_test.cc enumerates each rule by brute
// force over the mask and checks the sample holds it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/problem/problem.h"

namespace attest {

// Tile sizes whose boundaries are always sampled (kernels' usual tiles; the oracle's tiles
// and block-sparse blocks are added per problem).
inline constexpr int64_t kSampleTiles[] = {64, 128, 256};
// Rows at the end of the whole query and key tensors that are always sampled.
inline constexpr int64_t kLastRows = 3;

// The rules, one bit each, so that a test can show each one is needed (sample_test.cc).
enum SampleRule : uint32_t {
  kRuleSequenceEdges = 1u << 0,  // first and last row of every sequence
  kRuleDocumentEdges = 1u << 1,  // first and last row of every document
  kRuleTileBoundaries = 1u << 2,
  kRuleEmpty = 1u << 3,       // empty rows, unseen keys
  kRuleBandEdges = 1u << 4,   // band clipping transitions, prefix boundary
  kRuleTensorEnd = 1u << 5,   // last rows of the whole tensor
  kRuleRandom = 1u << 6,
  kAllSampleRules = (1u << 7) - 1,
};

struct SampleOptions {
  uint64_t seed = 0;
  // Random rows beyond the forced ones (query and key rows counted separately; fewer when
  // draws repeat a row, every row when the forced ones and the budget cover the tensor).
  int64_t query_budget = 1024;
  int64_t key_budget = 1024;
  uint32_t rules = kAllSampleRules;  // tests only remove rules
};

struct RowSample {
  std::vector<uint8_t> query_rows;  // [total_q], 1: sampled
  std::vector<uint8_t> key_rows;    // [total_k]
  int64_t queries = 0;              // how many flags are set
  int64_t keys = 0;
  int64_t total_q = 0, total_k = 0;
  // "sampled: N of M query rows, K of L keys".
  std::string Describe() const;
};

// The sample of `p` (which must Validate). Cost O(total rows x tiles) for interval masks,
// O(total rows x log) with document ids, O(rows x band) with block-sparse masks.
RowSample SampleRows(const Problem& p, const SampleOptions& options);

// Whether query row i of sequence b (local index) sees no key, and whether key j is seen by no
// query: exact, by the mask rules (the sampler's own implementation, shared with checks that
// need it; sample_test.cc compares it with MaskView::Visible by brute force).
std::vector<uint8_t> EmptyQueryRows(const Problem& p);  // [total_q]
std::vector<uint8_t> UnseenKeyRows(const Problem& p);   // [total_k]

// The sampling rule of checks (docs/checks.md "Sampled rows"): a case is sampled when judging
// every row costs more than `above` multiply-adds, counted from the sizes alone (so that the
// same case file is sampled the same way on every machine) as
//   max(BandPairs, sum over sequences of q_len x k_len) x heads_q x (D + Dv):
// the oracle's products over the pairs a row may see, or the same-precision baseline's
// (verify/tolerance/baseline.h), which scores every (query, key) pair of a sequence and holds them.
// kSampleAboveMacs is above every gate and full suite case (the largest, "2k causal GQA batch
// 2", is 1.7e10) and below every long suite case but the split-KV ones (at most 8.6e9).
inline constexpr double kSampleAboveMacs = 2e10;
// Random rows of a sampled case, on each side, beyond the forced ones (SampleOptions).
inline constexpr int64_t kSampleBudget = 1024;
// The cost above, and the rule.
double ForwardMacs(const Problem& p);
bool ShouldSample(const Problem& p, double above = kSampleAboveMacs);

// Pairs (query row, key) that some head sees, summed over sequences, from the rows' interval
// bounds (an upper bound with document, prefix or block-sparse rules): the cost measure of
// the sampling rule (verify/checks/check.h CheckContext).
int64_t BandPairs(const Problem& p);

}  // namespace attest
