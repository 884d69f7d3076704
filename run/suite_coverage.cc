// Suite coverage of a kernel's claim and the rows that complete it (see suite_coverage.h).
#include "run/suite_coverage.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "reference/case/case_file.h"

namespace attest {
namespace {

bool Allows(const std::vector<int64_t>& list, int64_t x) {
  return list.empty() || std::find(list.begin(), list.end(), x) != list.end();
}

// The allowed value of `list` nearest to `want` (ties: the smaller), `want` when any is.
int64_t NearestAllowed(const std::vector<int64_t>& list, int64_t want) {
  if (list.empty()) return want;
  int64_t best = list.front();
  for (int64_t v : list) {
    const int64_t dv = std::llabs(v - want), db = std::llabs(best - want);
    if (dv < db || (dv == db && v < best)) best = v;
  }
  return best;
}

// Some claimed D and Dv differ (an empty list allows any value).
bool ClaimsDvNotD(const Capabilities& c) {
  if (c.same_head_dim_v) return false;  // kernels/kernel.h: Dv must equal D
  if (c.head_dims.empty() || c.head_dims_v.empty()) return true;
  for (int64_t d : c.head_dims) {
    for (int64_t dv : c.head_dims_v) {
      if (d != dv) return true;
    }
  }
  return false;
}

// In the order the generator switches features on (heads before ALiBi's per-head slopes,
// lengths and packing before block lists); the listing keeps this order.
constexpr FeatureSpec kFeatures[] = {
    {"gqa", [](const Capabilities& c) { return c.gqa; },
     [](const Problem& p) { return p.heads_q != p.heads_kv; }},
    {"dv", ClaimsDvNotD, [](const Problem& p) { return p.head_dim_v != p.head_dim; }},
    {"varlen", [](const Capabilities& c) { return c.varlen; },
     [](const Problem& p) { return p.varlen(); }},
    {"documents", [](const Capabilities& c) { return c.documents; },
     [](const Problem& p) { return p.document_ids_q.has_value(); }},
    {"causal", [](const Capabilities& c) { return c.causal; },
     [](const Problem& p) { return p.causal; }},
    // Prefix-LM is a causal variant (Validate: prefix_lm requires causal).
    {"prefix_lm", [](const Capabilities& c) { return c.prefix_lm && c.causal; },
     [](const Problem& p) { return p.prefix_lm > 0; }},
    {"window", [](const Capabilities& c) { return c.window; },
     [](const Problem& p) { return p.window_left >= 0 || p.window_right >= 0; }},
    {"block_sparse", [](const Capabilities& c) { return c.block_sparse; },
     [](const Problem& p) { return p.block_sparse.has_value(); }},
    {"softcap", [](const Capabilities& c) { return c.softcap; },
     [](const Problem& p) { return p.softcap > 0; }},
    {"alibi", [](const Capabilities& c) { return c.alibi; },
     [](const Problem& p) { return p.alibi_slopes.has_value(); }},
};

// Features whose rows also run non-interference: they hide keys from queries.
bool IsMask(std::string_view f) {
  return f == "causal" || f == "window" || f == "documents" || f == "prefix_lm" ||
         f == "block_sparse" || f == "varlen";
}

std::vector<int64_t> SequenceTargets() {
  std::vector<int64_t> t = {0, 1};
  for (int64_t tile : kCoverageTiles) t.insert(t.end(), {tile - 1, tile, tile + 1});
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

std::vector<int64_t> HeadDimTargets(const std::vector<int64_t>& claimed) {
  std::vector<int64_t> t;
  for (int64_t v : SequenceTargets()) {
    if (v > 0 && Allows(claimed, v)) t.push_back(v);
  }
  if (!claimed.empty()) t.push_back(*std::min_element(claimed.begin(), claimed.end()));
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

// ---- Problems the generated rows use (run/suite.cc builds its table the same way) ----

Problem Base(int64_t sq, int64_t sk, int64_t d, int64_t dv) {
  Problem p;
  p.batch = 1;
  p.heads_q = 2;
  p.heads_kv = 2;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = d;
  p.head_dim_v = dv;
  p.dtype = DType::kBF16;  // Instantiate takes the kernel's first dtype
  return p;
}

void Pack(Problem& p, const std::vector<int32_t>& q_lens, const std::vector<int32_t>& k_lens) {
  std::vector<int32_t> cq = {0}, ck = {0};
  for (int32_t l : q_lens) cq.push_back(cq.back() + l);
  for (int32_t l : k_lens) ck.push_back(ck.back() + l);
  p.batch = static_cast<int64_t>(q_lens.size());
  p.seqlen_q = *std::max_element(q_lens.begin(), q_lens.end());
  p.seqlen_k = *std::max_element(k_lens.begin(), k_lens.end());
  p.cu_seqlens_q = cq;
  p.cu_seqlens_k = ck;
}

// Per-token document ids: document n has q_lens[n] queries and k_lens[n] keys, in order.
void Documents(Problem& p, const std::vector<int32_t>& q_lens,
               const std::vector<int32_t>& k_lens) {
  std::vector<int32_t> q, k;
  for (size_t n = 0; n < q_lens.size(); ++n) q.insert(q.end(), q_lens[n], static_cast<int32_t>(n));
  for (size_t n = 0; n < k_lens.size(); ++n) k.insert(k.end(), k_lens[n], static_cast<int32_t>(n));
  p.seqlen_q = static_cast<int64_t>(q.size());
  p.seqlen_k = static_cast<int64_t>(k.size());
  p.document_ids_q = std::vector<std::vector<int32_t>>(static_cast<size_t>(p.batch), q);
  p.document_ids_k = std::vector<std::vector<int32_t>>(static_cast<size_t>(p.batch), k);
}

// A problem with exactly the features `on` (names of kFeatures), shaped by `index` so that
// consecutive rows alternate Sq < Sk, Sq > Sk (empty rows under causal) and Sq = Sk.
Problem WithFeatures(const std::set<std::string_view>& on, const Capabilities& caps,
                     size_t index) {
  static constexpr std::pair<int64_t, int64_t> kShapes[] = {{77, 93}, {93, 61}, {70, 70}};
  const auto [sq, sk] = kShapes[index % std::size(kShapes)];
  const int64_t d = NearestAllowed(caps.head_dims, 64);
  Problem p = Base(sq, sk, d, NearestAllowed(caps.head_dims_v, d));
  for (const FeatureSpec& f : kFeatures) {
    if (!on.count(f.name)) continue;
    const std::string_view n = f.name;
    if (n == "gqa") {
      p.heads_q = 4;
    } else if (n == "dv") {
      // A claimed Dv != D, as near D / 2 as the list allows.
      std::vector<int64_t> others;
      for (int64_t v : caps.head_dims_v.empty() ? std::vector<int64_t>{d / 2, 2 * d}
                                                : caps.head_dims_v) {
        if (v != d) others.push_back(v);
      }
      if (!others.empty()) p.head_dim_v = NearestAllowed(others, d / 2);
    } else if (n == "varlen") {
      Pack(p, {static_cast<int32_t>(sq - 24), 1, 23}, {static_cast<int32_t>(sk - 30), 13, 17});
    } else if (n == "documents") {
      const int32_t q3 = static_cast<int32_t>(sq / 3), k3 = static_cast<int32_t>(sk / 3);
      Documents(p, {q3, q3, static_cast<int32_t>(sq - 2 * q3)},
                {k3, k3, static_cast<int32_t>(sk - 2 * k3)});
    } else if (n == "causal") {
      p.causal = true;
    } else if (n == "prefix_lm") {
      p.causal = true;
      p.prefix_lm = 20;
    } else if (n == "window") {
      p.window_left = 24;
      p.window_right = 8;
    } else if (n == "block_sparse") {
      // 32 x 32 blocks, a checkerboard: every other block hidden.
      BlockSparse bs;
      bs.block_q = bs.block_k = 32;
      for (int64_t i = 0; i * 32 < p.seqlen_q; ++i) {
        for (int64_t j = 0; j * 32 < p.seqlen_k; ++j) {
          if ((i + j) % 2 == 0) bs.blocks.push_back({i, j});
        }
      }
      p.block_sparse = bs;
    } else if (n == "softcap") {
      p.softcap = 20;
    } else if (n == "alibi") {
      // Press et al. (arXiv 2108.12409): 2^(-8 (h + 1) / H).
      std::vector<double> slopes;
      for (int64_t h = 0; h < p.heads_q; ++h) {
        slopes.push_back(std::exp2(-8.0 * static_cast<double>(h + 1) /
                                   static_cast<double>(p.heads_q)));
      }
      p.alibi_slopes = slopes;
    }
  }
  return p;
}

CaseTemplate Template(std::string label, Problem p) {
  return CaseTemplate{std::move(label), std::move(p),
                      GeneratorSpec{"gaussian", 0, nlohmann::json::object()}, {}, true};
}

// What the rows, instantiated for caps, reach.
struct Reached {
  std::map<std::pair<std::string_view, std::string_view>, std::string> pairs;  // -> label
  std::map<LengthKind, std::set<int64_t>> lengths;
  size_t cases = 0;
};

Reached Measure(std::span<const SuiteRow> rows, const Capabilities& caps, uint64_t run_seed) {
  Reached r;
  std::set<std::string> seen;
  const std::vector<const FeatureSpec*> claimed = ClaimedFeatures(caps);
  for (const SuiteRow& row : rows) {
    if (!row.case_template.adapt) continue;  // honesty rows may lie outside the claim
    const InstantiatedCase inst = Instantiate(row, caps, run_seed);
    if (!inst.c) continue;
    const Problem& p = inst.c->problem;
    if (seen.insert(ProblemToJson(p).dump()).second) ++r.cases;
    for (size_t a = 0; a < claimed.size(); ++a) {
      if (!claimed[a]->present(p)) continue;
      for (size_t b = a + 1; b < claimed.size(); ++b) {
        if (!claimed[b]->present(p)) continue;
        r.pairs.emplace(std::pair{claimed[a]->name, claimed[b]->name}, inst.label);
      }
    }
    for (LengthKind k : kAllLengths) {
      for (int64_t v : LengthValues(k, p)) r.lengths[k].insert(v);
    }
  }
  return r;
}

std::vector<int64_t> Missing(const std::vector<int64_t>& targets, const std::set<int64_t>& got) {
  std::vector<int64_t> out;
  for (int64_t t : targets) {
    if (!got.count(t)) out.push_back(t);
  }
  return out;
}

}  // namespace

std::span<const FeatureSpec> AllFeatures() { return kFeatures; }

std::vector<const FeatureSpec*> ClaimedFeatures(const Capabilities& caps) {
  std::vector<const FeatureSpec*> out;
  for (const FeatureSpec& f : kFeatures) {
    if (f.claimed(caps)) out.push_back(&f);
  }
  return out;
}

std::string_view IncompatibleFeatures(std::string_view a, std::string_view b) {
  if ((a == "varlen" && b == "documents") || (a == "documents" && b == "varlen")) {
    return "per-token document ids cannot be combined with packed sequences "
           "(reference/problem/problem.cc Validate)";
  }
  return {};
}

std::string_view Name(LengthKind kind) {
  switch (kind) {
    case LengthKind::kSeqlenQ: return "Sq";
    case LengthKind::kSeqlenK: return "Sk";
    case LengthKind::kDocQ: return "document q length";
    case LengthKind::kDocK: return "document k length";
    case LengthKind::kHeadDim: return "D";
    case LengthKind::kHeadDimV: return "Dv";
  }
  return "?";
}

// The sequence targets a kernel with shape limits can take: each generic target moved as a
// suite row is (kernels/shape_limits.h FitShape, both sides at that length), so that the
// boundaries are those of the kernel's own block (63, 64, 65 of a block of 64 become 64 and
// 128) and lie under its maxima.
static std::vector<int64_t> LegalSequenceTargets(LengthKind kind, const Capabilities& caps) {
  const bool q_side = kind == LengthKind::kSeqlenQ || kind == LengthKind::kDocQ;
  std::set<int64_t> out;
  for (int64_t t : SequenceTargets()) {
    Problem p = Base(t, t, 64, 64);
    if (!FitShape(p, caps.shapes, kAnyShape).empty()) continue;
    out.insert(q_side ? p.seqlen_q : p.seqlen_k);
  }
  return {out.begin(), out.end()};
}

std::vector<int64_t> BoundaryTargets(LengthKind kind, const Capabilities& caps) {
  switch (kind) {
    case LengthKind::kSeqlenQ:
    case LengthKind::kSeqlenK: return LegalSequenceTargets(kind, caps);
    case LengthKind::kDocQ:
    case LengthKind::kDocK:
      return caps.varlen || caps.documents ? LegalSequenceTargets(kind, caps)
                                           : std::vector<int64_t>{};
    case LengthKind::kHeadDim: return HeadDimTargets(caps.head_dims);
    case LengthKind::kHeadDimV: return HeadDimTargets(caps.head_dims_v);
  }
  return {};
}

std::vector<int64_t> LengthValues(LengthKind kind, const Problem& p) {
  switch (kind) {
    case LengthKind::kSeqlenQ: return p.varlen() ? std::vector<int64_t>{} : std::vector{p.seqlen_q};
    case LengthKind::kSeqlenK: return p.varlen() ? std::vector<int64_t>{} : std::vector{p.seqlen_k};
    case LengthKind::kHeadDim: return {p.head_dim};
    case LengthKind::kHeadDimV: return {p.head_dim_v};
    case LengthKind::kDocQ:
    case LengthKind::kDocK: break;
  }
  const bool q_side = kind == LengthKind::kDocQ;
  std::vector<int64_t> out;
  if (p.varlen()) {
    for (int64_t b = 0; b < p.batch; ++b) {
      const Sequence s = SequenceOf(p, b);
      out.push_back(q_side ? s.q_len : s.k_len);
    }
  } else if (p.document_ids_q) {
    for (int64_t b = 0; b < p.batch; ++b) {
      std::map<int32_t, int64_t> count;  // every id of either side, counted on this side
      for (int32_t id : (*p.document_ids_q)[static_cast<size_t>(b)]) count.emplace(id, 0);
      for (int32_t id : (*p.document_ids_k)[static_cast<size_t>(b)]) count.emplace(id, 0);
      for (int32_t id : (q_side ? *p.document_ids_q : *p.document_ids_k)[static_cast<size_t>(b)]) {
        ++count[id];
      }
      for (const auto& [id, n] : count) out.push_back(n);
    }
  }
  return out;
}

bool SuiteCoverage::complete() const {
  for (const Pair& p : pairs) {
    if (p.reached_by.empty() && p.incompatible.empty()) return false;
  }
  for (const Boundary& b : boundaries) {
    if (!b.missing.empty()) return false;
  }
  return true;
}

SuiteCoverage CoverageOfRows(std::string suite_name, std::span<const SuiteRow> rows,
                             const Capabilities& caps, uint64_t run_seed) {
  SuiteCoverage c;
  c.suite = std::move(suite_name);
  c.rows = rows.size();
  const Reached r = Measure(rows, caps, run_seed);
  c.judged_cases = r.cases;
  const std::vector<const FeatureSpec*> claimed = ClaimedFeatures(caps);
  for (const FeatureSpec* f : claimed) c.claimed.emplace_back(f->name);
  for (size_t a = 0; a < claimed.size(); ++a) {
    for (size_t b = a + 1; b < claimed.size(); ++b) {
      SuiteCoverage::Pair pair;
      pair.a = claimed[a]->name;
      pair.b = claimed[b]->name;
      if (auto it = r.pairs.find({claimed[a]->name, claimed[b]->name}); it != r.pairs.end()) {
        pair.reached_by = it->second;
      }
      pair.incompatible = IncompatibleFeatures(pair.a, pair.b);
      c.pairs.push_back(std::move(pair));
    }
  }
  for (LengthKind k : kAllLengths) {
    std::vector<int64_t> targets = BoundaryTargets(k, caps);
    if (targets.empty()) continue;
    const auto it = r.lengths.find(k);
    std::vector<int64_t> missing = Missing(targets, it == r.lengths.end() ? std::set<int64_t>{}
                                                                         : it->second);
    c.boundaries.push_back({k, std::move(targets), std::move(missing)});
  }
  return c;
}

SuiteCoverage CoverageOf(const Suite& suite, const Capabilities& caps, uint64_t run_seed) {
  const std::vector<SuiteRow> rows = RowsFor(suite, caps, run_seed);
  SuiteCoverage c = CoverageOfRows(suite.name, rows, caps, run_seed);
  if (suite.cover_capabilities) c.generated_rows = CoverageRows(suite.rows, caps, 0).size();
  c.fuzz_rows = static_cast<size_t>(std::max<int64_t>(0, suite.fuzz_cases));
  return c;
}

nlohmann::json CoverageToJson(const SuiteCoverage& c) {
  nlohmann::json j;
  j["suite"] = c.suite;
  j["rows"] = c.rows;
  j["generated_rows"] = c.generated_rows;
  j["fuzz_rows"] = c.fuzz_rows;
  j["cases"] = c.judged_cases;
  j["claimed"] = c.claimed;
  j["complete"] = c.complete();
  j["pairs"] = nlohmann::json::array();
  for (const auto& p : c.pairs) {
    nlohmann::json x = {{"a", p.a}, {"b", p.b}, {"reached", !p.reached_by.empty()}};
    if (!p.reached_by.empty()) x["row"] = p.reached_by;
    if (!p.incompatible.empty()) x["incompatible"] = p.incompatible;
    j["pairs"].push_back(std::move(x));
  }
  j["boundaries"] = nlohmann::json::array();
  for (const auto& b : c.boundaries) {
    j["boundaries"].push_back(
        {{"length", std::string(Name(b.kind))}, {"targets", b.targets}, {"missing", b.missing}});
  }
  return j;
}

std::string CoverageToText(const SuiteCoverage& c) {
  std::ostringstream os;
  size_t combinable = 0, reached = 0;
  for (const auto& p : c.pairs) {
    if (!p.incompatible.empty()) continue;
    ++combinable;
    reached += !p.reached_by.empty();
  }
  os << fmt::format("{}: {} rows ({} generated from the capabilities, {} fuzz), {} cases\n",
                    c.suite, c.rows, c.generated_rows, c.fuzz_rows, c.judged_cases);
  os << fmt::format("claimed features ({}):", c.claimed.size());
  for (const std::string& f : c.claimed) os << " " << f;
  os << fmt::format("\nfeature pairs: {} of {} reached\n", reached, combinable);
  for (const auto& p : c.pairs) {
    const std::string pair = p.a + " x " + p.b;
    if (!p.reached_by.empty()) {
      os << fmt::format("  {:<26} {}\n", pair, p.reached_by);
    } else if (!p.incompatible.empty()) {
      os << fmt::format("  {:<26} not combinable: {}\n", pair, p.incompatible);
    } else {
      os << fmt::format("  {:<26} MISSING\n", pair);
    }
  }
  os << "boundaries (0 where legal, 1, tile - 1, tile, tile + 1; tiles";
  for (int64_t t : kCoverageTiles) os << " " << t;
  os << "):\n";
  for (const auto& b : c.boundaries) {
    os << fmt::format("  {:<18} {:<30} {}\n", Name(b.kind),
                      fmt::format("{}", fmt::join(b.targets, " ")),
                      b.missing.empty() ? std::string("all reached")
                                        : fmt::format("MISSING {}", fmt::join(b.missing, " ")));
  }
  os << (c.complete() ? "coverage complete\n" : "coverage INCOMPLETE\n");
  return os.str();
}

std::vector<SuiteRow> CoverageRows(std::span<const SuiteRow> table, const Capabilities& caps,
                                   uint64_t first_seed) {
  std::vector<SuiteRow> out;
  uint64_t seed = first_seed;
  const Reached have = Measure(table, caps, 0);
  auto add = [&](const std::vector<const char*>& checks, CaseTemplate t) {
    const uint64_t s = seed++;
    for (const char* c : checks) out.push_back({c, t, s});
  };

  // 1. Pairs: a greedy covering of the claimed pairs the table misses, at most three
  // features per row (each row's own features, measured on the problem it builds, are what
  // it covers: prefix-LM brings causal with it).
  const std::vector<const FeatureSpec*> claimed = ClaimedFeatures(caps);
  std::set<std::pair<std::string_view, std::string_view>> todo;
  for (size_t a = 0; a < claimed.size(); ++a) {
    for (size_t b = a + 1; b < claimed.size(); ++b) {
      const std::pair key{claimed[a]->name, claimed[b]->name};
      if (!have.pairs.count(key) && IncompatibleFeatures(key.first, key.second).empty()) {
        todo.insert(key);
      }
    }
  }
  auto compatible = [](const std::set<std::string_view>& row, std::string_view f) {
    for (std::string_view r : row) {
      if (r == f || !IncompatibleFeatures(r, f).empty()) return false;
    }
    return true;
  };
  auto key_of = [&](std::string_view x, std::string_view y) {
    for (const FeatureSpec* f : claimed) {
      if (f->name == x) return std::pair{x, y};
      if (f->name == y) return std::pair{y, x};
    }
    return std::pair{x, y};
  };
  size_t index = 0;
  while (!todo.empty()) {
    std::set<std::string_view> row = {todo.begin()->first, todo.begin()->second};
    while (row.size() < 3) {
      std::string_view best;
      int gain = 0;
      for (const FeatureSpec* f : claimed) {
        if (!compatible(row, f->name)) continue;
        int g = 0;
        for (std::string_view r : row) g += static_cast<int>(todo.count(key_of(r, f->name)));
        if (g > gain) {
          gain = g;
          best = f->name;
        }
      }
      if (gain == 0) break;
      row.insert(best);
    }
    const Problem p = WithFeatures(row, caps, index++);
    std::vector<std::string_view> present;
    for (const FeatureSpec* f : claimed) {
      if (f->present(p)) present.push_back(f->name);
    }
    size_t before = todo.size();
    for (size_t a = 0; a < present.size(); ++a) {
      for (size_t b = a + 1; b < present.size(); ++b) todo.erase({present[a], present[b]});
    }
    // A row that covers nothing would loop: drop the pair (the coverage listing reports it).
    if (todo.size() == before) todo.erase(todo.begin());
    std::string label = "pair";
    for (std::string_view f : present) label += fmt::format(" {}", f);
    std::vector<const char*> checks = {"accuracy", "unwritten-outputs", "special-values"};
    if (caps.backward) checks.push_back("consistency");
    if (std::any_of(present.begin(), present.end(), IsMask)) checks.push_back("non-interference");
    add(checks, Template(std::move(label), p));
  }

  // 2. Boundaries: each missing value once, paired with another missing value of the
  // partner length where there is one (Sq with Sk, a document's q with its k, D with Dv).
  auto missing = [&](LengthKind k) {
    const auto it = have.lengths.find(k);
    return Missing(BoundaryTargets(k, caps), it == have.lengths.end() ? std::set<int64_t>{}
                                                                      : it->second);
  };
  const std::vector<const char*> kBoundaryChecks = {"accuracy", "unwritten-outputs",
                                                    "special-values"};
  const int64_t d0 = NearestAllowed(caps.head_dims, 64);
  const int64_t dv0 = NearestAllowed(caps.head_dims_v, d0);
  {
    const std::vector<int64_t> mq = missing(LengthKind::kSeqlenQ);
    const std::vector<int64_t> mk = missing(LengthKind::kSeqlenK);
    for (size_t i = 0; i < std::max(mq.size(), mk.size()); ++i) {
      const int64_t sq = i < mq.size() ? mq[i] : 77, sk = i < mk.size() ? mk[i] : 77;
      add(kBoundaryChecks, Template(fmt::format("boundary Sq={} Sk={}", sq, sk),
                                    Base(sq, sk, d0, dv0)));
    }
  }
  {
    const std::vector<int64_t> mq = missing(LengthKind::kDocQ), mk = missing(LengthKind::kDocK);
    if (!mq.empty() || !mk.empty()) {
      std::vector<int32_t> ql, kl;
      for (size_t i = 0; i < std::max(mq.size(), mk.size()); ++i) {
        ql.push_back(static_cast<int32_t>(i < mq.size() ? mq[i] : 20));
        kl.push_back(static_cast<int32_t>(i < mk.size() ? mk[i] : 20));
      }
      Problem p = Base(1, 1, d0, dv0);
      if (caps.varlen) {
        Pack(p, ql, kl);
        add(kBoundaryChecks, Template("boundary packed sequence lengths", p));
      } else {
        Documents(p, ql, kl);
        add(kBoundaryChecks, Template("boundary document lengths", p));
      }
    }
  }
  {
    const std::vector<int64_t> md = missing(LengthKind::kHeadDim);
    std::vector<int64_t> mdv = missing(LengthKind::kHeadDimV);
    for (int64_t d : md) {
      const int64_t dv = NearestAllowed(caps.head_dims_v, d);
      mdv.erase(std::remove(mdv.begin(), mdv.end(), dv), mdv.end());
      add(kBoundaryChecks,
          Template(fmt::format("boundary D={} Dv={}", d, dv), Base(40, 56, d, dv)));
    }
    for (int64_t dv : mdv) {
      const int64_t d = NearestAllowed(caps.head_dims, dv);
      add(kBoundaryChecks,
          Template(fmt::format("boundary D={} Dv={}", d, dv), Base(40, 56, d, dv)));
    }
  }
  return out;
}

}  // namespace attest
