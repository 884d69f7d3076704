// Shared oracle plumbing: input checks, norms, work distribution and the precision dispatch
// (oracle.h, oracle_internal.h).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "reference/oracle/oracle_internal.h"
#include "reference/oracle/oracle_mp.h"

namespace attest {
namespace oracle_internal {

namespace {

// OracleOptions::sink against the problem: present iff Problem::sink, [Hq] f64, each value
// finite or -inf (docs/semantics.md "Learnable sink").
std::vector<double> CheckSink(const Problem& p, const Tensor* sink) {
  if (sink == nullptr) {
    if (!p.sink) return {};
    throw std::invalid_argument(
        "oracle: sink: problem.sink is true but no sink tensor was given (OracleOptions::sink)");
  }
  if (!p.sink) {
    throw std::invalid_argument("oracle: sink: a sink tensor was given but problem.sink is false");
  }
  if (sink->dtype() != DType::kF64 || sink->shape() != p.SinkShape()) {
    throw std::invalid_argument(fmt::format(
        "oracle: sink: expected f64 [{}] (one logit per query head), got {}", p.heads_q,
        sink->Describe()));
  }
  const Tensor c = sink->contiguous() ? *sink : sink->Clone();
  const auto x = c.span<const double>();
  for (size_t h = 0; h < x.size(); ++h) {
    if (std::isnan(x[h]) || x[h] == std::numeric_limits<double>::infinity()) {
      throw std::invalid_argument(
          fmt::format("oracle: sink[{}] is {}: a sink is finite or -inf", h, x[h]));
    }
  }
  return {x.begin(), x.end()};
}

// OracleOptions::rel_bias against the problem: present iff Problem::rel_bias, f64
// [Hq, seqlen_q + seqlen_k - 1], finite.
std::vector<double> CheckRelBias(const Problem& p, const Tensor* bias) {
  if (bias == nullptr) {
    if (!p.rel_bias) return {};
    throw std::invalid_argument(
        "oracle: rel_bias: problem.rel_bias is true but no rel_bias tensor was given "
        "(OracleOptions::rel_bias)");
  }
  if (!p.rel_bias) {
    throw std::invalid_argument(
        "oracle: rel_bias: a rel_bias tensor was given but problem.rel_bias is false");
  }
  if (bias->dtype() != DType::kF64 || bias->shape() != p.RelBiasShape()) {
    throw std::invalid_argument(fmt::format(
        "oracle: rel_bias: expected f64 [{}, {}] (heads_q, seqlen_q + seqlen_k - 1), got {}",
        p.heads_q, p.RelBiasWidth(), bias->Describe()));
  }
  const Tensor c = bias->contiguous() ? *bias : bias->Clone();
  const auto x = c.span<const double>();
  for (size_t e = 0; e < x.size(); ++e) {
    if (!std::isfinite(x[e])) {
      throw std::invalid_argument(
          fmt::format("oracle: rel_bias element {} is {}: the bias is finite", e, x[e]));
    }
  }
  return {x.begin(), x.end()};
}

}  // namespace

double RelBiasAbsMax(const Inputs& in) {
  double m = 0;
  for (double b : in.rel_bias) m = std::max(m, std::abs(b));
  return m;
}

double SinkAbsMax(const Inputs& in) {
  double m = 0;
  for (double s : in.sink) {
    if (std::isfinite(s)) m = std::max(m, std::abs(s));
  }
  return m;
}

bool AnyFiniteSink(const Inputs& in) {
  return std::any_of(in.sink.begin(), in.sink.end(), [](double s) { return std::isfinite(s); });
}

Inputs CheckInputs(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor* dout, const Tensor* sink, const Tensor* rel_bias) {
  if (Status s = Validate(p); !s) throw std::invalid_argument("oracle: " + s.error().message);
  if (Status s = ValidateInputShapes(p, q, k, v, dout); !s) {
    throw std::invalid_argument("oracle: " + s.error().message);
  }
  auto contiguous_f64 = [](const Tensor& t, const char* name) {
    if (t.dtype() != DType::kF64) {
      throw std::invalid_argument(
          fmt::format("oracle: {}: expected f64 values (widened from the problem's dtype), got {}",
                      name, t.Describe()));
    }
    return t.contiguous() ? t : t.Clone();
  };
  // Non-finite inputs have no attention value to certify: a NaN q or k makes its scores
  // NaN, which the softmax's max-subtraction would otherwise turn into an "empty" row (o = 0,
  // lse = -inf, a finite bound) while dq came out NaN. Refused, naming the element
  // (docs/semantics.md "Non-finite inputs").
  auto finite = [](const Tensor& t, const char* name) {
    const auto values = t.span<const double>();
    for (size_t e = 0; e < values.size(); ++e) {
      if (std::isfinite(values[e])) continue;
      std::string index;
      auto rest = static_cast<int64_t>(e);
      for (auto a = static_cast<int64_t>(t.rank()) - 1; a >= 0; --a) {
        const int64_t extent = t.shape()[static_cast<size_t>(a)];
        index.insert(0, (a > 0 ? ", " : "") + std::to_string(rest % extent));
        rest /= extent;
      }
      throw std::invalid_argument(fmt::format(
          "oracle: input {}[{}] is {}: the oracle refuses non-finite inputs (NaN or infinity in "
          "q, k, v or do)",
          name, index, std::isnan(values[e]) ? "NaN" : (values[e] > 0 ? "+inf" : "-inf")));
    }
  };
  Inputs in;
  in.q = contiguous_f64(q, "q");
  in.k = contiguous_f64(k, "k");
  in.v = contiguous_f64(v, "v");
  if (dout != nullptr) in.dout = contiguous_f64(*dout, "do");
  finite(in.q, "q");
  finite(in.k, "k");
  finite(in.v, "v");
  if (dout != nullptr) finite(in.dout, "do");
  in.sink = CheckSink(p, sink);
  in.rel_bias = CheckRelBias(p, rel_bias);
  in.rel_bias_on = p.rel_bias;
  return in;
}

namespace {

// ||x_r,h||_2 for every (row, head) of a [rows, heads, width] tensor, plus max |x|.
void RowNorms(const double* x, int64_t rows, int64_t heads, int64_t width,
              std::vector<double>& norms, double& abs_max, double& norm_max) {
  norms.assign(static_cast<size_t>(rows * heads), 0.0);
  for (int64_t r = 0; r < rows * heads; ++r) {
    const double* row = x + r * width;
    // Scaled sum of squares (LAPACK dnrm2 style) is unnecessary here: inputs come from
    // dtypes whose squares cannot overflow double, and a norm is only a magnitude.
    double ss = 0;
    for (int64_t d = 0; d < width; ++d) {
      ss += row[d] * row[d];
      abs_max = std::max(abs_max, std::abs(row[d]));
    }
    norms[static_cast<size_t>(r)] = std::sqrt(ss);
    norm_max = std::max(norm_max, norms[static_cast<size_t>(r)]);
  }
}

}  // namespace

Norms ComputeNorms(const Problem& p, const Inputs& in) {
  Norms n;
  double unused = 0;
  RowNorms(in.Q(), p.TotalQ(), p.heads_q, p.head_dim, n.q, n.q_abs, unused);
  RowNorms(in.K(), p.TotalK(), p.heads_kv, p.head_dim, n.k, n.k_abs, unused);
  RowNorms(in.V(), p.TotalK(), p.heads_kv, p.head_dim_v, n.v, n.v_abs, n.v_norm);
  if (in.dout.defined()) {
    RowNorms(in.DO(), p.TotalQ(), p.heads_q, p.head_dim_v, n.dout, n.do_abs, n.do_norm);
  }
  return n;
}

std::vector<MaskView> MaskViews(const Problem& p) {
  std::vector<MaskView> views;
  views.reserve(static_cast<size_t>(p.batch));
  for (int64_t b = 0; b < p.batch; ++b) views.emplace_back(p, b);
  return views;
}

int ThreadCount(const OracleOptions& options, int64_t items) {
  return ThreadCount(options.threads, items);
}

int ThreadCount(int threads, int64_t items) {
  int64_t t = threads > 0 ? threads : static_cast<int64_t>(std::thread::hardware_concurrency());
  t = std::clamp<int64_t>(t, 1, std::max<int64_t>(items, 1));
  return static_cast<int>(t);
}

void ParallelFor(int64_t items, int threads, const std::function<void(int64_t, int)>& fn,
                 const std::function<void()>& worker_exit) {
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&](int worker) {
    for (;;) {
      const int64_t item = next.fetch_add(1);
      if (item >= items || failed.load()) return;
      try {
        fn(item, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(std::max(threads - 1, 0)));
  for (int w = 1; w < threads; ++w) {
    pool.emplace_back([&work, &worker_exit, w] {
      work(w);
      if (worker_exit) worker_exit();
    });
  }
  work(0);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

void MergeStats(OracleStats& into, const OracleStats& from) {
  into.score_abs_max = std::max(into.score_abs_max, from.score_abs_max);
  into.lse_abs_max = std::max(into.lse_abs_max, from.lse_abs_max);
  into.col_mass_max = std::max(into.col_mass_max, from.col_mass_max);
  into.max_keys = std::max(into.max_keys, from.max_keys);
  into.max_queries = std::max(into.max_queries, from.max_queries);
  into.sum_len_k = std::max(into.sum_len_k, from.sum_len_k);
  into.sum_len_q = std::max(into.sum_len_q, from.sum_len_q);
  into.sink_abs_max = std::max(into.sink_abs_max, from.sink_abs_max);
  into.sink_mass_max = std::max(into.sink_mass_max, from.sink_mass_max);
  into.sink_rows = std::max(into.sink_rows, from.sink_rows);
  into.rel_bias_abs_max = std::max(into.rel_bias_abs_max, from.rel_bias_abs_max);
  into.rel_bias_mass_max = std::max(into.rel_bias_mass_max, from.rel_bias_mass_max);
  into.rel_bias_terms = std::max(into.rel_bias_terms, from.rel_bias_terms);
  into.empty_rows += from.empty_rows;
  into.unseen_keys += from.unseen_keys;
}

}  // namespace oracle_internal

std::optional<Precision> ParsePrecision(std::string_view name) {
  if (name == "double" || name == "f64") return Precision::kDouble;
  if (name == "mp128") return Precision::kMp128;
  if (name == "mp256") return Precision::kMp256;
  return std::nullopt;
}

std::string_view Name(Precision p) {
  switch (p) {
    case Precision::kDouble:
      return "double";
    case Precision::kMp128:
      return "mp128";
    case Precision::kMp256:
      return "mp256";
  }
  return "?";
}

std::string_view Name(OracleTensor t) {
  switch (t) {
    case OracleTensor::kO:
      return "o";
    case OracleTensor::kLse:
      return "lse";
    case OracleTensor::kDq:
      return "dq";
    case OracleTensor::kDk:
      return "dk";
    case OracleTensor::kDv:
      return "dv";
    case OracleTensor::kDelta:
      return "delta";
    case OracleTensor::kDsink:
      return "dsink";
    case OracleTensor::kDrelBias:
      return "drel_bias";
  }
  return "?";
}

ForwardOut Forward(Precision precision, const Problem& p, const Tensor& q, const Tensor& k,
                   const Tensor& v, const OracleOptions& options) {
  switch (precision) {
    case Precision::kDouble:
      return Forward<double>(p, q, k, v, options);
    case Precision::kMp128:
      return Forward<Mp128>(p, q, k, v, options);
    case Precision::kMp256:
      return Forward<Mp256>(p, q, k, v, options);
  }
  throw std::invalid_argument("oracle: unknown precision");
}

BackwardOut Backward(Precision precision, const Problem& p, const Tensor& q, const Tensor& k,
                     const Tensor& v, const Tensor& dout, const OracleOptions& options) {
  switch (precision) {
    case Precision::kDouble:
      return Backward<double>(p, q, k, v, dout, options);
    case Precision::kMp128:
      return Backward<Mp128>(p, q, k, v, dout, options);
    case Precision::kMp256:
      return Backward<Mp256>(p, q, k, v, dout, options);
  }
  throw std::invalid_argument("oracle: unknown precision");
}

}  // namespace attest
