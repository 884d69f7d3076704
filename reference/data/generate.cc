// Deterministic input generators (see generate.h): the generator rows, over the element
// streams of element_stream.cc.
//
// This file is compiled with -ffp-contract=off (see CMakeLists.txt): a fused multiply-add
// rounds once where a*b+c rounds twice, so contraction would change the last bits between
// machines with and without FMA.
#include "reference/data/generate.h"

#include "reference/data/element_stream.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "reference/formats/format.h"
#include "reference/io/json.h"
#include "reference/problem/paged.h"

// Every double operation must round to double once (no x87 80-bit intermediates).
static_assert(FLT_EVAL_METHOD == 0, "generators need IEEE double evaluation (e.g. SSE2)");
static_assert(std::numeric_limits<double>::is_iec559);

namespace attest {

// --- Generator rows -----------------------------------------------------------------------

namespace {

double Param(const FillContext& ctx, const char* name) { return ctx.params.at(name).get<double>(); }

// Element n of the tensor reads ElementStream(seed, stream, n) only, so splitting the tensor
// across threads cannot change a bit (generate_test checks elements against single streams).
// FillIndexed is the general form: out[n] = value(n), where value(n) may read other elements'
// streams (remapped keys, auxiliary streams) but nothing that depends on evaluation order.
// FillRanges calls fill_range(begin, end) on consecutive pieces of [0, size), one per thread.
template <class FillRange>
void FillRanges(size_t size, FillRange fill_range) {
  constexpr size_t kMinPerThread = size_t{1} << 16;
  const size_t threads = std::clamp<size_t>(size / kMinPerThread, 1,
                                            std::max(1u, std::thread::hardware_concurrency()));
  if (threads == 1) {
    fill_range(size_t{0}, size);
    return;
  }
  std::vector<std::thread> pool;
  const size_t chunk = (size + threads - 1) / threads;
  for (size_t t = 0; t < threads; ++t) {
    const size_t begin = std::min(size, t * chunk);
    pool.emplace_back(fill_range, begin, std::min(size, begin + chunk));
  }
  for (auto& th : pool) th.join();
}

template <class Value>
void FillIndexed(std::span<double> out, Value value) {
  FillRanges(out.size(), [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) out[n] = value(n);
  });
}

// out[n] = a + b * ElementStream(ctx.seed, ctx.stream, n).NextNormal() (the first draw of
// element n's own stream), by NormalsOf.
void FillAffineNormals(const FillContext& ctx, std::span<double> out, double a, double b) {
  FillRanges(out.size(), [&](size_t begin, size_t end) {
    const std::span<double> piece = out.subspan(begin, end - begin);
    NormalsOf(ctx.seed, ctx.stream, begin, piece);
    for (double& x : piece) x = a + b * x;
  });
}

template <class Sample>
void FillElementwise(const FillContext& ctx, std::span<double> out, Sample sample) {
  FillIndexed(out, [&](size_t n) {
    ElementStream s(ctx.seed, ctx.stream, n);
    return sample(s);
  });
}

void FillGaussian(const FillContext& ctx, std::span<double> out) {
  const double mean = Param(ctx, "mean");
  const double std = Param(ctx, "std");
  FillAffineNormals(ctx, out, mean, std);
}

Status CheckGaussian(const nlohmann::json& params, const std::string& where) {
  const double std = params.at("std").get<double>();
  if (!(std >= 0)) return Error{fmt::format("{}.std: {} must be >= 0", where, std)};
  return {};
}

void FillUniform(const FillContext& ctx, std::span<double> out) {
  const double low = Param(ctx, "low");
  const double width = Param(ctx, "high") - low;
  FillElementwise(ctx, out, [&](ElementStream& s) { return low + width * s.NextUniform(); });
}

Status CheckUniform(const nlohmann::json& params, const std::string& where) {
  const double low = params.at("low").get<double>();
  const double high = params.at("high").get<double>();
  if (!(low < high) || !std::isfinite(high - low)) {
    return Error{fmt::format("{}: low = {} must be below high = {} (and high - low finite)", where,
                             low, high)};
  }
  return {};
}

// --- Distributions of real workloads (docs/fuzz.md) --------------------------------------
//
// Each row below uses only ElementStream draws, + - * / sqrt, exact scalings by powers of two
// (std::ldexp is exact whenever the result is a normal or exactly representable double), and
// RoundTo (integer arithmetic on the bit pattern), so they reproduce bit for bit like the two
// rows above. Auxiliary randomness (which channels are outliers, each token's scale, which key
// a query copies) reads streams >= kFirstAuxStream, addressed by what it describes, so it does
// not depend on evaluation order either.

// Where element n of a [B, S, H, X] or packed [T, H, X] tensor sits.
struct ElementPlace {
  int64_t token;  // row of the flattened token axis (b * S + s, or the packed row)
  int64_t head;
  int64_t inner;  // index along the last axis (D or Dv)
};

ElementPlace PlaceOf(const Shape& shape, size_t n) {
  const int64_t inner = shape.back();
  const int64_t heads = shape[shape.size() - 2];
  const auto i = static_cast<int64_t>(n);
  return {i / (heads * inner), (i / inner) % heads, i % inner};
}

size_t FlatIndex(const Shape& shape, int64_t token, int64_t head, int64_t inner) {
  const int64_t x = shape.back();
  const int64_t heads = shape[shape.size() - 2];
  return static_cast<size_t>((token * heads + head) * x + inner);
}

// Which sequence a token row of q (is_q) or k/v belongs to, and where that sequence begins.
struct TokenSequence {
  int64_t batch;
  Sequence seq;
};

TokenSequence SequenceOfToken(const Problem& p, bool is_q, int64_t token) {
  if (!p.varlen()) {
    const int64_t b = token / (is_q ? p.seqlen_q : p.seqlen_k);
    return {b, SequenceOf(p, b)};
  }
  const auto& cu = is_q ? *p.cu_seqlens_q : *p.cu_seqlens_k;
  // Last b with cu[b] <= token (zero-length sequences share their start with the next one).
  const auto it = std::upper_bound(cu.begin(), cu.end(), static_cast<int32_t>(token));
  const int64_t b = std::clamp<int64_t>((it - cu.begin()) - 1, 0, p.batch - 1);
  return {b, SequenceOf(p, b)};
}

// Uniform integer in [0, n) from one 64-bit word: floor(w * n / 2^64) (Lemire's multiply
// without the rejection step; the bias is below n / 2^64, irrelevant for n < 2^32).
uint64_t UniformBelow(ElementStream& s, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(s.NextU64()) * n) >> 64);
}

