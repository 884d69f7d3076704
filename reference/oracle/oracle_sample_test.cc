// Sampled rows of the float64 oracle (oracle.h OracleOptions::query_rows, key_rows): on every
// feature problem, with small tiles so that there are many of them, and with one to four
// threads (one takes the forward-first path when there are fewer (batch, head) items than
// threads), what a sampled run computes is bitwise the whole run's value, and what it leaves
// out is NaN; the forward alone computes exactly the flagged rows, gathered into tiles. A
// sampled run that skips a tile it needs, or adds a tile in another order, fails here.
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_test_util.h"

namespace attest {
namespace {

using oracle_test::FeatureProblems;
using oracle_test::RandomInputs;

// Rows [b, e) of a [rows, heads, width] tensor against the whole run's: bitwise equal where
// `want`, NaN elsewhere.
void ExpectRows(const Tensor& got, const Tensor& whole, int64_t heads, int64_t width,
                const std::vector<uint8_t>& want, const std::string& what) {
  const double* g = got.data<double>();
  const double* w = whole.data<double>();
  for (size_t row = 0; row < want.size(); ++row) {
    for (int64_t e = 0; e < heads * width; ++e) {
      const size_t at = row * static_cast<size_t>(heads * width) + static_cast<size_t>(e);
      if (want[row]) {
        ASSERT_EQ(std::bit_cast<uint64_t>(g[at]), std::bit_cast<uint64_t>(w[at]))
            << what << " row " << row << " element " << e << ": " << g[at] << " vs " << w[at];
      } else {
        ASSERT_TRUE(std::isnan(g[at])) << what << " row " << row << " not NaN: " << g[at];
      }
    }
  }
}

// The rows whose tile holds a flagged row: what a sampled run computes.
std::vector<uint8_t> Covered(const Problem& p, const std::vector<uint8_t>& flags, bool keys,
                             int64_t tile) {
  std::vector<uint8_t> out(flags.size(), 0);
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence s = SequenceOf(p, b);
    const int64_t begin = keys ? s.k_begin : s.q_begin, len = keys ? s.k_len : s.q_len;
    for (int64_t t0 = 0; t0 < len; t0 += tile) {
      const int64_t n = std::min(tile, len - t0);
      bool any = false;
      for (int64_t r = 0; r < n; ++r) any = any || flags[static_cast<size_t>(begin + t0 + r)];
      for (int64_t r = 0; r < n; ++r) out[static_cast<size_t>(begin + t0 + r)] = any;
    }
  }
  return out;
}

// lse-layout values of the covered query rows: bitwise equal; NaN elsewhere.
void ExpectLse(const Problem& p, const Tensor& got, const Tensor& whole,
               const std::vector<uint8_t>& want, const std::string& what) {
  const double* g = got.data<double>();
  const double* w = whole.data<double>();
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence s = SequenceOf(p, b);
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t i = 0; i < s.q_len; ++i) {
        const int64_t at = p.varlen() ? h * p.TotalQ() + s.q_begin + i
                                      : (b * p.heads_q + h) * p.seqlen_q + i;
        if (want[static_cast<size_t>(s.q_begin + i)]) {
          ASSERT_EQ(std::bit_cast<uint64_t>(g[at]), std::bit_cast<uint64_t>(w[at])) << what;
        } else {
          ASSERT_TRUE(std::isnan(g[at])) << what << " b " << b << " h " << h << " i " << i;
        }
      }
    }
  }
}

TEST(OracleSample, SampledRowsAndKeysAreTheWholeRunsBitsAndTheRestIsNaN) {
  std::mt19937_64 rng(20261205);
  int cases = 0;
  for (const auto& [name, p, q_sigma] : FeatureProblems()) {
    const auto in = RandomInputs(p, 17, q_sigma);
    for (int threads : {1, 4}) {
      for (int64_t tile : {4, 8}) {
        OracleOptions whole_opts;
        whole_opts.threads = threads;
        whole_opts.tile_q = whole_opts.tile_k = tile;
        const BackwardOut whole = Backward<double>(p, in.q, in.k, in.v, in.dout, whole_opts);
        for (int trial = 0; trial < 3; ++trial) {
          std::vector<uint8_t> qf(static_cast<size_t>(p.TotalQ()));
          std::vector<uint8_t> kf(static_cast<size_t>(p.TotalK()));
          for (auto& f : qf) f = rng() % 7 == 0;
          for (auto& f : kf) f = trial == 2 ? 0 : rng() % 5 == 0;  // trial 2: rows only
          OracleOptions o = whole_opts;
          o.query_rows = &qf;
          o.key_rows = &kf;
          const std::string what = name + " threads " + std::to_string(threads) + " tile " +
                                   std::to_string(tile) + " trial " + std::to_string(trial);
          const BackwardOut got = Backward<double>(p, in.q, in.k, in.v, in.dout, o);
          const std::vector<uint8_t> rows = Covered(p, qf, false, tile);
          const std::vector<uint8_t> keys = Covered(p, kf, true, tile);
          ExpectRows(got.o, whole.o, p.heads_q, p.head_dim_v, rows, what + " o");
          ExpectRows(got.dq, whole.dq, p.heads_q, p.head_dim, rows, what + " dq");
          ExpectRows(got.dk, whole.dk, p.heads_kv, p.head_dim, keys, what + " dk");
          ExpectRows(got.dv, whole.dv, p.heads_kv, p.head_dim_v, keys, what + " dv");
          ExpectLse(p, got.lse, whole.lse, rows, what + " lse");
          ExpectLse(p, got.delta, whole.delta, rows, what + " delta");
          // The forward alone: o and lse of exactly the flagged rows (gathered tiles).
          const ForwardOut fwd = Forward<double>(p, in.q, in.k, in.v, o);
          ExpectRows(fwd.o, whole.o, p.heads_q, p.head_dim_v, qf, what + " forward o");
          ExpectLse(p, fwd.lse, whole.lse, qf, what + " forward lse");
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 100);
}

TEST(OracleSample, FlagsOfTheWrongLengthAreRefusedNamingTheField) {
  const Problem p = FeatureProblems()[0].p;
  const auto in = RandomInputs(p, 3);
  std::vector<uint8_t> short_flags(static_cast<size_t>(p.TotalQ() - 1), 1);
  OracleOptions o;
  o.query_rows = &short_flags;
  try {
    Forward<double>(p, in.q, in.k, in.v, o);
    FAIL() << "accepted " << short_flags.size() << " flags";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("query_rows"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attest
