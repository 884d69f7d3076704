// Error metrics of an observed tensor against a reference (docs/design.md
// "Checks"): per tensor and per row, max abs, relative L2, ULP error in the output format,
// cosine, signed bias, non-finite mismatches, and the worst location named (b, h, i, d).
// Per-element and per-row metrics exist because norm-only comparisons miss an element
// permutation that keeps the norm (flash-attention PR #2553), and non-finite values are
// counted separately because a NaN slipping through a max() silently passes
// (tracel-ai/cubecl PR #1070).
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "reference/formats/format.h"
#include "reference/problem/problem.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

// What each axis of an attention tensor means, so that a flat index can be reported as
// (b, h, i, d). kToken is the packed varlen axis (total tokens), resolved to (b = sequence,
// i = position in it) through cu_seqlens.
enum class AxisRole : uint8_t { kBatch, kToken, kHead, kSeq, kDim, kOther };

struct Layout {
  std::vector<AxisRole> axes;       // one per tensor axis
  std::vector<int32_t> cu_seqlens;  // for kToken: batch + 1 offsets starting at 0
  // The name of the sequence coordinate in messages: "i" for query-indexed tensors (o, lse,
  // dq), "j" for key-indexed ones (dk, dv).
  std::string seq_name = "i";

  // A layout for a tensor without attention semantics: every axis kOther (locations then
  // carry only the flat index).
  static Layout Flat(int64_t rank);
};

// The layout of a named tensor of problem `p`: o, dq, q, do [B,S,H,D]; k, v, dk, dv
// [B,Sk,Hkv,D]; lse, delta [B,H,S]; packed varlen [total,H,D] and lse [H,total_q].
// Unknown names give Flat.
Layout LayoutOf(const Problem& p, std::string_view tensor);

// Where an element lies: coordinates are -1 where the tensor has no such axis (lse has no
// d; a row location has no d). `flat` is the row-major index in the tensor (-1 for a row).
struct Location {
  int64_t b = -1, h = -1, i = -1, d = -1;
  int64_t flat = -1;
  double observed = std::numeric_limits<double>::quiet_NaN();
  double reference = std::numeric_limits<double>::quiet_NaN();
  std::string seq_name = "i";

  // "(b=0, h=1, i=5, d=3)"; "[17]" when no coordinate is known.
  std::string Coordinates() const;
  // Coordinates plus values: "(b=0, h=1, i=5, d=3) observed 0.1234 reference 0.1229".
  std::string ToString() const;
};

// Coordinates of element `index` (a full index into a tensor of this layout).
Location Locate(const Layout& layout, std::span<const int64_t> index);

// ---- ULP arithmetic in any format (generic over reference/formats/format.h's FormatSpec) ----

// The spacing of `f`'s representable values at |x| (its ULP there): 2^(max(e, emin) - m) for
// |x| in [2^e, 2^(e+1)), so subnormals and zero get the smallest spacing and the result is
// never 0. Beyond the largest finite value the top binade's spacing continues.
double Quantum(double x, Format f);
// Distance between a and b in representable steps of `f`, fractional when a value is not
// representable: the difference of their continuous ordinals, where ord(x) is the number of
// steps from 0 to x (ord(-x) = -ord(x), so +0 and -0 are 0 apart and the smallest subnormals
// of opposite sign are 2 apart). Both arguments must be finite.
double UlpDistance(double a, double b, Format f);

// ---- Metrics ----

// A row is one vector along the tensor's d axis (one (b, h, i) vector of o, dq, dk, dv).
// lse has no d axis: there a row is one (b, h) vector along the sequence (split at sequence
// boundaries when packed).
struct RowMetrics {
  Location where;  // the row's coordinates (d, or the sequence index for lse, is -1)
  int64_t length = 0;
  int64_t nonfinite_mismatches = 0;
  double max_abs_error = 0;
  double ref_max_abs = 0;
  double err_l2 = 0, ref_l2 = 0, obs_l2 = 0, dot = 0;
  // The magnitude of the terms summed into this row (verify/tolerance/term_scale.h: dq, dk), 0 where
  // unknown. A cancelled row (exact dq = 0 with one visible key) has ref_max_abs 0 but terms
  // of the size of its inputs; FloorScale::kTerms puts the ULP floor there.
  double term_scale = 0;

