// Deterministic input generators (see generate.h). Philox-4x32-10 follows Salmon et al., SC'11,
// with the constants of Random123 (philox.h: PHILOX_M4x32_0/1, PHILOX_W32_0/1); its
// known-answer vectors (Random123 examples/kat_vectors) are pinned in generate_test.cc.
//
// This file is compiled with -ffp-contract=off (see CMakeLists.txt): a fused multiply-add
// rounds once where a*b+c rounds twice, so contraction would change the last bits between
// machines with and without FMA.
#include "reference/data/generate.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include <fmt/format.h>

// Every double operation must round to double once (no x87 80-bit intermediates).
static_assert(FLT_EVAL_METHOD == 0, "generators need IEEE double evaluation (e.g. SSE2)");
static_assert(std::numeric_limits<double>::is_iec559);

namespace attest {

// --- Philox -------------------------------------------------------------------------------

namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9;  // golden ratio
constexpr uint32_t kPhiloxW1 = 0xBB67AE85;  // sqrt(3) - 1
constexpr int kPhiloxRounds = 10;

}  // namespace

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    const uint64_t p0 = uint64_t{kPhiloxM0} * c[0];
    const uint64_t p1 = uint64_t{kPhiloxM1} * c[2];
    const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

uint64_t ElementStream::NextU64() {
  if (used_ > 2) {
    buffer_ = Philox4x32(
        {static_cast<uint32_t>(index_), static_cast<uint32_t>(index_ >> 32), stream_, block_++},
        key_);
    used_ = 0;
  }
  const uint64_t w = (uint64_t{buffer_[used_]} << 32) | buffer_[used_ + 1];
  used_ += 2;
  return w;
}

double ElementStream::NextUniform() {
  // k * 2^-53 with k < 2^53 is exact: every value of the grid {0, 2^-53, ..., 1 - 2^-53}.
  return static_cast<double>(NextU64() >> 11) * 0x1p-53;
}

double ElementStream::NextNormal() {
  // Marsaglia's polar method: (u, v) uniform in the unit disc; z = u * sqrt(-2 ln s / s).
  // Acceptance is pi/4 per attempt, so needing more than 200 attempts has probability
  // (1 - pi/4)^200 < 1e-130; each attempt reads fresh words of this element's own stream.
  for (;;) {
    const double u = 2.0 * NextUniform() - 1.0;  // exact: the grid of k * 2^-52 in [-1, 1)
    const double v = 2.0 * NextUniform() - 1.0;
    const double s = u * u + v * v;
    if (s >= 1.0 || s == 0.0) continue;
    return u * std::sqrt(-2.0 * DeterministicLog(s) / s);
  }
}

