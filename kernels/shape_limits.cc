// Shape limits: the violation test, JSON, and the move to the nearest legal shape (see
// shape_limits.h).
#include "kernels/shape_limits.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace attest {
namespace {

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// The smaller of two maxima where 0 means none.
int64_t MinMax(int64_t a, int64_t b) {
  if (a == 0) return b;
  if (b == 0) return a;
  return std::min(a, b);
}

// One side's limits.
struct Side {
  int64_t multiple, min, max;
};
Side QSide(const ShapeLimits& s) { return {s.seqlen_q_multiple, s.min_seqlen_q, s.max_seqlen_q}; }
Side KSide(const ShapeLimits& s) { return {s.seqlen_k_multiple, s.min_seqlen_k, s.max_seqlen_k}; }
// Both sides at once (equal lengths): a multiple of both multiples, inside both ranges.
Side Common(const ShapeLimits& s) {
  return {std::lcm(s.seqlen_q_multiple, s.seqlen_k_multiple),
          std::max(s.min_seqlen_q, s.min_seqlen_k), MinMax(s.max_seqlen_q, s.max_seqlen_k)};
}

std::string LengthViolation(const char* what, int64_t n, const Side& side) {
  if (n % side.multiple != 0) {
    return fmt::format("{} {} is not a multiple of {}", what, n, side.multiple);
  }
  if (n < side.min) return fmt::format("{} {} is below the minimum {}", what, n, side.min);
  if (side.max > 0 && n > side.max) {
    return fmt::format("{} {} exceeds the maximum {}", what, n, side.max);
  }
  return {};
}

// Steps 1-2 of FitShape for one length: the legal length at or above n (0 stays 0 where the
// minimum is 0), lowered under the maximum; nullopt when there is none.
std::optional<int64_t> FitLength(int64_t n, const Side& side) {
  if (n == 0 && side.min == 0) return 0;
  int64_t x = RoundUp(std::max<int64_t>({n, side.min, 1}), side.multiple);
  if (side.max > 0 && x > side.max) x = side.max / side.multiple * side.multiple;
  if (x < std::max<int64_t>(side.min, 1)) return std::nullopt;
  return x;
}

// The smallest legal length above `than` on `side`, or nullopt.
std::optional<int64_t> LegalAbove(int64_t than, const Side& side) {
  const int64_t x = std::max(RoundUp(than + 1, side.multiple), RoundUp(side.min, side.multiple));
  if (side.max > 0 && x > side.max) return std::nullopt;
  return x;
}

int Sign(int64_t x) { return (x > 0) - (x < 0); }

// Steps 1-4 for one sequence's (q_len, k_len); "" or why not.
std::string FitPair(int64_t& q, int64_t& k, const ShapeLimits& s, const ShapeIntent& intent,
                    const std::string& where) {
  const int64_t q0 = q, k0 = k;
  if (intent.empty_sequences && (q0 == 0 || k0 == 0)) {
    if (q0 == 0 && s.min_seqlen_q > 0) {
      return fmt::format("{}has q_len 0 and the kernel's min_seqlen_q is {}", where,
                         s.min_seqlen_q);
    }
    if (k0 == 0 && s.min_seqlen_k > 0) {
      return fmt::format("{}has k_len 0 and the kernel's min_seqlen_k is {}", where,
                         s.min_seqlen_k);
    }
  }
  if (s.equal_seqlens) {
    if (q0 != k0 && intent.order) {
      return fmt::format("{}is for q_len {} k_len ({} vs {}) and the kernel requires equal "
                         "lengths",
                         where, q0 < k0 ? "<" : ">", q0, k0);
    }
    if ((q0 == 0) != (k0 == 0) && intent.empty_sequences) {
      return fmt::format("{}has one empty side and the kernel requires equal lengths", where);
    }
    const auto l = FitLength(std::max(q0, k0), Common(s));
    if (!l) return fmt::format("{}has no length inside the kernel's limits on both sides", where);
    q = k = *l;
    return {};
  }
  const auto fq = FitLength(q0, QSide(s));
  const auto fk = FitLength(k0, KSide(s));
  if (!fq) return fmt::format("{}has no legal q_len near {}", where, q0);
  if (!fk) return fmt::format("{}has no legal k_len near {}", where, k0);
  q = *fq;
  k = *fk;
  if (!intent.order || Sign(q - k) == Sign(q0 - k0)) return {};
  // 4. The order changed: grow the side that must be longer, or meet on a common length.
  std::optional<int64_t> grown;
  if (q0 < k0) {
    grown = LegalAbove(q, KSide(s));
    if (grown) k = *grown;
  } else if (q0 > k0) {
    grown = LegalAbove(k, QSide(s));
    if (grown) q = *grown;
  } else {
    grown = FitLength(std::max(q, k), Common(s));
    if (grown) q = k = *grown;
  }
  if (!grown) {
    return fmt::format("{}loses its q_len {} k_len order inside the kernel's limits", where,
                       q0 < k0 ? "<" : q0 > k0 ? ">" : "=");
  }
  return {};
}


void ResizeIds(std::optional<std::vector<std::vector<int32_t>>>& ids, int64_t rows,
               int64_t len) {
  if (!ids) return;
  ids->resize(static_cast<size_t>(rows), ids->empty() ? std::vector<int32_t>{} : ids->back());
  for (auto& row : *ids) {
    const int32_t last = row.empty() ? 0 : row.back();
    row.resize(static_cast<size_t>(len), last);
  }
}

bool ReadLimit(const nlohmann::json& j, const char* key, int64_t min, int64_t& out,
               std::string& error) {
  if (!j.contains(key)) return true;
  const auto& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < min || v.get<int64_t>() > (int64_t{1} << 31)) {
    error = fmt::format("capabilities.shapes.{}: must be an integer in [{}, 2^31]", key, min);
    return false;
  }
  out = v.get<int64_t>();
  return true;
}

}  // namespace

