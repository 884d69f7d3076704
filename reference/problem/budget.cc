// The memory budget (see budget.h).
#include "reference/problem/budget.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <limits>

namespace attest {
namespace {

constexpr uint64_t kSaturated = std::numeric_limits<uint64_t>::max();

uint64_t Mul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? kSaturated : r;
}
uint64_t Add(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? kSaturated : r;
}
uint64_t U(int64_t v) { return v > 0 ? static_cast<uint64_t>(v) : 0; }

}  // namespace

Expected<uint64_t> ParseByteCount(std::string_view text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr == text.data()) {
    return Error{fmt::format("'{}' is not a byte count (e.g. 8G, 512M, 1073741824)", text)};
  }
  const std::string_view suffix(ptr, static_cast<size_t>(end - ptr));
  int shift = 0;
  if (suffix == "K" || suffix == "KiB") {
    shift = 10;
  } else if (suffix == "M" || suffix == "MiB") {
    shift = 20;
  } else if (suffix == "G" || suffix == "GiB") {
    shift = 30;
  } else if (suffix == "T" || suffix == "TiB") {
    shift = 40;
  } else if (!suffix.empty()) {
    return Error{fmt::format("'{}': unknown suffix '{}' (K, M, G or T)", text, suffix)};
  }
  if (shift > 0 && value > (kSaturated >> shift)) {
    return Error{fmt::format("'{}' does not fit in 64 bits", text)};
  }
  if (value == 0) return Error{fmt::format("'{}' must be positive", text)};
  return value << shift;
}

Expected<uint64_t> MemoryBudgetBytes() {
  const char* env = std::getenv("ATTEST_MEMORY_BUDGET");
  if (env == nullptr || *env == '\0') return kDefaultMemoryBudgetBytes;
  auto bytes = ParseByteCount(env);
  if (!bytes) return Error{"ATTEST_MEMORY_BUDGET: " + bytes.error().message};
  return bytes;
}

std::string ByteCountText(uint64_t bytes) {
  constexpr const char* kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 6) v /= 1024, ++unit;
  return unit == 0 ? fmt::format("{} bytes", bytes) : fmt::format("{:.3g} {}", v, kUnits[unit]);
}

uint64_t EstimatedProblemBytes(const Problem& p) {
  const uint64_t tq = U(p.TotalQ()), tk = U(p.TotalK());
  const uint64_t hq = U(p.heads_q), hkv = U(p.heads_kv);
  const uint64_t d = U(p.head_dim), dv = U(p.head_dim_v);
  // q, do/o, dq and k, v, dk, dv: elements of each, then lse.
  uint64_t elements = Mul(Mul(tq, hq), d);                  // q
  elements = Add(elements, Mul(Mul(tq, hq), d));            // dq
  elements = Add(elements, Mul(Mul(Mul(tq, hq), dv), 2));   // o, do
  elements = Add(elements, Mul(Mul(Mul(tk, hkv), d), 2));   // k, dk
  elements = Add(elements, Mul(Mul(Mul(tk, hkv), dv), 2));  // v, dv
  elements = Add(elements, Mul(tq, hq));                    // lse
  return Mul(Mul(elements, sizeof(double)), kWorkingCopies);
}

Status CheckProblemBudget(const Problem& p) {
  auto budget = MemoryBudgetBytes();
  if (!budget) return budget.error();
  const uint64_t need = EstimatedProblemBytes(p);
  if (need <= *budget) return {};
  return Error{fmt::format(
      "problem needs about {} (batch {}, seqlen_q {}, seqlen_k {}, heads_q {}, heads_kv {}, "
      "head_dim {}, head_dim_v {}{}) over the {} memory budget (ATTEST_MEMORY_BUDGET raises it)",
      need == kSaturated ? std::string("more than 16 EiB") : ByteCountText(need), p.batch,
      p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v,
      p.varlen() ? fmt::format(", total_q {}, total_k {}", p.TotalQ(), p.TotalK()) : "",
      ByteCountText(*budget))};
}

}  // namespace attest
