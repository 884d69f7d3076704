// Problem: shapes, sequences, validation and the case-file "problem" JSON (docs/design.md "Case
// files" and "Semantics"; flash-attention `flash_attn_func` / `flash_attn_varlen_func` layout).
#include "reference/problem/problem.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "reference/io/json.h"
#include "reference/problem/paged.h"

namespace attest {

using nlohmann::json;

double Problem::EffectiveScale() const {
  // sqrt is correctly rounded (IEEE 754), so the default scale is the same on every machine.
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

int64_t Problem::TotalQ() const {
  if (cu_seqlens_q && !cu_seqlens_q->empty()) return cu_seqlens_q->back();
  return batch * seqlen_q;
}

int64_t Problem::TotalK() const {
  if (cu_seqlens_k && !cu_seqlens_k->empty()) return cu_seqlens_k->back();
  return batch * seqlen_k;
}

Shape Problem::QShape() const {
  if (varlen()) return {TotalQ(), heads_q, head_dim};
  return {batch, seqlen_q, heads_q, head_dim};
}

Shape Problem::KShape() const {
  if (paged()) return {num_pages, page_size, heads_kv, head_dim};
  if (varlen()) return {TotalK(), heads_kv, head_dim};
  return {batch, seqlen_k, heads_kv, head_dim};
}

Shape Problem::VShape() const {
  if (paged()) return {num_pages, page_size, heads_kv, head_dim_v};
  if (varlen()) return {TotalK(), heads_kv, head_dim_v};
  return {batch, seqlen_k, heads_kv, head_dim_v};
}

Shape Problem::OShape() const {
  if (varlen()) return {TotalQ(), heads_q, head_dim_v};
  return {batch, seqlen_q, heads_q, head_dim_v};
}

Shape Problem::LseShape() const {
  if (varlen()) return {heads_q, TotalQ()};
  return {batch, heads_q, seqlen_q};
}

Sequence SequenceOf(const Problem& p, int64_t b) {
  assert(b >= 0 && b < p.batch);
  Sequence s;
  if (p.cu_seqlens_q && p.cu_seqlens_k) {
    const auto ub = static_cast<size_t>(b);
    s.q_begin = (*p.cu_seqlens_q)[ub];
    s.q_len = (*p.cu_seqlens_q)[ub + 1] - s.q_begin;
    s.k_begin = (*p.cu_seqlens_k)[ub];
    s.k_len = (*p.cu_seqlens_k)[ub + 1] - s.k_begin;
  } else {
    s.q_begin = b * p.seqlen_q;
    s.q_len = p.seqlen_q;
    s.k_begin = b * p.seqlen_k;
    s.k_len = p.seqlen_k;
  }
  return s;
}

namespace {

// Integer fields are capped at int32: every kernel under test indexes with 32-bit ints, and
// the cap keeps sums like `i + offset + right + 1` far from int64 overflow.
constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();
// Element counts beyond 2^62 cannot be allocated and would overflow products downstream.
constexpr int64_t kMaxElements = int64_t{1} << 62;

constexpr std::string_view kFields[] = {
    "batch",        "heads_q",        "heads_kv",       "seqlen_q",     "seqlen_k",
    "head_dim",     "head_dim_v",     "dtype",          "scale",        "causal",
    "causal_align", "window",         "softcap",        "alibi_slopes", "cu_seqlens_q",
    "cu_seqlens_k", "document_ids_q", "document_ids_k", "prefix_lm",    "block_sparse",
    "mask_form",    "sink",           "rel_bias",       "num_splits",   "page_size",
    "num_pages",    "page_table",     "seqused_q",      "seqused_k",
};
constexpr std::string_view kBlockSparseFields[] = {"block_q", "block_k", "blocks"};

bool IsInputFloat(DType d) {
  switch (d) {
    case DType::kF64:
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kE4M3FN:
    case DType::kE5M2:
      return true;
    default:
      return false;
  }
}

std::string_view AlignName(CausalAlign a) {
  return a == CausalAlign::kBottomRight ? "bottom_right" : "top_left";
}

std::string ShapeString(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Levenshtein distance, for "did you mean" hints on misspelt field names.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

template <size_t N>
Status CheckKnownFields(const json& obj, std::string_view where,
                        const std::string_view (&known)[N]) {
  for (const auto& [key, value] : obj.items()) {
    if (std::find(std::begin(known), std::end(known), key) != std::end(known)) continue;
    std::string_view best;
    size_t best_d = 3;  // suggest only close matches
    for (std::string_view k : known) {
      const size_t d = EditDistance(key, k);
      if (d < best_d) best_d = d, best = k;
    }
    std::string msg = fmt::format("{}: unknown field {}", where, QuotedExcerpt(key));
    if (!best.empty()) msg += fmt::format(" (did you mean \"{}\"?)", best);
    return Error{msg};
  }
  return {};
}

// Reads typed fields, remembering the first error; the parse stops at the end if any.
class Reader {
 public:
  bool failed() const { return error_.has_value(); }
  Error error() const { return *error_; }
  void Fail(std::string msg) {
    if (!error_) error_ = Error{std::move(msg)};
  }

  int64_t Int(const json& v, const std::string& field) {
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        Fail(fmt::format("{}: {} is out of range", field, JsonExcerpt(v)));
        return 0;
      }
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    Fail(fmt::format("{}: expected an integer, got {}", field, JsonExcerpt(v)));
    return 0;
  }

  int32_t Int32(const json& v, const std::string& field) {
    const int64_t x = Int(v, field);
    if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max()) {
      Fail(fmt::format("{}: {} does not fit in int32", field, x));
      return 0;
    }
    return static_cast<int32_t>(x);
  }

  double Number(const json& v, const std::string& field) {
    if (v.is_number()) return v.get<double>();
    Fail(fmt::format("{}: expected a number, got {}", field, JsonExcerpt(v)));
    return 0;
  }

  bool Bool(const json& v, const std::string& field) {
    if (v.is_boolean()) return v.get<bool>();
    Fail(fmt::format("{}: expected true or false, got {}", field, JsonExcerpt(v)));
    return false;
  }

  std::string String(const json& v, const std::string& field) {
    if (v.is_string()) return v.get<std::string>();
    Fail(fmt::format("{}: expected a string, got {}", field, JsonExcerpt(v)));
    return {};
  }

  const json* Array(const json& v, const std::string& field) {
    if (v.is_array()) return &v;
    Fail(fmt::format("{}: expected an array, got {}", field, JsonExcerpt(v)));
    return nullptr;
  }

  std::vector<int32_t> Int32List(const json& v, const std::string& field) {
    std::vector<int32_t> out;
    if (!Array(v, field)) return out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size() && !failed(); ++i) {
      out.push_back(Int32(v[i], fmt::format("{}[{}]", field, i)));
    }
    return out;
  }

 private:
  std::optional<Error> error_;
};

std::string F(std::string_view name) { return fmt::format("problem.{}", name); }

}  // namespace