  double RelL2() const;   // err_l2 / ref_l2 (0 when both are 0, inf when only ref_l2 is)
  double Cosine() const;  // dot / (|obs| |ref|): 1 when both are 0, 0 when one is
};

struct CompareOptions {
  // A kernel may declare lse = +inf for empty rows (docs/design.md "Empty rows"): then +inf
  // observed against a -inf reference is a match.
  bool allow_pos_inf_for_neg_inf = false;
  // Worker threads for the per-element pass (0: all cores); the metrics are the same for
  // every count.
  int threads = 1;
};

struct TensorMetrics {
  std::string tensor;            // "o", "lse", ...
  Format format = Format::kF64;  // the output format ULPs are counted in
  Layout layout;
  Shape shape;
  int64_t elements = 0;
  int64_t compared = 0;  // finite pairs that enter the error statistics

  // Over finite pairs.
  double max_abs_error = 0;
  Location worst_abs;
  double ref_max_abs = 0;
  double err_l2 = 0, ref_l2 = 0, obs_l2 = 0, dot = 0;
  double rel_l2 = 0;
  double cosine = 1;
  double max_ulp = 0;
  Location worst_ulp;
  // Signed bias: mean error / rms error, in [-1, 1]. Unbiased rounding gives about
  // ±1/sqrt(n); a systematic bias (round toward zero where RNE was meant: the
  // composable_kernel conversion bug in docs/references.md) stays near ±1 while every element is
  // within one ULP.
  double mean_error = 0, rms_error = 0, bias = 0;

  // Non-finite values: an observed NaN/Inf where the reference is finite, a finite value
  // where the reference is ±inf (other than the declared lse alias), opposite infinities,
  // and every reference NaN (the oracle never produces NaN: a NaN reference means the
  // comparison itself is broken and must not pass).
  int64_t nonfinite_mismatches = 0;
  int64_t reference_nans = 0;
  int64_t matched_nonfinite = 0;  // equal infinities (empty-row lse)
  Location first_nonfinite;

  std::vector<RowMetrics> rows;
  double min_row_cosine = 1;
  Location worst_row_cosine;
  double max_row_rel_l2 = 0;
  Location worst_row_rel_l2;

  // The compared tensors (f64, contiguous; copies share storage), so that policies that
  // need every element (per-element bounds) can be evaluated later.
  Tensor observed, reference;
  CompareOptions options;

  // Index of the row holding flat element `flat` (rows are contiguous runs).
  int64_t RowOf(int64_t flat) const;
  std::vector<int64_t> row_begin;  // flat index of each row's first element
  // Whether SetRowTermScales filled rows[].term_scale.
  bool has_term_scale = false;
  // Per-element rounding floors (verify/tolerance/term_scale.h ComputeRoundingFloors; f64, contiguous,
  // `elements` values in flat order), undefined unless SetRoundingFloor filled them.
  Tensor rounding_floor;
  // What the kernel's declared approximations add to every element's bound (kernels/kernel.h
  // Capabilities::softcap_tanh_abs_error: softcap x the tanh error on lse), added to
  // kBaselineRatio's bound and named in its message; 0 when nothing is declared.
  double declared_allowance = 0;
  std::string declared_note;  // "softcap 2.5 x declared tanh error 7.98e-06"
};

// Fills rows[r].term_scale from `terms` (verify/tolerance/term_scale.h GradientTermScales::dq or ::dk):
// one value per row of a tensor whose last axis is the row (d) axis, row r taking
// terms[row_begin[r] / row length]. Errors name the tensor when the counts do not match.
Status SetRowTermScales(TensorMetrics& m, const Tensor& terms);
// Sets m.rounding_floor from `floor` (any float dtype, m's element count, flat order);
// errors name the tensor when the counts differ.
Status SetRoundingFloor(TensorMetrics& m, const Tensor& floor);

// Compares two tensors of equal shape (any float dtype, any strides; widened exactly).
// Errors name the tensor when the shapes differ or the layout does not fit the shape.
Expected<TensorMetrics> Compare(std::string_view tensor, const Tensor& observed,
                                const Tensor& reference, Format output_format, const Layout& layout,
                                const CompareOptions& options = {});

// Whether an (observed, reference) pair is a matched non-finite pair / a mismatch under
// these options (the rule Compare applies element by element).
enum class PairKind { kFinite, kMatchedNonFinite, kMismatch };
PairKind ClassifyPair(double observed, double reference, const CompareOptions& options);

}  // namespace attest