double RandomSign(ElementStream& s) { return (s.NextU64() >> 63) ? -1.0 : 1.0; }

int ParamInt(const FillContext& ctx, const char* name) {
  return static_cast<int>(ctx.params.at(name).get<double>());
}

Status CheckIntegerIn(const nlohmann::json& params, const std::string& where, const char* name,
                      double low, double high) {
  const double x = params.at(name).get<double>();
  if (!(x >= low && x <= high) || x != static_cast<double>(static_cast<int64_t>(x))) {
    return Error{
        fmt::format("{}.{}: {} must be an integer in [{}, {}]", where, name, x, low, high)};
  }
  return {};
}

Status CheckNonNegative(const nlohmann::json& params, const std::string& where, const char* name) {
  const double x = params.at(name).get<double>();
  if (!(x >= 0)) return Error{fmt::format("{}.{}: {} must be >= 0", where, name, x)};
  return {};
}

// A text "format" parameter: a format name, or "dtype" for the problem's own input dtype.
Expected<Format> ResolveFormat(const FillContext* ctx, const nlohmann::json& params,
                               const std::string& where) {
  const std::string name = params.at("format").get<std::string>();
  if (name == "dtype") {
    if (ctx == nullptr) return Format::kF64;  // validation without a problem: any dtype works
    if (auto f = FormatOf(ctx->problem->dtype)) return *f;
    return Error{fmt::format("{}.format: the problem's dtype has no float format", where)};
  }
  if (auto f = ParseFormat(name)) return *f;
  return Error{fmt::format("{}.format: unknown format {}", where, QuotedExcerpt(name))};
}