Expected<Problem> ProblemFromJson(const json& j) {
  if (!j.is_object())
    return Error{fmt::format("problem: expected an object, got {}", JsonExcerpt(j))};
  if (Status s = CheckKnownFields(j, "problem", kFields); !s) return s.error();

  Problem p;
  Reader r;
  auto has = [&](const char* k) { return j.contains(k); };
  auto has_value = [&](const char* k) { return j.contains(k) && !j.at(k).is_null(); };

  if (has("batch")) p.batch = r.Int(j.at("batch"), F("batch"));
  if (has("heads_q")) p.heads_q = r.Int(j.at("heads_q"), F("heads_q"));
  if (has("heads_kv")) p.heads_kv = r.Int(j.at("heads_kv"), F("heads_kv"));
  if (has("seqlen_q")) p.seqlen_q = r.Int(j.at("seqlen_q"), F("seqlen_q"));
  if (has("seqlen_k")) p.seqlen_k = r.Int(j.at("seqlen_k"), F("seqlen_k"));
  if (has("head_dim")) p.head_dim = r.Int(j.at("head_dim"), F("head_dim"));
  if (has("head_dim_v")) p.head_dim_v = r.Int(j.at("head_dim_v"), F("head_dim_v"));
  if (has("dtype")) {
    const std::string name = r.String(j.at("dtype"), F("dtype"));
    if (!r.failed()) {
      const auto d = ParseDType(name);
      if (!d) {
        r.Fail(
            fmt::format("problem.dtype: unknown dtype {} (expected one of f64 f32 bf16 "
                        "f16 e4m3fn e5m2)",
                        QuotedExcerpt(name)));
      } else {
        p.dtype = *d;
      }
    }
  }
  if (has_value("scale")) p.scale = r.Number(j.at("scale"), F("scale"));
  if (has("causal")) p.causal = r.Bool(j.at("causal"), F("causal"));
  if (has("causal_align")) {
    const std::string a = r.String(j.at("causal_align"), F("causal_align"));
    if (a == "bottom_right") {
      p.causal_align = CausalAlign::kBottomRight;
    } else if (a == "top_left") {
      p.causal_align = CausalAlign::kTopLeft;
    } else if (!r.failed()) {
      r.Fail(
          fmt::format("problem.causal_align: {} is not \"bottom_right\" or \"top_left\"",
                      QuotedExcerpt(a)));
    }
  }
  if (has("window")) {
    const json& w = j.at("window");
    if (!w.is_array() || w.size() != 2) {
      r.Fail(fmt::format("problem.window: expected [left, right], got {}", JsonExcerpt(w)));
    } else {
      p.window_left = r.Int(w[0], F("window[0]"));
      p.window_right = r.Int(w[1], F("window[1]"));
    }
  }
  if (has("softcap")) p.softcap = r.Number(j.at("softcap"), F("softcap"));
  if (has_value("alibi_slopes") && r.Array(j.at("alibi_slopes"), F("alibi_slopes"))) {
    std::vector<double> slopes;
    const json& a = j.at("alibi_slopes");
    for (size_t i = 0; i < a.size() && !r.failed(); ++i) {
      slopes.push_back(r.Number(a[i], fmt::format("problem.alibi_slopes[{}]", i)));
    }
    p.alibi_slopes = std::move(slopes);
  }
  if (has_value("cu_seqlens_q"))
    p.cu_seqlens_q = r.Int32List(j.at("cu_seqlens_q"), F("cu_seqlens_q"));
  if (has_value("cu_seqlens_k"))
    p.cu_seqlens_k = r.Int32List(j.at("cu_seqlens_k"), F("cu_seqlens_k"));
  for (const char* name : {"document_ids_q", "document_ids_k"}) {
    if (!has_value(name) || !r.Array(j.at(name), F(name))) continue;
    std::vector<std::vector<int32_t>> ids;
    const json& a = j.at(name);
    for (size_t b = 0; b < a.size() && !r.failed(); ++b) {
      ids.push_back(r.Int32List(a[b], fmt::format("problem.{}[{}]", name, b)));
    }
    (std::string_view(name) == "document_ids_q" ? p.document_ids_q : p.document_ids_k) =
        std::move(ids);
  }
  if (has("prefix_lm")) p.prefix_lm = r.Int(j.at("prefix_lm"), F("prefix_lm"));
  if (has("mask_form")) p.mask_form = r.String(j.at("mask_form"), F("mask_form"));
  if (has("sink")) p.sink = r.Bool(j.at("sink"), F("sink"));
  if (has("rel_bias")) p.rel_bias = r.Bool(j.at("rel_bias"), F("rel_bias"));
  if (has("num_splits")) p.num_splits = r.Int(j.at("num_splits"), F("num_splits"));
  if (has("page_size")) p.page_size = r.Int(j.at("page_size"), F("page_size"));
  if (has("num_pages")) p.num_pages = r.Int(j.at("num_pages"), F("num_pages"));
  if (has_value("page_table") && r.Array(j.at("page_table"), F("page_table"))) {
    std::vector<std::vector<int32_t>> table;
    const json& a = j.at("page_table");
    for (size_t b = 0; b < a.size() && !r.failed(); ++b) {
      table.push_back(r.Int32List(a[b], fmt::format("problem.page_table[{}]", b)));
    }
    p.page_table = std::move(table);
  }
  if (has_value("seqused_q")) p.seqused_q = r.Int32List(j.at("seqused_q"), F("seqused_q"));
  if (has_value("seqused_k")) p.seqused_k = r.Int32List(j.at("seqused_k"), F("seqused_k"));
  if (has_value("block_sparse")) {
    const json& bs = j.at("block_sparse");
    if (!bs.is_object()) {
      r.Fail(fmt::format("problem.block_sparse: expected an object, got {}", JsonExcerpt(bs)));
    } else if (Status s = CheckKnownFields(bs, "problem.block_sparse", kBlockSparseFields); !s) {
      r.Fail(s.error().message);
    } else if (!bs.contains("blocks")) {
      r.Fail("problem.block_sparse.blocks: missing (list of [query block, key block] pairs)");
    } else {
      BlockSparse sparse;
      if (bs.contains("block_q"))
        sparse.block_q = r.Int(bs.at("block_q"), F("block_sparse.block_q"));
      if (bs.contains("block_k"))
        sparse.block_k = r.Int(bs.at("block_k"), F("block_sparse.block_k"));
      if (r.Array(bs.at("blocks"), F("block_sparse.blocks"))) {
        const json& blocks = bs.at("blocks");
        for (size_t n = 0; n < blocks.size() && !r.failed(); ++n) {
          const json& pair = blocks[n];
          const std::string field = fmt::format("problem.block_sparse.blocks[{}]", n);
          if (!pair.is_array() || pair.size() != 2) {
            r.Fail(fmt::format("{}: expected [query block, key block], got {}", field,
                               JsonExcerpt(pair)));
            break;
          }
          const int64_t qb = r.Int(pair[0], field + "[0]");
          const int64_t kb = r.Int(pair[1], field + "[1]");
          sparse.blocks.emplace_back(qb, kb);
        }
      }
      p.block_sparse = std::move(sparse);
    }
  }
  if (r.failed()) return r.error();
  if (p.page_size > 0 && p.page_size <= kMaxIndex && p.seqlen_k >= 0) FillPagedDefaults(p);
  if (Status s = Validate(p); !s) return s.error();
  return p;
}