void DropBlocksPastLengths(Problem& p) {
  if (!p.block_sparse) return;
  BlockSparse& bs = *p.block_sparse;
  const int64_t nq = (p.seqlen_q + bs.block_q - 1) / bs.block_q;
  const int64_t nk = (p.seqlen_k + bs.block_k - 1) / bs.block_k;
  std::erase_if(bs.blocks, [&](const std::pair<int64_t, int64_t>& b) {
    return b.first >= nq || b.second >= nk;
  });
}

std::string ShapeViolation(const ShapeLimits& s, const Problem& p) {
  if (!s.any()) return {};
  if (s.max_batch > 0 && p.batch > s.max_batch) {
    return fmt::format("batch {} exceeds max_batch {}", p.batch, s.max_batch);
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence seq = SequenceOf(p, b);
    const std::string at = p.varlen() ? fmt::format("sequence {}: ", b) : std::string();
    const bool packed = p.varlen();
    std::string w = LengthViolation(packed ? "q_len" : "seqlen_q", seq.q_len, QSide(s));
    if (w.empty()) w = LengthViolation(packed ? "k_len" : "seqlen_k", seq.k_len, KSide(s));
    if (w.empty() && s.equal_seqlens && seq.q_len != seq.k_len) {
      w = fmt::format("{} {} != {} {} (the kernel requires equal lengths)",
                      packed ? "q_len" : "seqlen_q", seq.q_len, packed ? "k_len" : "seqlen_k",
                      seq.k_len);
    }
    if (!w.empty()) return at + w;
    if (!packed) break;  // every padded sequence has the same lengths
  }
  return {};
}

nlohmann::json ShapeLimitsToJson(const ShapeLimits& s) {
  nlohmann::json j = nlohmann::json::object();
  if (s.seqlen_q_multiple != 1) j["seqlen_q_multiple"] = s.seqlen_q_multiple;
  if (s.seqlen_k_multiple != 1) j["seqlen_k_multiple"] = s.seqlen_k_multiple;
  if (s.equal_seqlens) j["equal_seqlens"] = true;
  if (s.min_seqlen_q != 0) j["min_seqlen_q"] = s.min_seqlen_q;
  if (s.min_seqlen_k != 0) j["min_seqlen_k"] = s.min_seqlen_k;
  if (s.max_seqlen_q != 0) j["max_seqlen_q"] = s.max_seqlen_q;
  if (s.max_seqlen_k != 0) j["max_seqlen_k"] = s.max_seqlen_k;
  if (s.max_batch != 0) j["max_batch"] = s.max_batch;
  return j;
}