// outlier-channels: N(0, std^2) entries, except `count` channels of the last axis (per
// tensor) multiplied by `scale`, as in the activation outliers of LLM.int8() (Dettmers et al.,
// 2022) and the massive q/k channels that make FP8 per-tensor scales coarse. With
// shared_qk = 1, q and k use the same channels (their outliers line up, so logits grow by
// ~scale^2 * count / D); otherwise each tensor draws its own.
void FillOutlierChannels(const FillContext& ctx, std::span<double> out) {
  const double std = Param(ctx, "std");
  const double scale = Param(ctx, "scale");
  const int64_t width = ctx.shape.back();
  const int64_t count = std::min<int64_t>(ParamInt(ctx, "count"), width);
  const bool shared = Param(ctx, "shared_qk") != 0 && (ctx.tensor == "q" || ctx.tensor == "k");
  // Partial Fisher-Yates over the channel indices, one aux stream per tensor (q's when shared).
  std::vector<int64_t> channels(static_cast<size_t>(width));
  for (int64_t c = 0; c < width; ++c) channels[static_cast<size_t>(c)] = c;
  ElementStream pick(ctx.seed, kFirstAuxStream + (shared ? kStreamQ : ctx.stream), 0);
  for (int64_t c = 0; c < count; ++c) {
    const auto r = c + static_cast<int64_t>(UniformBelow(pick, static_cast<uint64_t>(width - c)));
    std::swap(channels[static_cast<size_t>(c)], channels[static_cast<size_t>(r)]);
  }
  std::vector<char> is_outlier(static_cast<size_t>(width), 0);
  for (int64_t c = 0; c < count; ++c) is_outlier[static_cast<size_t>(channels[c])] = 1;
  FillIndexed(out, [&](size_t n) {
    ElementStream s(ctx.seed, ctx.stream, n);
    const double x = std * s.NextNormal();
    return is_outlier[static_cast<size_t>(PlaceOf(ctx.shape, n).inner)] ? x * scale : x;
  });
}

Status CheckOutlierChannels(const nlohmann::json& params, const std::string& where) {
  if (Status s = CheckNonNegative(params, where, "std"); !s) return s;
  if (Status s = CheckIntegerIn(params, where, "count", 0, 1 << 20); !s) return s;
  return CheckIntegerIn(params, where, "shared_qk", 0, 1);
}

// heavy-tail: scale * Student-t with `dof` (integer) degrees of freedom,
// t = Z / sqrt(chi2_dof / dof) with chi2_dof a sum of dof squared normals. dof = 1 is Cauchy
// (no mean), dof = 2 has infinite variance, dof >= 3 finite variance dof / (dof - 2).
void FillHeavyTail(const FillContext& ctx, std::span<double> out) {
  const double scale = Param(ctx, "scale");
  const int dof = ParamInt(ctx, "dof");
  FillElementwise(ctx, out, [&](ElementStream& s) {
    const double z = s.NextNormal();
    double chi2 = 0;
    for (int i = 0; i < dof; ++i) {
      const double g = s.NextNormal();
      chi2 += g * g;
    }
    return scale * (z / std::sqrt(chi2 / dof));
  });
}

Status CheckHeavyTail(const nlohmann::json& params, const std::string& where) {
  if (Status s = CheckNonNegative(params, where, "scale"); !s) return s;
  return CheckIntegerIn(params, where, "dof", 1, 64);
}

// token-scale-spread: N(0, std^2) entries times a per-token scale (shared by all heads of
// the token) spread over `decades` decades around 1: scale = 2^e * (1 + u) with e a uniform
// integer in [-E, E), E = ceil(decades * log2(10) / 2), u uniform in [0, 1) — log-uniform up
// to the factor 2 within a binade, built without exp. Per-token scales are what per-token FP8
// (and the per-row max of online softmax) must cope with.
void FillTokenScaleSpread(const FillContext& ctx, std::span<double> out) {
  const double std = Param(ctx, "std");
  const auto half = static_cast<int64_t>(std::ceil(Param(ctx, "decades") * 3.321928094887362 / 2));
  FillIndexed(out, [&](size_t n) {
    ElementStream s(ctx.seed, ctx.stream, n);
    const double x = std * s.NextNormal();
    if (half == 0) return x;
    ElementStream t(ctx.seed, kFirstAuxStream + ctx.stream,
                    static_cast<uint64_t>(PlaceOf(ctx.shape, n).token));
    const auto e = static_cast<int>(static_cast<int64_t>(UniformBelow(t, 2 * half)) - half);
    return std::ldexp(x * (1.0 + t.NextUniform()), e);
  });
}

Status CheckTokenScaleSpread(const nlohmann::json& params, const std::string& where) {
  if (Status s = CheckNonNegative(params, where, "std"); !s) return s;
  const double d = params.at("decades").get<double>();
  if (!(d >= 0 && d <= 100)) {
    return Error{fmt::format("{}.decades: {} must be in [0, 100]", where, d)};
  }
  return {};
}