json ProblemToJson(const Problem& p) {
  // The 16 fields of docs/design.md always appear (null where unset) so that every case file reads
  // the same; the mask-family extensions appear only when they are in use.
  json j = {
      {"batch", p.batch},
      {"heads_q", p.heads_q},
      {"heads_kv", p.heads_kv},
      {"seqlen_q", p.seqlen_q},
      {"seqlen_k", p.seqlen_k},
      {"head_dim", p.head_dim},
      {"head_dim_v", p.head_dim_v},
      {"dtype", std::string(Name(p.dtype))},
      {"scale", p.scale ? json(*p.scale) : json(nullptr)},
      {"causal", p.causal},
      {"causal_align", std::string(AlignName(p.causal_align))},
      {"window", json::array({p.window_left, p.window_right})},
      {"softcap", p.softcap},
      {"alibi_slopes", p.alibi_slopes ? json(*p.alibi_slopes) : json(nullptr)},
      {"cu_seqlens_q", p.cu_seqlens_q ? json(*p.cu_seqlens_q) : json(nullptr)},
      {"cu_seqlens_k", p.cu_seqlens_k ? json(*p.cu_seqlens_k) : json(nullptr)},
  };
  if (p.document_ids_q) j["document_ids_q"] = *p.document_ids_q;
  if (p.document_ids_k) j["document_ids_k"] = *p.document_ids_k;
  if (p.prefix_lm != 0) j["prefix_lm"] = p.prefix_lm;
  if (!p.mask_form.empty()) j["mask_form"] = p.mask_form;
  if (p.sink) j["sink"] = true;
  if (p.rel_bias) j["rel_bias"] = true;
  if (p.num_splits != 0) j["num_splits"] = p.num_splits;
  if (p.paged()) {
    j["page_size"] = p.page_size;
    j["num_pages"] = p.num_pages;
    if (p.page_table) j["page_table"] = *p.page_table;
  }
  if (p.seqused_q) j["seqused_q"] = *p.seqused_q;
  if (p.seqused_k) j["seqused_k"] = *p.seqused_k;
  if (p.block_sparse) {
    json blocks = json::array();
    for (const auto& [qb, kb] : p.block_sparse->blocks) blocks.push_back(json::array({qb, kb}));
    j["block_sparse"] = {{"block_q", p.block_sparse->block_q},
                         {"block_k", p.block_sparse->block_k},
                         {"blocks", std::move(blocks)}};
  }
  return j;
}

