// Pieces shared by the oracle's float64 and multiprecision paths (oracle.h): input checks,
// index arithmetic of the docs/design.md layouts, input magnitudes for OracleStats, and the
// deterministic work distribution. Not part of the public API.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "reference/oracle/oracle.h"
#include "reference/problem/mask.h"

namespace attest::oracle_internal {

// Validated, contiguous f64 inputs (a strided input is copied once).
struct Inputs {
  Tensor q, k, v, dout;  // dout undefined for a forward
  std::vector<double> sink;  // [Hq] when Problem::sink (finite or -inf), else empty
  bool HasSink() const { return !sink.empty(); }
  // [Hq, W] row-major (W = Problem::RelBiasWidth) when Problem::rel_bias, else empty.
  std::vector<double> rel_bias;
  bool rel_bias_on = false;
  bool HasRelBias() const { return rel_bias_on; }
  const double* Q() const { return q.data<double>(); }
  const double* K() const { return k.data<double>(); }
  const double* V() const { return v.data<double>(); }
  const double* DO() const { return dout.data<double>(); }
};
// Throws std::invalid_argument (naming the problem field or tensor) on a bad problem, wrong
// shapes or a non-f64 tensor; `sink` and `rel_bias` are OracleOptions::sink, rel_bias.
Inputs CheckInputs(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor* dout, const Tensor* sink = nullptr,
                   const Tensor* rel_bias = nullptr);
// The largest |rel_bias| (0 without one): OracleStats::rel_bias_abs_max.
double RelBiasAbsMax(const Inputs& in);
// The largest finite |sink_h| (0 without a sink), and whether any sink is finite
// (OracleStats::sink_abs_max; a finite sink lengthens the denominator's sum by one term).
double SinkAbsMax(const Inputs& in);
bool AnyFiniteSink(const Inputs& in);

// Element offsets in the contiguous layouts. `row` is the token row of the flattened
// sequence axis (Sequence::q_begin + i, or k_begin + j): padded [B, S, H, X] and packed
// [total, H, X] both flatten to [rows, H, X].
inline int64_t RowOffset(int64_t row, int64_t heads, int64_t head, int64_t width) {
  return (row * heads + head) * width;
}
// lse [B, Hq, Sq] or, packed, [Hq, total_q].
inline int64_t LseOffset(const Problem& p, int64_t b, int64_t h, const Sequence& seq, int64_t i) {
  if (p.varlen()) return h * p.TotalQ() + seq.q_begin + i;
  return (b * p.heads_q + h) * p.seqlen_q + i;
}

// Per-row 2-norms of q/k/v/dO ([rows * heads]) and global max-abs: the input magnitudes the
// certification bound needs (OracleStats).
struct Norms {
  std::vector<double> q, k, v, dout;  // ||x_row,head||_2
  double q_abs = 0, k_abs = 0, v_abs = 0, do_abs = 0;
  double v_norm = 0, do_norm = 0;
};
Norms ComputeNorms(const Problem& p, const Inputs& in);

// One MaskView per batch entry (built once, read by every worker).
std::vector<MaskView> MaskViews(const Problem& p);

inline double AlibiSlope(const Problem& p, int64_t h) {
  return p.alibi_slopes ? (*p.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
}

// Worker count for `options` (0: hardware concurrency), at most `items`, at least 1.
int ThreadCount(const OracleOptions& options, int64_t items);
// The same for a bare thread count (0: hardware concurrency); the default `items` leaves it
// unclamped.
int ThreadCount(int threads, int64_t items = std::numeric_limits<int64_t>::max());
// Runs fn(item, worker) for every item in [0, items) on `threads` std::threads (the
// calling thread included). Items are claimed dynamically, so results must depend only on
// the item, never on the worker: every item writes disjoint outputs, and per-worker
// partial statistics are merged with order-independent operations (max, integer sums).
// The first exception thrown by fn is rethrown after all workers stop. `worker_exit`, if
// set, runs on each spawned thread before it ends (MPFR frees its per-thread caches there).
void ParallelFor(int64_t items, int threads, const std::function<void(int64_t, int)>& fn,
                 const std::function<void()>& worker_exit = {});

// Order-independent merge of per-worker statistics (maxima and integer sums).
void MergeStats(OracleStats& into, const OracleStats& from);

}  // namespace attest::oracle_internal
