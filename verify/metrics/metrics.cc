// Error metrics of an observed tensor against a reference (see metrics.h).
#include "verify/metrics/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>

#include "reference/oracle/oracle_internal.h"

namespace attest {
namespace {

// |x| as a continuous count of steps of `f` from zero: `whole + frac` with frac in [0, 1).
// Split so that f64's ordinals (up to ~2^63) keep their fraction.
struct Ordinal {
  int64_t whole = 0;
  double frac = 0;
};

Ordinal MagnitudeOrdinal(double ax, const FormatSpec& spec) {
  if (ax == 0) return {};
  const int m = spec.mantissa_bits;
  const int emin = spec.min_normal_exponent();
  int big_e = 0;
  const double f = std::frexp(ax, &big_e);  // ax = f * 2^big_e, f in [0.5, 1)
  const int e = big_e - 1;                  // ax in [2^e, 2^(e+1))
  double t;
  int64_t base = 0;
  if (e < emin) {
    // 1. Below the smallest normal binade: steps of 2^(emin - m) from zero (subnormals; for
    //    formats without subnormals the same linear continuation).
    t = std::ldexp(ax, m - emin);
  } else {
    // 2. Binade e holds 2^m steps; binades emin..e-1 and the subnormal range precede it.
    t = std::ldexp(2 * f, m);  // in [2^m, 2^(m+1)), exact
    base = static_cast<int64_t>(e - emin) << m;
  }
  const double w = std::floor(t);
  return {base + static_cast<int64_t>(w), t - w};
}

}  // namespace

Layout Layout::Flat(int64_t rank) {
  Layout l;
  l.axes.assign(static_cast<size_t>(rank), AxisRole::kOther);
  return l;
}

Layout LayoutOf(const Problem& p, std::string_view tensor) {
  const bool query_side = tensor == "o" || tensor == "lse" || tensor == "dq" || tensor == "q" ||
                          tensor == "do" || tensor == "delta";
  const bool key_side = tensor == "k" || tensor == "v" || tensor == "dk" || tensor == "dv";
  if (!query_side && !key_side) return Layout::Flat(0);
  Layout l;
  l.seq_name = query_side ? "i" : "j";
  const bool row_vector = tensor == "lse" || tensor == "delta";
  if (p.varlen()) {
    l.cu_seqlens = query_side ? *p.cu_seqlens_q : *p.cu_seqlens_k;
    if (row_vector) {
      l.axes = {AxisRole::kHead, AxisRole::kToken};
    } else {
      l.axes = {AxisRole::kToken, AxisRole::kHead, AxisRole::kDim};
    }
  } else if (row_vector) {
    l.axes = {AxisRole::kBatch, AxisRole::kHead, AxisRole::kSeq};
  } else {
    l.axes = {AxisRole::kBatch, AxisRole::kSeq, AxisRole::kHead, AxisRole::kDim};
  }
  return l;
}

std::string Location::Coordinates() const {
  std::string out;
  auto add = [&](std::string_view name, int64_t v) {
    if (v < 0) return;
    out += out.empty() ? "(" : ", ";
    out += fmt::format("{}={}", name, v);
  };
  add("b", b);
  add("h", h);
  add(seq_name, i);
  add("d", d);
  if (out.empty()) return flat >= 0 ? fmt::format("[{}]", flat) : std::string("(whole tensor)");
  return out + ")";
}

std::string Location::ToString() const {
  std::string out = Coordinates();
  if (!std::isnan(observed) || !std::isnan(reference)) {
    out += fmt::format(" observed {:.9g} reference {:.9g}", observed, reference);
  }
  return out;
}

Location Locate(const Layout& layout, std::span<const int64_t> index) {
  Location loc;
  loc.seq_name = layout.seq_name;
  const size_t n = std::min(index.size(), layout.axes.size());
  for (size_t a = 0; a < n; ++a) {
    const int64_t v = index[a];
    switch (layout.axes[a]) {
      case AxisRole::kBatch:
        loc.b = v;
        break;
      case AxisRole::kHead:
        loc.h = v;
        break;
      case AxisRole::kSeq:
        loc.i = v;
        break;
      case AxisRole::kDim:
        loc.d = v;
        break;
      case AxisRole::kToken: {
        const auto& cu = layout.cu_seqlens;
        // Sequence b holds tokens [cu[b], cu[b+1]); zero-length sequences own no token, so
        // the last b with cu[b] <= v is the right one.
        const auto it = std::upper_bound(cu.begin(), cu.end(), v);
        if (it != cu.begin() && it != cu.end()) {
          loc.b = static_cast<int64_t>(it - cu.begin()) - 1;
          loc.i = v - cu[static_cast<size_t>(loc.b)];
        }
        break;
      }
      case AxisRole::kOther:
        break;
    }
  }
  return loc;
}

double Quantum(double x, Format f) {
  const FormatSpec& spec = Spec(f);
  const double ax = std::fabs(x);
  if (std::isnan(ax) || std::isinf(ax)) return ax;
  const int m = spec.mantissa_bits;
  const int emin = spec.min_normal_exponent();
  int big_e = 0;
  std::frexp(ax, &big_e);
  const int e = ax == 0 ? emin : std::max(big_e - 1, emin);
  return std::ldexp(1.0, e - m);
}

double UlpDistance(double a, double b, Format f) {
  assert(std::isfinite(a) && std::isfinite(b));
  const FormatSpec& spec = Spec(f);
  const Ordinal oa = MagnitudeOrdinal(std::fabs(a), spec);
  const Ordinal ob = MagnitudeOrdinal(std::fabs(b), spec);
  // Zeros count as either sign: their ordinal is 0.
  const bool same_side = std::signbit(a) == std::signbit(b) || a == 0 || b == 0;
  double d;
  if (same_side) {
    d = static_cast<double>(oa.whole - ob.whole) + (oa.frac - ob.frac);
  } else {
    // Summed in double: two f64 ordinals (each up to ~2^62.9) overflow int64 (UBSan saw it
    // in an audit of a kernel that returned values of opposite sign near the f64 range).
    d = static_cast<double>(oa.whole) + static_cast<double>(ob.whole) + (oa.frac + ob.frac);
  }
  return std::fabs(d);
}

double RowMetrics::RelL2() const {
  if (ref_l2 == 0) return err_l2 == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return err_l2 / ref_l2;
}

double RowMetrics::Cosine() const {
  if (obs_l2 == 0 && ref_l2 == 0) return 1.0;
  if (obs_l2 == 0 || ref_l2 == 0) return 0.0;
  return dot / (obs_l2 * ref_l2);
}

PairKind ClassifyPair(double observed, double reference, const CompareOptions& options) {
  if (std::isnan(reference)) return PairKind::kMismatch;
  if (std::isfinite(reference)) {
    return std::isfinite(observed) ? PairKind::kFinite : PairKind::kMismatch;
  }
  if (observed == reference) return PairKind::kMatchedNonFinite;
  if (options.allow_pos_inf_for_neg_inf && reference < 0 && observed > 0 && std::isinf(observed)) {
    return PairKind::kMatchedNonFinite;
  }
  return PairKind::kMismatch;
}

int64_t TensorMetrics::RowOf(int64_t flat) const {
  const auto it = std::upper_bound(row_begin.begin(), row_begin.end(), flat);
  return static_cast<int64_t>(it - row_begin.begin()) - 1;
}

namespace {

// Compare's inputs checked against each other; the layout to use (a flat one when `layout`
// names no axes).
Expected<Layout> CheckedLayout(std::string_view tensor, const Tensor& observed,
                               const Tensor& reference, const Layout& layout) {
  if (!observed.defined() || !reference.defined()) {
    return Error{fmt::format("tensor '{}': {} tensor is undefined", tensor,
                             observed.defined() ? "reference" : "observed")};
  }
  if (observed.shape() != reference.shape()) {
    return Error{fmt::format("tensor '{}': observed shape {} differs from the reference's {}",
                             tensor, observed.Describe(), reference.Describe())};
  }
  if (!Info(observed.dtype()).is_float || !Info(reference.dtype()).is_float) {
    return Error{fmt::format("tensor '{}': observed {} and reference {} must be float tensors",
                             tensor, observed.Describe(), reference.Describe())};
  }
  Layout lay = layout;
  if (lay.axes.empty()) lay = Layout::Flat(observed.rank());
  if (static_cast<int64_t>(lay.axes.size()) != observed.rank()) {
    return Error{fmt::format("tensor '{}': layout names {} axes but the tensor is {}", tensor,
                             lay.axes.size(), observed.Describe())};
  }
  for (size_t a = 0; a < lay.axes.size(); ++a) {
    if (lay.axes[a] == AxisRole::kToken &&
        (lay.cu_seqlens.empty() ||
         lay.cu_seqlens.back() != observed.dim(static_cast<int64_t>(a)))) {
      return Error{
          fmt::format("tensor '{}': packed axis {} has {} tokens but cu_seqlens ends at {}", tensor,
                      a, observed.dim(static_cast<int64_t>(a)),
                      lay.cu_seqlens.empty() ? -1 : lay.cu_seqlens.back())};
    }
  }
  return lay;
}

// The row axis: the d axis, else the sequence axis (lse), else the last axis. A row is a
// maximal run of consecutive elements whose other coordinates (and sequence) agree.
int64_t RowAxisOf(const Layout& lay) {
  const auto rank = static_cast<int64_t>(lay.axes.size());
  int64_t row_axis = rank - 1;
  for (int64_t a = rank - 1; a >= 0; --a) {
    if (lay.axes[static_cast<size_t>(a)] == AxisRole::kDim) {
      row_axis = a;
      break;
    }
  }
  if (row_axis < 0 || lay.axes[static_cast<size_t>(row_axis)] != AxisRole::kDim) {
    for (int64_t a = rank - 1; a >= 0; --a) {
      const AxisRole r = lay.axes[static_cast<size_t>(a)];
      if (r == AxisRole::kSeq || r == AxisRole::kToken) {
        row_axis = a;
        break;
      }
    }
  }
  return row_axis;
}

// What the per-element pass finds over a piece of the flat elements: rows, counts, maxima and
// their locations.
struct Part {
  std::vector<RowMetrics> rows;
  std::vector<int64_t> row_begin;
  int64_t compared = 0, nonfinite_mismatches = 0, reference_nans = 0, matched_nonfinite = 0;
  double max_abs_error = 0, ref_max_abs = 0, max_ulp = 0;
  Location worst_abs, worst_ulp, first_nonfinite;
};

// The per-element pass over flat elements [f0, f1) of m's tensors. A new row starts where an
// index other than the row axis's changes, or, on a packed token axis, the sequence (Locate's
// b); a Location is built only where one is stored.
class ElementPass {
 public:
  ElementPass(const TensorMetrics& m, int64_t row_axis, Format output_format,
              const CompareOptions& options)
      : m_(m),
        lay_(m.layout),
        rank_(static_cast<int64_t>(m.layout.axes.size())),
        row_axis_(row_axis),
        output_format_(output_format),
        options_(options),
        obs_(m.observed.data<double>()),
        ref_(m.reference.data<double>()),
        cu_(m.layout.cu_seqlens) {
    for (int64_t a = 0; a < rank_; ++a) {
      if (lay_.axes[static_cast<size_t>(a)] == AxisRole::kToken) token_axis_ = a;
    }
  }