namespace {

Status CheckCuSeqlens(const std::vector<int32_t>& cu, int64_t batch, int64_t max_len,
                      std::string_view name, std::string_view max_name) {
  if (static_cast<int64_t>(cu.size()) != batch + 1) {
    return Error{fmt::format("problem.{}: has {} entries, expected batch + 1 = {}", name, cu.size(),
                             batch + 1)};
  }
  if (cu[0] != 0) return Error{fmt::format("problem.{}[0]: is {}, expected 0", name, cu[0])};
  for (size_t b = 1; b < cu.size(); ++b) {
    const int64_t len = int64_t{cu[b]} - cu[b - 1];
    if (len < 0) {
      return Error{fmt::format("problem.{}[{}]: {} is less than the previous entry {}", name, b,
                               cu[b], cu[b - 1])};
    }
    if (len > max_len) {
      return Error{fmt::format("problem.{}: sequence {} has length {} > {} = {}", name, b - 1, len,
                               max_name, max_len)};
    }
  }
  return {};
}

Status CheckDocumentIds(const std::vector<std::vector<int32_t>>& ids, int64_t batch, int64_t seqlen,
                        std::string_view name, std::string_view seqlen_name) {
  if (static_cast<int64_t>(ids.size()) != batch) {
    return Error{
        fmt::format("problem.{}: has {} rows, expected batch = {}", name, ids.size(), batch)};
  }
  for (size_t b = 0; b < ids.size(); ++b) {
    if (static_cast<int64_t>(ids[b].size()) != seqlen) {
      return Error{fmt::format("problem.{}[{}]: has {} entries, expected {} = {}", name, b,
                               ids[b].size(), seqlen_name, seqlen)};
    }
  }
  return {};
}

// Checked product of non-negative factors; false on overflow past kMaxElements.
bool CheckedCount(const Shape& shape, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > kMaxElements / d) return false;
    n *= d;
  }
  *out = n;
  return true;
}