// peaked-logits: k, v, do are N(0, std^2); each query row (token, head) copies one key of its
// own sequence, q = gain * k[target] + noise * N(0, 1), with the target uniform over the
// sequence's keys (per query token and head; masks are not consulted, so a masked target
// just gives a less peaked row). The target logit is ~ gain * std^2 * sqrt(D), the others
// ~ N(0, (gain * std^2)^2): with the defaults and D = 64 a gap of ~30, so the softmax is
// one-hot to within e^-20 and the kernel's max-subtraction and rescaling carry everything.
void FillPeakedLogits(const FillContext& ctx, std::span<double> out) {
  const double std = Param(ctx, "std");
  auto key_value = [&](size_t n) {
    return std * ElementStream(ctx.seed, kStreamK, n).NextNormal();
  };
  if (ctx.tensor != "q") {
    FillElementwise(ctx, out, [&](ElementStream& s) { return std * s.NextNormal(); });
    return;
  }
  const Problem& p = *ctx.problem;
  const double gain = Param(ctx, "gain");
  const double noise = Param(ctx, "noise");
  const Shape k_shape = p.KShape();
  FillIndexed(out, [&](size_t n) {
    const ElementPlace at = PlaceOf(ctx.shape, n);
    const double jitter = noise * ElementStream(ctx.seed, ctx.stream, n).NextNormal();
    const TokenSequence ts = SequenceOfToken(p, true, at.token);
    if (ts.seq.k_len == 0) return jitter;
    ElementStream t(ctx.seed, kFirstAuxStream + kStreamQ,
                    static_cast<uint64_t>(at.token * p.heads_q + at.head));
    const int64_t key =
        ts.seq.k_begin + static_cast<int64_t>(UniformBelow(t, static_cast<uint64_t>(ts.seq.k_len)));
    return gain * key_value(FlatIndex(k_shape, key, p.KvHead(at.head), at.inner)) + jitter;
  });
}

Status CheckPeakedLogits(const nlohmann::json& params, const std::string& where) {
  if (Status s = CheckNonNegative(params, where, "std"); !s) return s;
  return CheckNonNegative(params, where, "noise");
}

// near-fp8-subnormal: sign * 2^e * (1 + u), e a uniform integer from one binade below the
// format's smallest subnormal to one binade above its smallest normal, u uniform; half of
// them rounded (RNE) onto the format's grid, so exact subnormal codes (and some zeros from
// the lowest binade) appear next to values between codes; plus a `zero_fraction` of zeros.
// Exercises subnormal encode/decode and flush-to-zero in FP8 quantizers; with a scaled recipe, set
// `scale` to land there after scaling.
void FillNearSubnormal(const FillContext& ctx, std::span<double> out) {
  const Format f = *ResolveFormat(&ctx, ctx.params, "");
  const FormatSpec& spec = Spec(f);
  const double scale = Param(ctx, "scale");  // applied last: scale = 1 keeps grid values exact
  const double zero_fraction = Param(ctx, "zero_fraction");
  const int lo = spec.min_normal_exponent() - spec.mantissa_bits - 1;
  const int hi = spec.min_normal_exponent() + 1;  // inclusive
  FillElementwise(ctx, out, [&](ElementStream& s) {
    if (s.NextUniform() < zero_fraction) return 0.0;
    const int e = lo + static_cast<int>(UniformBelow(s, static_cast<uint64_t>(hi - lo + 1)));
    // Half the draws rounded onto the format's grid (exact codes, subnormal ones included),
    // half left between grid points.
    const bool on_grid = (s.NextU64() >> 63) != 0;
    const double x = RandomSign(s) * std::ldexp(1.0 + s.NextUniform(), e);
    return scale * (on_grid ? RoundTo(x, f) : x);
  });
}

Status CheckNearSubnormal(const nlohmann::json& params, const std::string& where) {
  auto f = ResolveFormat(nullptr, params, where);
  if (!f.ok()) return f.error();
  if (!Spec(*f).has_subnormals || Spec(*f).mantissa_bits > 52) {
    return Error{fmt::format("{}.format: {} has no subnormals", where, Spec(*f).name)};
  }
  const double z = params.at("zero_fraction").get<double>();
  if (!(z >= 0 && z <= 1)) {
    return Error{fmt::format("{}.zero_fraction: {} must be in [0, 1]", where, z)};
  }
  const double scale = params.at("scale").get<double>();
  if (!(scale > 0)) return Error{fmt::format("{}.scale: {} must be > 0", where, scale)};
  return {};
}