  void Run(int64_t f0, int64_t f1, Part& part) const {
    if (f0 >= f1) return;  // (an empty tensor may have an extent 0)
    std::vector<int64_t> index(static_cast<size_t>(rank_), 0);
    for (int64_t a = rank_ - 1, f = f0; a >= 0; --a) {
      const int64_t extent = m_.shape[static_cast<size_t>(a)];
      index[static_cast<size_t>(a)] = f % extent;
      f /= extent;
    }
    std::vector<int64_t> prev_key(static_cast<size_t>(rank_), -1);
    int64_t prev_b = -1;
    size_t cb = 0;  // cached sequence of the token axis: cu[cb] <= token < cu[cb + 1]
    for (int64_t flat = f0; flat < f1; ++flat) {
      const double o = obs_[flat];
      const double r = ref_[flat];
      const int64_t b_key = TokenSequence(index, cb);
      bool new_row = part.rows.empty() || b_key != prev_b;
      for (int64_t a = 0; a < rank_ && !new_row; ++a) {
        const auto ua = static_cast<size_t>(a);
        new_row = a != row_axis_ && index[ua] != prev_key[ua];
      }
      if (new_row) {
        part.rows.push_back(NewRow(index, flat));
        part.row_begin.push_back(flat);
        prev_key = index;
        prev_b = b_key;
      }
      RowMetrics& row = part.rows.back();
      ++row.length;
      AddPair(index, flat, o, r, part, row);
      for (int64_t a = rank_ - 1; a >= 0; --a) {
        if (++index[static_cast<size_t>(a)] < m_.shape[static_cast<size_t>(a)]) break;
        index[static_cast<size_t>(a)] = 0;
      }
    }
  }