// 1. Sizes: positive counts, non-negative lengths, all within int32.
Status CheckSizes(const Problem& p) {
  struct SizeField {
    std::string_view name;
    int64_t value;
    int64_t min;
  };
  const SizeField sizes[] = {
      {"batch", p.batch, 1},           {"heads_q", p.heads_q, 1},   {"heads_kv", p.heads_kv, 1},
      {"seqlen_q", p.seqlen_q, 0},     {"seqlen_k", p.seqlen_k, 0}, {"head_dim", p.head_dim, 1},
      {"head_dim_v", p.head_dim_v, 1}, {"num_splits", p.num_splits, 0},
  };
  if (p.num_splits > kMaxNumSplits) {
    return Error{fmt::format("problem.num_splits: {} is out of range [0, {}]", p.num_splits,
                             kMaxNumSplits)};
  }
  for (const auto& f : sizes) {
    if (f.value < f.min) {
      return Error{fmt::format("problem.{}: {} must be {}", f.name, f.value,
                               f.min == 1 ? "positive" : ">= 0")};
    }
    if (f.value > kMaxIndex) {
      return Error{
          fmt::format("problem.{}: {} exceeds the int32 limit {}", f.name, f.value, kMaxIndex)};
    }
  }
  if (p.heads_q % p.heads_kv != 0) {
    return Error{fmt::format("problem.heads_q: {} is not a multiple of heads_kv = {}", p.heads_q,
                             p.heads_kv)};
  }
  return {};
}