Expected<ShapeLimits> ShapeLimitsFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return Error{"capabilities.shapes: not a JSON object"};
  static constexpr const char* kKeys[] = {"seqlen_q_multiple", "seqlen_k_multiple",
                                          "equal_seqlens",     "min_seqlen_q",
                                          "min_seqlen_k",      "max_seqlen_q",
                                          "max_seqlen_k",      "max_batch"};
  for (const auto& [key, value] : j.items()) {
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
      return Error{fmt::format("capabilities.shapes.{}: unknown limit (known: {})", key,
                               fmt::join(kKeys, ", "))};
    }
  }
  ShapeLimits s;
  std::string error;
  if (!ReadLimit(j, "seqlen_q_multiple", 1, s.seqlen_q_multiple, error) ||
      !ReadLimit(j, "seqlen_k_multiple", 1, s.seqlen_k_multiple, error) ||
      !ReadLimit(j, "min_seqlen_q", 0, s.min_seqlen_q, error) ||
      !ReadLimit(j, "min_seqlen_k", 0, s.min_seqlen_k, error) ||
      !ReadLimit(j, "max_seqlen_q", 0, s.max_seqlen_q, error) ||
      !ReadLimit(j, "max_seqlen_k", 0, s.max_seqlen_k, error) ||
      !ReadLimit(j, "max_batch", 0, s.max_batch, error)) {
    return Error{error};
  }
  if (j.contains("equal_seqlens")) {
    if (!j["equal_seqlens"].is_boolean()) {
      return Error{"capabilities.shapes.equal_seqlens: not a boolean"};
    }
    s.equal_seqlens = j["equal_seqlens"].get<bool>();
  }
  // Limits no problem meets are a declaration mistake, not a kernel that refuses everything.
  for (const auto& [side, name] : {std::pair{QSide(s), "q"}, std::pair{KSide(s), "k"}}) {
    if (!FitLength(1, side)) {
      return Error{fmt::format(
          "capabilities.shapes.max_seqlen_{}: {} leaves no positive length that is a multiple "
          "of {} and at least {}",
          name, side.max, side.multiple, side.min)};
    }
  }
  if (s.equal_seqlens && !FitLength(1, Common(s))) {
    return Error{"capabilities.shapes.equal_seqlens: no positive length meets both sides' "
                 "limits"};
  }
  return s;
}

std::string FitShape(Problem& p, const ShapeLimits& s, const ShapeIntent& intent) {
  if (!s.any()) return {};
  // The batch first: which sequences there are.
  if (s.max_batch > 0 && p.batch > s.max_batch) {
    if (intent.batch && s.max_batch == 1) {
      return fmt::format("the row is for batch {} > 1 and the kernel's max_batch is 1", p.batch);
    }
    if (p.varlen()) {
      p.cu_seqlens_q->resize(static_cast<size_t>(s.max_batch + 1));
      p.cu_seqlens_k->resize(static_cast<size_t>(s.max_batch + 1));
    }
    p.batch = s.max_batch;
  }
  if (p.varlen()) {
    std::vector<int32_t> cq{0}, ck{0};
    int64_t max_q = 0, max_k = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      const Sequence seq = SequenceOf(p, b);
      int64_t q = seq.q_len, k = seq.k_len;
      if (std::string w = FitPair(q, k, s, intent, fmt::format("the row's sequence {} ", b)); !w.empty()) {
        return w;
      }
      cq.push_back(static_cast<int32_t>(cq.back() + q));
      ck.push_back(static_cast<int32_t>(ck.back() + k));
      max_q = std::max(max_q, q), max_k = std::max(max_k, k);
    }
    p.cu_seqlens_q = cq;
    p.cu_seqlens_k = ck;
    p.seqlen_q = std::max<int64_t>(1, max_q);
    p.seqlen_k = std::max<int64_t>(1, max_k);
  } else {
    int64_t q = p.seqlen_q, k = p.seqlen_k;
    if (std::string w = FitPair(q, k, s, intent, "the row "); !w.empty()) return w;
    p.seqlen_q = q;
    p.seqlen_k = k;
    ResizeIds(p.document_ids_q, p.batch, q);
    ResizeIds(p.document_ids_k, p.batch, k);
  }
  DropBlocksPastLengths(p);
  if (p.prefix_lm > p.seqlen_k) p.prefix_lm = std::max<int64_t>(1, p.seqlen_k);
  return {};
}

}  // namespace attest
