// The attention oracle: forward and backward of exactly the semantics of
// reference/problem/problem.h and mask.h (docs/design.md "Semantics" and "Oracle"), in float64
// (oracle_double.cc: tiled over keys, register-blocked FMA products inside tiles
// (oracle_gemm.h), std::threads over batch x head x query tile in the forward and batch x
// head in the backward, compensated sums,
// O(tile_q x Sk) memory per thread, results bitwise independent of the thread count) and in
// boost::multiprecision (oracle_generic.h: MPFR at 128 and 257 bits) to certify the float64
// path and to produce golden files.
//
// Conventions (docs/design.md): q [B,Sq,Hq,D], k [B,Sk,Hkv,D], v [B,Sk,Hkv,Dv], o [B,Sq,Hq,Dv],
// lse [B,Hq,Sq] (natural log); packed varlen [total,H,*] with lse [Hq,total_q]. Query head h
// reads kv head h / (Hq/Hkv). Empty rows (no visible key): o = 0, lse = -inf, dq = 0,
// delta = 0; keys seen by no query: dk = dv = 0. Every output is f64 and contiguous; an MP
// result is computed entirely in MP and rounded once to double at the end.
//
// Inputs are f64 tensors of the problem's shapes (any strides) holding the values the
// kernel saw (already rounded to the problem's dtype). Backward differentiates the oracle's
// own forward (its own o and lse), never a kernel's.
//
// Certification (ErrorBound below): every run reports OracleStats, a handful of magnitudes
// from which a first-order worst-case bound on |computed - exact| follows for each output
// (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., §3.1: any order of a
// length-n sum or dot product errs by at most gamma_n = n*u/(1 - n*u) times the sum of
// absolute values). The float64 path's error against the MP path must stay within it.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "reference/problem/problem.h"
#include "reference/tensor.h"

namespace attest {

struct OracleOptions {
  int threads = 0;       // worker threads; 0: std::thread::hardware_concurrency()
  // Tiles of the float64 path: tile_q query rows per work item and per product, tile_k keys per
  // tile (the only score storage is tile_q x tile_k). 0 picks them from the problem
  // (AutoTiles below).
  int64_t tile_q = 0;
  int64_t tile_k = 0;
  // Backward of the float64 path: each worker keeps one query tile's transformed scores
  // (tile_q x Sk doubles, twice that with softcap) from that tile's forward and reuses them
  // instead of recomputing Q K^T (6 products per tile pair instead of 7), when they fit in
  // this many bytes; above it the scores are recomputed per tile, so memory stays
  // O(tile_q x Sk) per worker, never O(Sq x Sk). Results are bitwise the same either way
  // (the same product on the same operands; oracle_test checks it). 0: always recompute.
  int64_t score_cache_bytes = int64_t{64} << 20;
  // Sampled rows (float64 path; long problems, where the whole oracle would cost too much).
  // query_rows: [total_q] flags over the flattened query rows. The forward alone computes o
  // and lse of exactly the flagged rows (gathered into tiles of flagged rows, so its cost
  // follows their number); with the backward, o, lse, dq and delta are computed for every
  // query tile that holds a flagged row. Both leave NaN elsewhere. key_rows:
  // [total_k] flags over the key rows; with the backward, dk and dv are computed for every
  // key tile that holds a flagged key (which needs the forward of every query tile, for the
  // rows' lse and delta) and are NaN elsewhere. Unset (null) together: everything. What is
  // computed is bitwise what the whole run gives (the same tiles, products and order:
  // oracle_sample_test checks it); the statistics are those of the tiles computed.
  const std::vector<uint8_t>* query_rows = nullptr;
  const std::vector<uint8_t>* key_rows = nullptr;
  // The learnable sink (Problem::sink; docs/semantics.md "Learnable sink"): [Hq] f64, each
  // value finite or -inf. Required exactly when the problem has a sink. Each row's softmax
  // denominator gains exp(sink_h), lse includes it (a row with no visible key: o = 0,
  // lse = sink_h, no gradient), and the backward returns BackwardOut::dsink. A sampled
  // backward leaves dsink NaN (it needs every row).
  const Tensor* sink = nullptr;
  // The learnable relative bias (Problem::rel_bias; docs/semantics.md "Learnable relative
  // bias"): [Hq, seqlen_q + seqlen_k - 1] f64, finite. Required exactly when the problem has
  // one. Score (i, j) of head h gains rel_bias[h, i - j + seqlen_k - 1] after softcap and
  // ALiBi; the backward returns BackwardOut::drel_bias (NaN in a sampled backward).
  const Tensor* rel_bias = nullptr;
};

// The float64 path's tiles for `p` when OracleOptions leaves them 0: 128 x 128 for every
// mask. The fastest of the sizes tried with the panel products of oracle_gemm.h (64..256 x
// 64..512 at S = 4096, D = 64 and 128, causal and not; 128 x 128 also at S = 1024 and 8192;
// docs/bench-oracle.md): with no per-call packing to amortise, tiles whose P and dS stay in
// the core's L2 win over the larger tiles OpenBLAS needed (256 x 512 while it called dgemm).
struct OracleTiles {
  int64_t q = 0, k = 0;
};
OracleTiles AutoTiles(const Problem& p);

// Magnitudes that bound the rounding error of a run (all maxima over the whole problem,
// computed in double from the inputs and the exact-path intermediates). Notation used by
// ErrorBound: u = unit_roundoff, a = score_abs_max, V = v_norm_max, G = do_norm_max, c =
// col_mass_max, Lk = sum_len_k, Lq = sum_len_q.
struct OracleStats {
  double unit_roundoff = 0;  // u: 2^-53 (double), 2^-128 (mp128), 2^-257 (mp256)
  double scale = 0;          // the score scale used
  double softcap = 0;        // the problem's softcap (0: off)
  int64_t head_dim = 0;      // D: length of the q.k dot products
  int64_t head_dim_v = 0;    // Dv: length of the dO.v dot products
  // Forward.
  // a: max over visible (b, h, i, j) of |scale| * ||q_i||_2 * ||k_j||_2 + |ALiBi bias_ij|,
  // which bounds |scale * q.k| + |bias| (Cauchy-Schwarz): a score's rounding error is at
  // most ~(D + 4) u a, and exp() turns it into a relative error of the softmax weights.
  double score_abs_max = 0;
  double v_abs_max = 0;    // max |v| over all elements
  double v_norm_max = 0;   // V: max_j ||v_j||_2
  double k_abs_max = 0;    // max |k|
  double lse_abs_max = 0;  // max |lse| over non-empty rows
  int64_t max_keys = 0;    // most visible keys of one row
  int64_t sum_len_k = 0;   // Lk: longest accumulation chain over keys (per output element)
  int64_t empty_rows = 0;  // rows (b, h, i) with no visible key
  // Backward (zero after a forward-only run).
  double q_abs_max = 0;     // max |q|
  double do_abs_max = 0;    // max |dO|
  double do_norm_max = 0;   // G: max_i ||dO_i||_2
  double col_mass_max = 0;  // c: max over (b, kv head, j) of sum_{h in group, i} p_hij
  int64_t max_queries = 0;  // most (query, head) pairs that see one key
  int64_t sum_len_q = 0;    // Lq: longest accumulation chain over (query, head) pairs
  int64_t unseen_keys = 0;  // (b, kv head, j) seen by no query
  // Learnable sink (0 without one). The sink is a logit like a score: s_abs, the largest
  // finite |sink_h|, joins a in the bound, and a finite sink adds one term to sum_len_k.
  double sink_abs_max = 0;
  double sink_mass_max = 0;  // S: max_h sum over (b, i) of exp(sink_h - lse_i) (backward)
  int64_t sink_rows = 0;     // Ls: rows summed into one dsink (backward)
  // Learnable relative bias (0 without one): b_abs, the largest |rel_bias|, adds to a in the
  // bound (|s + b| <= a + b_abs) and its addition is one more rounding of each score.
  double rel_bias_abs_max = 0;
  double rel_bias_mass_max = 0;  // R: max over (h, diagonal) of sum_(b, i) p_ij (backward)
  int64_t rel_bias_terms = 0;    // Lr: most nonzero dS summed into one drel_bias (backward)
};

struct ForwardOut {
  Tensor o, lse;  // f64, contiguous, problem shapes
  OracleStats stats;
};

struct BackwardOut {
  Tensor dq, dk, dv;  // f64, contiguous, shapes of q, k, v
  // dsink [Hq] = -sum over batch and rows i of head h of exp(sink_h - lse_i) delta_i (0 for a
  // sink of -inf); undefined without a sink.
  Tensor dsink;
  // drel_bias [Hq, seqlen_q + seqlen_k - 1]: element (h, i - j + seqlen_k - 1) is the sum of
  // dS_ij of head h over batch and rows (per query head with GQA); undefined without it.
  Tensor drel_bias;
  Tensor delta;       // D_i = rowsum(dO_i * O_i), lse's shape (0 on empty rows)
  Tensor o, lse;      // the forward this backward differentiated
  OracleStats stats;
};

// Throws std::invalid_argument naming the tensor when shapes do not match the problem or the
// problem does not Validate (callers at the edges validate first and report an Error).
template <class T>
ForwardOut Forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                   const OracleOptions& options = {});
template <class T>
BackwardOut Backward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& dout, const OracleOptions& options = {});