// 2. Element type: a float format a kernel takes q/k/v in.
Status CheckDtype(const Problem& p) {
  if (!IsInputFloat(p.dtype)) {
    return Error{
        fmt::format("problem.dtype: \"{}\" is not an input float type (f64 f32 bf16 "
                    "f16 e4m3fn e5m2)",
                    Name(p.dtype))};
  }
  if (!p.mask_form.empty() &&
      std::find(std::begin(kMaskForms), std::end(kMaskForms), p.mask_form) == std::end(kMaskForms)) {
    return Error{fmt::format("problem.mask_form: \"{}\" is not bool, additive or additive_f32",
                             p.mask_form.substr(0, 40))};
  }
  return {};
}

// 3. Score transforms.
Status CheckScoreTransforms(const Problem& p) {
  if (p.scale && !(std::isfinite(*p.scale) && *p.scale > 0)) {
    return Error{fmt::format("problem.scale: {} must be finite and > 0 (or null)", *p.scale)};
  }
  if (!(std::isfinite(p.softcap) && p.softcap >= 0)) {
    return Error{fmt::format("problem.softcap: {} must be finite and >= 0", p.softcap)};
  }
  if (p.alibi_slopes) {
    if (static_cast<int64_t>(p.alibi_slopes->size()) != p.heads_q) {
      return Error{fmt::format("problem.alibi_slopes: has {} entries, expected heads_q = {}",
                               p.alibi_slopes->size(), p.heads_q)};
    }
    for (size_t h = 0; h < p.alibi_slopes->size(); ++h) {
      if (!std::isfinite((*p.alibi_slopes)[h])) {
        return Error{
            fmt::format("problem.alibi_slopes[{}]: {} is not finite", h, (*p.alibi_slopes)[h])};
      }
    }
  }
  return {};
}

// 4. Window: -1 is the only spelling of "unbounded" (FA treats any negative as unbounded,
// flash-attention #1116; we ask for the explicit form so that typos fail).
Status CheckWindow(const Problem& p) {
  const int64_t window[] = {p.window_left, p.window_right};
  for (int side = 0; side < 2; ++side) {
    if (window[side] < -1 || window[side] > kMaxIndex) {
      return Error{fmt::format("problem.window[{}]: {} is out of range [-1, {}]", side,
                               window[side], kMaxIndex)};
    }
  }
  return {};
}