 private:
  Location Locate(const std::vector<int64_t>& index, int64_t flat) const {
    Location loc = attest::Locate(lay_, index);
    loc.flat = flat;
    return loc;
  }

  // The sequence of a token axis as Locate finds it: the last b with cu[b] <= token
  // (sequences of zero length own no token); -1 without a token axis.
  int64_t TokenSequence(const std::vector<int64_t>& index, size_t& cb) const {
    int64_t b_key = -1;
    if (token_axis_ >= 0) {
      const int64_t v = index[static_cast<size_t>(token_axis_)];
      if (!(cb + 1 < cu_.size() && cu_[cb] <= v && v < cu_[cb + 1])) {
        const auto it = std::upper_bound(cu_.begin(), cu_.end(), v);
        cb = it == cu_.begin() || it == cu_.end() ? cu_.size()
                                                  : static_cast<size_t>(it - cu_.begin()) - 1;
      }
      b_key = cb < cu_.size() ? static_cast<int64_t>(cb) : -1;
    }
    return b_key;
  }

  // A row starting at `flat`: its location without the row axis's coordinate.
  RowMetrics NewRow(const std::vector<int64_t>& index, int64_t flat) const {
    RowMetrics row;
    row.where = Locate(index, flat);
    row.where.flat = -1;
    row.where.observed = row.where.reference = std::numeric_limits<double>::quiet_NaN();
    if (row_axis_ >= 0) {
      switch (lay_.axes[static_cast<size_t>(row_axis_)]) {
        case AxisRole::kDim:
          row.where.d = -1;
          break;
        case AxisRole::kSeq:
        case AxisRole::kToken:
          row.where.i = -1;
          break;
        default:
          break;
      }
    }
    return row;
  }