// near-max: sign * max * (low + (high - low) * u) with max the format's largest finite value;
// a fraction `on_grid` of them rounded (RNE, saturating) onto the format's grid, so the top
// codes themselves (448 for e4m3fn, 57344 for e5m2) appear. high > 1 reaches past max to
// exercise overflow and saturation. format "dtype" (default) uses the problem's input dtype.
// Note the values are rounded once more to the problem's dtype: a format finer than the
// dtype near its top can round up to Inf (f32 max in bf16).
void FillNearMax(const FillContext& ctx, std::span<double> out) {
  const Format f = *ResolveFormat(&ctx, ctx.params, "");
  const double max = MaxFinite(f);
  const double low = Param(ctx, "low");
  const double width = Param(ctx, "high") - low;
  const double on_grid = Param(ctx, "on_grid");
  EncodeOptions saturate;
  saturate.overflow = Overflow::kSaturate;
  FillElementwise(ctx, out, [&](ElementStream& s) {
    const double x = RandomSign(s) * (max * (low + width * s.NextUniform()));
    return s.NextUniform() < on_grid ? RoundTo(x, f, saturate) : x;
  });
}

Status CheckNearMax(const nlohmann::json& params, const std::string& where) {
  if (auto f = ResolveFormat(nullptr, params, where); !f.ok()) return f.error();
  const double low = params.at("low").get<double>();
  const double high = params.at("high").get<double>();
  if (!(low >= 0 && low < high && high <= 2)) {
    return Error{fmt::format("{}: need 0 <= low = {} < high = {} <= 2", where, low, high)};
  }
  const double g = params.at("on_grid").get<double>();
  if (!(g >= 0 && g <= 1)) return Error{fmt::format("{}.on_grid: {} must be in [0, 1]", where, g)};
  return {};
}

// Element n of a k/v tensor, re-addressed to key position `position(j)` of the same sequence.
template <class Position>
size_t RemapKeyToken(const FillContext& ctx, size_t n, Position position) {
  const ElementPlace at = PlaceOf(ctx.shape, n);
  const TokenSequence ts = SequenceOfToken(*ctx.problem, false, at.token);
  const int64_t j = at.token - ts.seq.k_begin;
  return FlatIndex(ctx.shape, ts.seq.k_begin + position(j), at.head, at.inner);
}

// constant-rows: q and do are N(0, std^2); within each sequence and kv head, every key is the
// same vector and so is every value (those of the sequence's first key). Every score row is
// then constant, the softmax exactly uniform over the visible keys, and o = v[first] exactly
// in real arithmetic; dK = 0 and dQ = 0 exactly. A kernel whose rescaling or P rounding does
// not sum to one shows it here undiluted.
void FillConstantRows(const FillContext& ctx, std::span<double> out) {
  const double std = Param(ctx, "std");
  const bool keys = ctx.tensor == "k" || ctx.tensor == "v";
  FillIndexed(out, [&](size_t n) {
    const size_t m = keys ? RemapKeyToken(ctx, n, [](int64_t) { return int64_t{0}; }) : n;
    return std * ElementStream(ctx.seed, ctx.stream, m).NextNormal();
  });
}

// ties: every entry is unit * an integer uniform in [-levels, levels], so with unit a power of
// two every q.k is exact in any dtype and accumulation order, and scores tie exactly and often;
// in addition keys come in runs of `group` identical keys (k only), so every query sees exact
// ties, including at its row maximum. Exposes argmax/tie-breaking assumptions, max-subtraction
// that is not exactly zero at the max, and nondeterminism that only ties reveal.
void FillTies(const FillContext& ctx, std::span<double> out) {
  const double unit = Param(ctx, "unit");
  const auto levels = static_cast<uint64_t>(ParamInt(ctx, "levels"));
  const int64_t group = ParamInt(ctx, "group");
  const bool grouped = ctx.tensor == "k" && group > 1;
  FillIndexed(out, [&](size_t n) {
    const size_t m = grouped ? RemapKeyToken(ctx, n, [&](int64_t j) { return j - j % group; }) : n;
    ElementStream s(ctx.seed, ctx.stream, m);
    const auto k =
        static_cast<int64_t>(UniformBelow(s, 2 * levels + 1)) - static_cast<int64_t>(levels);
    return unit * static_cast<double>(k);
  });
}

Status CheckTies(const nlohmann::json& params, const std::string& where) {
  if (Status s = CheckIntegerIn(params, where, "levels", 0, 1 << 20); !s) return s;
  if (Status s = CheckIntegerIn(params, where, "group", 1, 1 << 20); !s) return s;
  const double unit = params.at("unit").get<double>();
  if (!(unit > 0)) return Error{fmt::format("{}.unit: {} must be > 0", where, unit)};
  return {};
}