double DeterministicLog(double x) {
  // 1. Special values.
  if (std::isnan(x) || x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return -std::numeric_limits<double>::infinity();
  if (std::isinf(x)) return x;
  // 2. x = m * 2^e with m in [sqrt(1/2), sqrt(2)), read from the bits (exact). Subnormals are
  // first scaled by 2^54 (exact).
  int e = 0;
  if (x < std::numeric_limits<double>::min()) {
    x *= 0x1p54;
    e = -54;
  }
  const auto bits = std::bit_cast<uint64_t>(x);
  e += static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  double m = std::bit_cast<double>((bits & 0x000f'ffff'ffff'ffffULL) | 0x3ff0'0000'0000'0000ULL);
  if (m > 0x1.6a09e667f3bcdp+0) {  // sqrt(2) rounded
    m *= 0.5;
    ++e;
  }
  // 3. ln m = ln(1 + f) with f = m - 1 exact (Sterbenz), f in [-0.293, 0.414]. With
  // s = f / (2 + f), ln(1 + f) = 2 atanh(s) = 2s + s R(s^2), R = 2z/3 + 2z^2/5 + ..., and
  // 2s = f - s f = f - (hfsq - s hfsq) where hfsq = f^2 / 2. Arranged as f - (correction)
  // (the layout of fdlibm's e_log.c), the exact f carries the leading bits and the rounding
  // of s and R only touches a correction below |f| / 2.
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;  // <= 0.0295: the series through z^12 leaves < 2^-60 relative
  double r = 2.0 / 25.0;
  for (int k = 11; k >= 1; --k) r = r * z + 2.0 / (2.0 * k + 1.0);
  r *= z;
  const double hfsq = 0.5 * f * f;
  // 4. e ln 2 in two pieces (fdlibm's ln2_hi has 32 trailing zero bits, so e * ln2_hi is exact
  // for |e| < 2^20), the small piece folded into the correction.
  constexpr double kLn2Hi = 0x1.62e42fee00000p-1;
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
  const double de = static_cast<double>(e);
  return de * kLn2Hi - ((hfsq - (s * (hfsq + r) + de * kLn2Lo)) - f);
}

// --- Generator rows -----------------------------------------------------------------------

namespace {

double Param(const FillContext& ctx, const char* name) { return ctx.params.at(name).get<double>(); }

// Element n of the tensor reads ElementStream(seed, stream, n) only, so splitting the tensor
// across threads cannot change a bit (generate_test checks elements against single streams).
template <class Sample>
void FillElementwise(const FillContext& ctx, std::span<double> out, Sample sample) {
  auto fill_range = [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      ElementStream s(ctx.seed, ctx.stream, n);
      out[n] = sample(s);
    }
  };
  constexpr size_t kMinPerThread = size_t{1} << 16;
  const size_t threads = std::clamp<size_t>(out.size() / kMinPerThread, 1,
                                            std::max(1u, std::thread::hardware_concurrency()));
  if (threads == 1) {
    fill_range(0, out.size());
    return;
  }
  std::vector<std::thread> pool;
  const size_t chunk = (out.size() + threads - 1) / threads;
  for (size_t t = 0; t < threads; ++t) {
    const size_t begin = std::min(out.size(), t * chunk);
    pool.emplace_back(fill_range, begin, std::min(out.size(), begin + chunk));
  }
  for (auto& th : pool) th.join();
}

void FillGaussian(const FillContext& ctx, std::span<double> out) {
  const double mean = Param(ctx, "mean");
  const double std = Param(ctx, "std");
  FillElementwise(ctx, out, [&](ElementStream& s) { return mean + std * s.NextNormal(); });
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
    return Error{fmt::format("{}: expected an object, got {}", where, obj.dump())};
  }
  for (const auto& [key, value] : obj.items()) {
    if (allow_tensors && IsTensorName(key)) continue;
    const bool known = std::any_of(row.params.begin(), row.params.end(),
                                   [&](const GeneratorParam& p) { return p.name == key; });
    if (!known) {
      return Error{fmt::format("{}: unknown parameter \"{}\" for generator {} (parameters: {}{})",
                               where, key, row.name, ParamNames(row),
                               allow_tensors ? "; per-tensor overrides: q, k, v, do" : "")};
    }
    if (!value.is_number() || !std::isfinite(value.get<double>())) {
      return Error{
          fmt::format("{}.{}: expected a finite number, got {}", where, key, value.dump())};
    }
  }
  return {};
}

// The tensor's parameters: its override, else the top level, else the row's default.
nlohmann::json ResolveParams(const GeneratorRow& row, const nlohmann::json& params,
                             std::string_view tensor) {
  nlohmann::json out = nlohmann::json::object();
  const std::string t(tensor);
  for (const auto& p : row.params) {
    const std::string name(p.name);
    if (params.contains(t) && params.at(t).contains(name)) {
      out[name] = params.at(t).at(name).get<double>();
    } else if (params.contains(name)) {
      out[name] = params.at(name).get<double>();
    } else {
      out[name] = p.default_value;
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
  (void)p;  // rows may later depend on the problem (e.g. which channel is an outlier)
  const GeneratorRow* row = FindRow(spec.name);
  if (row == nullptr) {
    std::string known;
    for (const auto& n : GeneratorNames()) known += (known.empty() ? "" : ", ") + n;
    return Error{
        fmt::format("generator.name: unknown generator \"{}\" (known: {})", spec.name, known)};
  }
  if (Status s = CheckParamObject(*row, spec.params, "generator.params", true); !s) return s;
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
  return out;
}

}  // namespace attest