  // The pair (o, r) of element `flat` into the piece's counts and maxima and its row's sums.
  void AddPair(const std::vector<int64_t>& index, int64_t flat, double o, double r, Part& part,
               RowMetrics& row) const {
    const auto where = [&] {
      Location loc = Locate(index, flat);
      loc.observed = o;
      loc.reference = r;
      return loc;
    };
    switch (ClassifyPair(o, r, options_)) {
      case PairKind::kMismatch:
        if (part.nonfinite_mismatches == 0) part.first_nonfinite = where();
        ++part.nonfinite_mismatches;
        ++row.nonfinite_mismatches;
        if (std::isnan(r)) ++part.reference_nans;
        break;
      case PairKind::kMatchedNonFinite:
        ++part.matched_nonfinite;
        break;
      case PairKind::kFinite: {
        ++part.compared;
        const double e = o - r;
        const double ae = std::fabs(e);
        if (ae > part.max_abs_error || part.compared == 1) {
          part.max_abs_error = ae;
          part.worst_abs = where();
        }
        part.ref_max_abs = std::max(part.ref_max_abs, std::fabs(r));
        const double ulp = UlpDistance(o, r, output_format_);
        if (ulp > part.max_ulp || part.compared == 1) {
          part.max_ulp = ulp;
          part.worst_ulp = where();
        }
        row.max_abs_error = std::max(row.max_abs_error, ae);
        row.ref_max_abs = std::max(row.ref_max_abs, std::fabs(r));
        row.err_l2 += e * e;
        row.ref_l2 += r * r;
        row.obs_l2 += o * o;
        row.dot += o * r;
        break;
      }
    }
  }