const std::vector<GeneratorRow>& Table() {
  static const std::vector<GeneratorRow> table = {
      {"gaussian",
       "independent normal entries, mean + std * N(0, 1) (polar method)",
       {{"mean", 0.0, "mean"}, {"std", 1.0, "standard deviation"}},
       CheckGaussian,
       FillGaussian},
      {"uniform",
       "independent uniform entries on [low, high), a 2^-53 grid scaled",
       {{"low", -1.0, "lower bound (inclusive)"}, {"high", 1.0, "upper bound (exclusive)"}},
       CheckUniform,
       FillUniform},
      {"outlier-channels",
       "N(0, std^2) entries; `count` channels of the last axis (per tensor, the same ones for q "
       "and k when shared_qk = 1) multiplied by `scale`",
       {{"std", 1.0, "standard deviation of ordinary entries"},
        {"scale", 20.0, "factor of the outlier channels"},
        {"count", 2.0, "number of outlier channels (integer, capped at the axis length)"},
        {"shared_qk", 1.0, "1: q and k share their outlier channels; 0: independent"}},
       CheckOutlierChannels,
       FillOutlierChannels},
      {"heavy-tail",
       "scale * Student-t with `dof` degrees of freedom (Z / sqrt(chi2_dof / dof))",
       {{"scale", 1.0, "scale factor"},
        {"dof", 3.0, "degrees of freedom, integer in [1, 64] (1: Cauchy)"}},
       CheckHeavyTail,
       FillHeavyTail},
      {"token-scale-spread",
       "N(0, std^2) entries times a per-token scale 2^e * (1 + u), log-uniform over `decades` "
       "decades around 1, shared by the token's heads",
       {{"std", 1.0, "standard deviation before scaling"},
        {"decades", 4.0, "width of the per-token scale range in decades, in [0, 100]"}},
       CheckTokenScaleSpread,
       FillTokenScaleSpread},
      {"peaked-logits",
       "k, v, do N(0, std^2); each query (token, head) = gain * one key of its sequence + "
       "noise * N(0, 1): near one-hot softmax rows",
       {{"std", 1.0, "standard deviation of k, v, do"},
        {"gain", 4.0, "factor on the copied key"},
        {"noise", 0.1, "standard deviation of the noise added to q"}},
       CheckPeakedLogits,
       FillPeakedLogits},
      {"near-fp8-subnormal",
       "sign * scale * 2^e * (1 + u) from half the format's smallest subnormal to twice its "
       "smallest normal, half on the format's mantissa grid, plus exact zeros",
       {{"format", 0.0,
         "format whose subnormal range is targeted (e4m3fn, e5m2, ...; dtype: "
         "the problem's)",
         "e4m3fn"},
        {"scale", 1.0, "factor applied after drawing (e.g. the inverse of a recipe's scale)"},
        {"zero_fraction", 0.0625, "fraction of exact zeros, in [0, 1]"}},
       CheckNearSubnormal,
       FillNearSubnormal},
      {"near-max",
       "sign * max * (low + (high - low) * u) with max the format's largest finite value; a "
       "fraction on_grid rounded onto the format's grid (RNE, saturating)",
       {{"format", 0.0, "format whose maximum is targeted (dtype: the problem's dtype)", "dtype"},
        {"low", 0.5, "lower end as a fraction of max, >= 0"},
        {"high", 1.0, "upper end as a fraction of max, <= 2 (> 1 overflows the format)"},
        {"on_grid", 0.5, "fraction rounded onto the format's grid, in [0, 1]"}},
       CheckNearMax,
       FillNearMax},
      {"constant-rows",
       "q, do N(0, std^2); every key (and every value) of a sequence and kv head equals the "
       "sequence's first one: constant score rows, exactly uniform softmax",
       {{"std", 1.0, "standard deviation"}},
       CheckGaussian,
       FillConstantRows},
      {"ties",
       "unit * integers uniform in [-levels, levels] (exact dot products), keys in runs of "
       "`group` identical keys: exact ties in every score row",
       {{"unit", 0.5, "grid step (a power of two keeps every product exact), > 0"},
        {"levels", 2.0, "integer range of the grid, [0, 2^20]"},
        {"group", 2.0, "length of each run of identical keys, integer >= 1"}},
       CheckTies,
       FillTies},
  };
  return table;
}

struct TensorSlot {
  std::string_view name;
  uint32_t stream;
};
constexpr TensorSlot kTensors[] = {
    {"q", kStreamQ}, {"k", kStreamK}, {"v", kStreamV}, {"do", kStreamDO}};