// 5. Packed variable length.
Status CheckVarlen(const Problem& p) {
  if (p.cu_seqlens_q.has_value() != p.cu_seqlens_k.has_value()) {
    return Error{fmt::format("problem.{}: set without {} (give both or neither)",
                             p.cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_k",
                             p.cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q")};
  }
  if (p.cu_seqlens_q) {
    if (Status s = CheckCuSeqlens(*p.cu_seqlens_q, p.batch, p.seqlen_q, "cu_seqlens_q", "seqlen_q");
        !s) {
      return s;
    }
    if (Status s = CheckCuSeqlens(*p.cu_seqlens_k, p.batch, p.seqlen_k, "cu_seqlens_k", "seqlen_k");
        !s) {
      return s;
    }
  }
  return {};
}

// 6. Per-token document ids.
Status CheckDocuments(const Problem& p) {
  if (p.document_ids_q.has_value() != p.document_ids_k.has_value()) {
    return Error{fmt::format("problem.{}: set without {} (give both or neither)",
                             p.document_ids_q ? "document_ids_q" : "document_ids_k",
                             p.document_ids_q ? "document_ids_k" : "document_ids_q")};
  }
  if (p.document_ids_q) {
    if (p.varlen()) {
      return Error{
          "problem.document_ids_q: per-token document ids cannot be combined with "
          "cu_seqlens_q/k (packed sequences are already separate documents)"};
    }
    if (Status s =
            CheckDocumentIds(*p.document_ids_q, p.batch, p.seqlen_q, "document_ids_q", "seqlen_q");
        !s) {
      return s;
    }
    if (Status s =
            CheckDocumentIds(*p.document_ids_k, p.batch, p.seqlen_k, "document_ids_k", "seqlen_k");
        !s) {
      return s;
    }
  }
  return {};
}

// 7. Prefix-LM: a bidirectional prefix in front of a causal suffix.
Status CheckPrefixLm(const Problem& p) {
  if (p.prefix_lm < 0 || p.prefix_lm > kMaxIndex) {
    return Error{
        fmt::format("problem.prefix_lm: {} is out of range [0, {}]", p.prefix_lm, kMaxIndex)};
  }
  if (p.prefix_lm > 0 && !p.causal) {
    return Error{fmt::format("problem.prefix_lm: {} requires causal = true", p.prefix_lm)};
  }
  return {};
}

// 8. Block-sparse lists: blocks tile each sequence from its start.
Status CheckBlockSparse(const Problem& p) {
  if (p.block_sparse) {
    const BlockSparse& bs = *p.block_sparse;
    if (bs.block_q < 1 || bs.block_q > kMaxIndex) {
      return Error{fmt::format("problem.block_sparse.block_q: {} must be in [1, {}]", bs.block_q,
                               kMaxIndex)};
    }
    if (bs.block_k < 1 || bs.block_k > kMaxIndex) {
      return Error{fmt::format("problem.block_sparse.block_k: {} must be in [1, {}]", bs.block_k,
                               kMaxIndex)};
    }
    const int64_t nq = (p.seqlen_q + bs.block_q - 1) / bs.block_q;
    const int64_t nk = (p.seqlen_k + bs.block_k - 1) / bs.block_k;
    for (size_t n = 0; n < bs.blocks.size(); ++n) {
      const auto [qb, kb] = bs.blocks[n];
      if (qb < 0 || qb >= nq) {
        return Error{
            fmt::format("problem.block_sparse.blocks[{}]: query block {} is outside "
                        "[0, {}) (seqlen_q = {}, block_q = {})",
                        n, qb, nq, p.seqlen_q, bs.block_q)};
      }
      if (kb < 0 || kb >= nk) {
        return Error{
            fmt::format("problem.block_sparse.blocks[{}]: key block {} is outside "
                        "[0, {}) (seqlen_k = {}, block_k = {})",
                        n, kb, nk, p.seqlen_k, bs.block_k)};
      }
    }
  }
  return {};
}

// 9. Tensor sizes must be countable.
Status CheckTensorCounts(const Problem& p) {
  struct Named {
    std::string_view name;
    Shape shape;
  };
  for (const Named& t : {Named{"q", p.QShape()}, Named{"k", p.KShape()}, Named{"v", p.VShape()},
                         Named{"o", p.OShape()}}) {
    int64_t n = 0;
    if (!CheckedCount(t.shape, &n)) {
      return Error{fmt::format("problem: tensor {} of shape {} has more than 2^62 elements", t.name,
                               ShapeString(t.shape))};
    }
  }
  return {};
}

}  // namespace

Status Validate(const Problem& p) {
  // The first failing check's error; each check may assume the ones before it passed.
  using Check = Status (*)(const Problem&);
  constexpr Check kChecks[] = {CheckSizes,  CheckDtype,     CheckScoreTransforms,
                               CheckWindow, CheckVarlen,    CheckDocuments,
                               CheckPrefixLm, CheckBlockSparse, CheckPaged,
                               CheckTensorCounts};
  for (Check check : kChecks) {
    if (Status s = check(p); !s) return s;
  }
  return {};
}

Status ValidateInputShapes(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor* dout) {
  struct Named {
    std::string_view name;
    const Tensor* tensor;
    Shape expected;
  };
  std::vector<Named> all = {{"q", &q, p.QShape()}, {"k", &k, p.KShape()}, {"v", &v, p.VShape()}};
  if (dout != nullptr) all.push_back({"do", dout, p.OShape()});
  for (const Named& t : all) {
    if (!t.tensor->defined()) {
      return Error{fmt::format("{}: missing (expected shape {})", t.name, ShapeString(t.expected))};
    }
    if (t.tensor->shape() != t.expected) {
      return Error{fmt::format("{}: shape {} does not match the problem's {}", t.name,
                               ShapeString(t.tensor->shape()), ShapeString(t.expected))};
    }
  }
  return {};
}

}  // namespace attest