// Defined (as explicit specializations) for double (oracle_double.cc: tiled, threads)
// and for Mp128 / Mp256 (oracle_mp128.cc, oracle_mp256.cc: the generic loop of
// oracle_generic.h); include oracle_mp.h to call the MP ones by type.
template <>
ForwardOut Forward<double>(const Problem&, const Tensor&, const Tensor&, const Tensor&,
                           const OracleOptions&);
template <>
BackwardOut Backward<double>(const Problem&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const OracleOptions&);

enum class Precision { kDouble, kMp128, kMp256 };
// "double" (also "f64"), "mp128", "mp256".
std::optional<Precision> ParsePrecision(std::string_view name);
std::string_view Name(Precision p);

ForwardOut Forward(Precision precision, const Problem& p, const Tensor& q, const Tensor& k,
                   const Tensor& v, const OracleOptions& options = {});
BackwardOut Backward(Precision precision, const Problem& p, const Tensor& q, const Tensor& k,
                     const Tensor& v, const Tensor& dout, const OracleOptions& options = {});

// The outputs a certification bound exists for.
enum class OracleTensor { kO, kLse, kDq, kDk, kDv, kDelta, kDsink, kDrelBias };
// "o", "lse", "dq", "dk", "dv", "delta", "dsink", "drel_bias"
std::string_view Name(OracleTensor t);

// A bound on max over elements of |computed - exact| (absolute, in the tensor's units) for
// the run that produced `stats`, including the final rounding of each output. Compare the
// float64 oracle with an MP result as
//   max|x_double - x_mp| <= ErrorBound(stats_double, t) + ErrorBound(stats_mp, t)
// (the MP term is negligible but keeps the statement exact). First-order worst-case, times
// a safety factor of 2 for the second-order terms; the derivation is in oracle_bound.cc.
// Empty rows are exact (0 and -inf) and excluded. Backward tensors need backward stats.
double ErrorBound(const OracleStats& stats, OracleTensor t);

}  // namespace attest