const GeneratorRow* FindRow(std::string_view name) {
  for (const auto& row : Table()) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

bool IsTensorName(std::string_view key) {
  return std::any_of(std::begin(kTensors), std::end(kTensors),
                     [&](const TensorSlot& t) { return t.name == key; });
}

std::string ParamNames(const GeneratorRow& row) {
  std::string s;
  for (const auto& p : row.params) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

// Checks that `obj` holds only numeric parameters of `row`.
Status CheckParamObject(const GeneratorRow& row, const nlohmann::json& obj,
                        const std::string& where, bool allow_tensors) {
  if (!obj.is_object()) {
    return Error{fmt::format("{}: expected an object, got {}", where, JsonExcerpt(obj))};
  }
  for (const auto& item : obj.items()) {
    // Named, not a structured binding: lambdas below capture the key (clang 14, which the
    // libFuzzer build uses, cannot capture structured bindings).
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    if (allow_tensors && (IsTensorName(key) || key == "sink" || key == "rel_bias")) continue;
    const bool known = std::any_of(row.params.begin(), row.params.end(),
                                   [&](const GeneratorParam& p) { return p.name == key; });
    if (!known) {
      return Error{fmt::format("{}: unknown parameter {} for generator {} (parameters: {}{})",
                               where, QuotedExcerpt(key), row.name, ParamNames(row),
                               allow_tensors ? "; per-tensor overrides: q, k, v, do" : "")};
    }
    const auto param = std::find_if(row.params.begin(), row.params.end(),
                                    [&](const GeneratorParam& p) { return p.name == key; });
    if (param->is_text()) {
      if (!value.is_string()) {
        return Error{
            fmt::format("{}.{}: expected a string, got {}", where, key, JsonExcerpt(value))};
      }
      continue;
    }
    if (!value.is_number() || !std::isfinite(value.get<double>())) {
      return Error{
          fmt::format("{}.{}: expected a finite number, got {}", where, key, JsonExcerpt(value))};
    }
  }
  return {};
}

// The "sink" or "rel_bias" object of the params (generate.h GeneratedInputs::sink,
// rel_bias): `wanted` says whether the problem has that input; "-inf" is a sink's only.
Status CheckLogitParams(bool wanted, const nlohmann::json& params, const std::string& name) {
  if (!params.contains(name)) return {};
  const nlohmann::json& s = params.at(name);
  const std::string where = "generator.params." + name;
  if (!wanted) {
    return Error{fmt::format("{}: the problem has no {} (set problem.{} = true)", where, name,
                             name)};
  }
  if (!s.is_object()) {
    return Error{fmt::format("{}: expected an object, got {}", where, JsonExcerpt(s))};
  }
  for (const auto& item : s.items()) {
    const std::string& key = item.key();
    if (key != "mean" && key != "std" && key != "values") {
      return Error{fmt::format("{}: unknown parameter {} (parameters: mean, std, or values)",
                               where, QuotedExcerpt(key))};
    }
    if (key == "values") continue;
    const nlohmann::json& x = item.value();
    if (!x.is_number() || !std::isfinite(x.get<double>()) || (key == "std" && x < 0)) {
      return Error{fmt::format("{}.{}: expected a finite number{}, got {}", where, key,
                               key == "std" ? " >= 0" : "", JsonExcerpt(x))};
    }
  }
  if (!s.contains("values")) return {};
  if (s.contains("mean") || s.contains("std")) {
    return Error{where + ": give either values or mean/std, not both"};
  }
  const nlohmann::json& values = s.at("values");
  if (!values.is_array() || values.empty()) {
    return Error{fmt::format("{}.values: expected a non-empty array, got {}", where,
                             JsonExcerpt(values))};
  }
  const bool sink = name == "sink";
  for (size_t n = 0; n < values.size(); ++n) {
    const nlohmann::json& x = values[n];
    const bool neg_inf = sink && x.is_string() && x.get<std::string>() == "-inf";
    const bool finite_f32 =
        x.is_number() && std::isfinite(static_cast<float>(x.get<double>()));
    if (!neg_inf && !finite_f32) {
      return Error{fmt::format("{}.values[{}]: expected a number finite in float32{}, got {}",
                               where, n, sink ? " or \"-inf\"" : "", JsonExcerpt(x))};
    }
  }
  return {};
}

// The sink [Hq] or the relative bias [Hq, W] (stream kStreamSink / kStreamRelBias): element
// e takes values[e mod n], else mean + std * the first normal of ElementStream(seed, stream, e).
Tensor GenerateLogits(const GeneratorSpec& spec, const std::string& name, const Shape& shape,
                      uint32_t stream) {
  Tensor t = Tensor::Zeros(DType::kF64, shape);
  const std::span<double> out = t.span<double>();
  const nlohmann::json s =
      spec.params.contains(name) ? spec.params.at(name) : nlohmann::json::object();
  if (s.contains("values")) {
    const nlohmann::json& values = s.at("values");
    for (size_t h = 0; h < out.size(); ++h) {
      const nlohmann::json& x = values[h % values.size()];
      out[h] = x.is_string() ? -std::numeric_limits<double>::infinity() : x.get<double>();
    }
    return t;
  }
  const double mean = s.value("mean", 0.0), std = s.value("std", 1.0);
  for (size_t h = 0; h < out.size(); ++h) {
    out[h] = mean + std * ElementStream(spec.seed, stream, h).NextNormal();
  }
  return t;
}

// The tensor's parameters: its override, else the top level, else the row's default.
nlohmann::json ResolveParams(const GeneratorRow& row, const nlohmann::json& params,
                             std::string_view tensor) {
  nlohmann::json out = nlohmann::json::object();
  const std::string t(tensor);
  for (const auto& p : row.params) {
    const std::string name(p.name);
    const nlohmann::json* given = nullptr;
    if (params.contains(t) && params.at(t).contains(name)) {
      given = &params.at(t).at(name);
    } else if (params.contains(name)) {
      given = &params.at(name);
    }
    if (p.is_text()) {
      out[name] = given ? given->get<std::string>() : std::string(p.text_default);
    } else {
      out[name] = given ? given->get<double>() : p.default_value;
    }
  }
  return out;
}

}  // namespace

std::span<const GeneratorRow> GeneratorTable() { return Table(); }

std::vector<std::string> GeneratorNames() {
  std::vector<std::string> names;
  for (const auto& row : Table()) names.emplace_back(row.name);
  return names;
}

Status ValidateGeneratorSpec(const Problem& p, const GeneratorSpec& spec) {
  const GeneratorRow* row = FindRow(spec.name);
  if (row == nullptr) {
    std::string known;
    for (const auto& n : GeneratorNames()) known += (known.empty() ? "" : ", ") + n;
    return Error{
        fmt::format("generator.name: unknown generator {} (known: {})", QuotedExcerpt(spec.name),
                    known)};
  }
  if (Status s = CheckParamObject(*row, spec.params, "generator.params", true); !s) return s;
  if (Status s = CheckLogitParams(p.sink, spec.params, "sink"); !s) return s;
  if (Status s = CheckLogitParams(p.rel_bias, spec.params, "rel_bias"); !s) return s;
  for (const auto& t : kTensors) {
    const std::string where = fmt::format("generator.params.{}", t.name);
    if (spec.params.contains(std::string(t.name))) {
      if (Status s = CheckParamObject(*row, spec.params.at(std::string(t.name)), where, false);
          !s) {
        return s;
      }
    }
    if (row->check) {
      if (Status s = row->check(ResolveParams(*row, spec.params, t.name), where); !s) return s;
    }
  }
  return {};
}

Expected<GeneratedInputs> GenerateInputs(const Problem& p, const GeneratorSpec& spec) {
  if (Status s = Validate(p); !s) return s.error();
  if (Status s = ValidateGeneratorSpec(p, spec); !s) return s.error();
  if (HasLogicalView(p)) return PlaceLogicalInputs(p, spec);
  const GeneratorRow& row = *FindRow(spec.name);

  GeneratedInputs out;
  Tensor* targets[] = {&out.q, &out.k, &out.v, &out.dout};
  const Shape shapes[] = {p.QShape(), p.KShape(), p.VShape(), p.OShape()};
  std::vector<const Tensor*> earlier;
  for (size_t t = 0; t < 4; ++t) {
    FillContext ctx;
    ctx.problem = &p;
    ctx.tensor = kTensors[t].name;
    ctx.stream = kTensors[t].stream;
    ctx.seed = spec.seed;
    ctx.shape = shapes[t];
    ctx.params = ResolveParams(row, spec.params, kTensors[t].name);
    ctx.earlier = &earlier;
    *targets[t] = Tensor::Zeros(DType::kF64, shapes[t]);
    row.fill(ctx, targets[t]->span<double>());
    earlier.push_back(targets[t]);
  }
  if (p.sink) out.sink = GenerateLogits(spec, "sink", p.SinkShape(), kStreamSink);
  if (p.rel_bias) {
    out.rel_bias = GenerateLogits(spec, "rel_bias", p.RelBiasShape(), kStreamRelBias);
  }
  return out;
}

}  // namespace attest