  const TensorMetrics& m_;
  const Layout& lay_;
  const int64_t rank_;
  const int64_t row_axis_;
  const Format output_format_;
  const CompareOptions& options_;
  const double* obs_;
  const double* ref_;
  const std::vector<int32_t>& cu_;
  int64_t token_axis_ = -1;
};

// The pieces' counts, maxima and rows into m, in order.
void MergeParts(std::vector<Part>& parts, TensorMetrics& m) {
  for (Part& part : parts) {
    if (part.nonfinite_mismatches > 0 && m.nonfinite_mismatches == 0) {
      m.first_nonfinite = part.first_nonfinite;
    }
    if (part.compared > 0 && (m.compared == 0 || part.max_abs_error > m.max_abs_error)) {
      m.max_abs_error = part.max_abs_error;
      m.worst_abs = part.worst_abs;
    }
    if (part.compared > 0 && (m.compared == 0 || part.max_ulp > m.max_ulp)) {
      m.max_ulp = part.max_ulp;
      m.worst_ulp = part.worst_ulp;
    }
    m.ref_max_abs = std::max(m.ref_max_abs, part.ref_max_abs);
    m.compared += part.compared;
    m.nonfinite_mismatches += part.nonfinite_mismatches;
    m.reference_nans += part.reference_nans;
    m.matched_nonfinite += part.matched_nonfinite;
    m.rows.insert(m.rows.end(), part.rows.begin(), part.rows.end());
    m.row_begin.insert(m.row_begin.end(), part.row_begin.begin(), part.row_begin.end());
  }
}

// The whole tensor's sums, in element order; returns the sum of the errors.
double WholeSums(TensorMetrics& m, const CompareOptions& options) {
  const double* obs = m.observed.data<double>();
  const double* ref = m.reference.data<double>();
  double sum_err = 0;
  for (int64_t flat = 0; flat < m.elements; ++flat) {
    const double o = obs[flat];
    const double r = ref[flat];
    if (ClassifyPair(o, r, options) != PairKind::kFinite) continue;
    const double e = o - r;
    sum_err += e;
    m.err_l2 += e * e;
    m.ref_l2 += r * r;
    m.obs_l2 += o * o;
    m.dot += o * r;
  }
  return sum_err;
}

// Squared sums become norms; the whole tensor's and the rows' summary statistics.
void Finish(TensorMetrics& m, double sum_err) {
  const auto finish = [](auto& x) {
    x.err_l2 = std::sqrt(x.err_l2);
    x.ref_l2 = std::sqrt(x.ref_l2);
    x.obs_l2 = std::sqrt(x.obs_l2);
  };
  RowMetrics whole;
  whole.err_l2 = m.err_l2;
  whole.ref_l2 = m.ref_l2;
  whole.obs_l2 = m.obs_l2;
  whole.dot = m.dot;
  finish(whole);
  m.err_l2 = whole.err_l2;
  m.ref_l2 = whole.ref_l2;
  m.obs_l2 = whole.obs_l2;
  m.rel_l2 = whole.RelL2();
  m.cosine = whole.Cosine();
  if (m.compared > 0) {
    const auto n = static_cast<double>(m.compared);
    m.mean_error = sum_err / n;
    m.rms_error = m.err_l2 / std::sqrt(n);
    m.bias = m.rms_error > 0 ? m.mean_error / m.rms_error : 0.0;
  }
  bool first_row = true;
  for (RowMetrics& row : m.rows) {
    finish(row);
    const double c = row.Cosine();
    const double rl = row.RelL2();
    if (first_row || c < m.min_row_cosine) {
      m.min_row_cosine = c;
      m.worst_row_cosine = row.where;
    }
    if (first_row || rl > m.max_row_rel_l2) {
      m.max_row_rel_l2 = rl;
      m.worst_row_rel_l2 = row.where;
    }
    first_row = false;
  }
}

}  // namespace

Expected<TensorMetrics> Compare(std::string_view tensor, const Tensor& observed,
                                const Tensor& reference, Format output_format, const Layout& layout,
                                const CompareOptions& options) {
  Expected<Layout> checked = CheckedLayout(tensor, observed, reference, layout);
  if (!checked.ok()) return checked.error();
  const Layout& lay = *checked;

  TensorMetrics m;
  m.tensor = std::string(tensor);
  m.format = output_format;
  m.layout = lay;
  m.shape = observed.shape();
  m.options = options;
  m.observed = ToF64(observed);
  m.reference = ToF64(reference);
  m.elements = observed.numel();
  m.worst_abs.seq_name = m.worst_ulp.seq_name = m.first_nonfinite.seq_name = lay.seq_name;
  m.worst_row_cosine.seq_name = m.worst_row_rel_l2.seq_name = lay.seq_name;

  const auto rank = static_cast<int64_t>(lay.axes.size());
  const int64_t row_axis = RowAxisOf(lay);
  const ElementPass pass(m, row_axis, output_format, options);

  // Where rows run along the last axis, no row crosses a line of it: the pass runs on
  // options.threads workers over pieces of whole lines, merged in order (maxima: the first
  // element holding the largest value, as one pass finds it). One piece otherwise.
  const int64_t line = rank > 0 ? m.shape[static_cast<size_t>(rank - 1)] : 1;
  const int64_t lines = line > 0 ? m.elements / line : 0;
  const int workers = oracle_internal::ThreadCount(options.threads);
  const bool split = workers > 1 && row_axis == rank - 1 && lines > 1 &&
                     m.elements >= (int64_t{1} << 16);
  const int64_t pieces = split ? std::min<int64_t>(lines, 8 * static_cast<int64_t>(workers)) : 1;
  std::vector<Part> parts(static_cast<size_t>(pieces));
  if (pieces == 1) {
    pass.Run(0, m.elements, parts[0]);
  } else {
    oracle_internal::ParallelFor(
        pieces, oracle_internal::ThreadCount(workers, pieces), [&](int64_t x, int) {
          pass.Run(lines * x / pieces * line, lines * (x + 1) / pieces * line,
                   parts[static_cast<size_t>(x)]);
        });
  }
  MergeParts(parts, m);
  const double sum_err = WholeSums(m, options);
  Finish(m, sum_err);
  return m;
}

Status SetRowTermScales(TensorMetrics& m, const Tensor& terms) {
  const bool rows_along_d = !m.layout.axes.empty() && m.layout.axes.back() == AxisRole::kDim &&
                            !m.shape.empty() && m.shape.back() > 0;
  if (!rows_along_d) {
    return Error{fmt::format("{}: term magnitudes need rows along a last d axis", m.tensor)};
  }
  const int64_t width = m.shape.back();
  if (!terms.defined() || terms.numel() * width != m.elements) {
    return Error{fmt::format("{}: {} term magnitudes for {} rows of {} elements", m.tensor,
                             terms.defined() ? terms.numel() : 0, m.elements / width, width)};
  }
  Tensor t = ToF64(terms);
  if (!t.contiguous()) t = t.Clone();
  const double* v = t.data<double>();
  for (size_t r = 0; r < m.rows.size(); ++r) {
    if (m.rows[r].length != width) {
      return Error{fmt::format("{}: row {} has {} elements, not {}", m.tensor, r,
                               m.rows[r].length, width)};
    }
    m.rows[r].term_scale = v[m.row_begin[r] / width];
  }
  m.has_term_scale = true;
  return Status::Ok();
}

Status SetRoundingFloor(TensorMetrics& m, const Tensor& floor) {
  if (!floor.defined() || floor.numel() != m.elements) {
    return Error{fmt::format("{}: {} rounding floors for {} elements", m.tensor,
                             floor.defined() ? floor.numel() : 0, m.elements)};
  }
  Tensor t = ToF64(floor);
  if (!t.contiguous()) t = t.Clone();
  m.rounding_floor = t;
  return Status::Ok();
}

}  // namespace attest
