// The non-interference check (see noninterference.h; docs/design.md "Checks", docs/references.md
// "Low-precision attention recipes and their failure modes": a block scale shared across a
// causal diagonal or a document boundary lets hidden values move visible outputs).
#include "verify/checks/noninterference.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "reference/formats/format.h"
#include "reference/problem/mask.h"
#include "reference/problem/paged.h"
#include "verify/checks/check.h"
#include "verify/metrics/metrics.h"

namespace attest {
namespace {

constexpr std::string_view kCheck = "non-interference";

// The values a perturbation writes. kLarge on keys (k, v) is min(dtype max, 2^60): beyond
// 2^60 an fp32 product q·k or dO·v of D terms overflows, and IEEE 0·inf = NaN in a masked
// element that a tiled kernel computes and multiplies by P = 0 is input overflow, not
// leakage. kLarge on queries (q, dO) is 2^16: a perturbed query's own row must stay finite,
// because FlashAttention's backward forms dS = P∘(dP − D) for masked entries too (P = 0), so
// a NaN D of a perturbed row reaches every key of its tile; with q = ±2^30 and N(0,1) keys
// (scores ~2^30) cpu/flash2-bf16's own forward already returns non-finite o/lse (measured).
// Both still move every block scale (MX, NVFP4, per-tensor FP8) by many binades. 448 is the
// e4m3 maximum: the amax that saturates an e4m3-backed block exactly.
enum class PerturbKind { kLarge, kE4M3Max, kNegate, kTiny };
constexpr PerturbKind kKinds[] = {PerturbKind::kLarge, PerturbKind::kE4M3Max,
                                  PerturbKind::kNegate, PerturbKind::kTiny};

std::string_view Name(PerturbKind k) {
  switch (k) {
    case PerturbKind::kLarge: return "large (2^60 on k/v, 2^16 on q/dO)";
    case PerturbKind::kE4M3Max: return "448 (e4m3 max)";
    case PerturbKind::kNegate: return "sign flip";
    case PerturbKind::kTiny: return "tiny (smallest positive)";
  }
  return "?";
}

double Perturb(PerturbKind kind, double x, Format f, bool query_side) {
  const double sign = std::signbit(x) ? -1.0 : 1.0;
  switch (kind) {
    case PerturbKind::kLarge: return sign * std::min(MaxFinite(f), query_side ? 0x1p16 : 0x1p60);
    case PerturbKind::kE4M3Max: return sign * std::min(MaxFinite(f), 448.0);
    case PerturbKind::kNegate: return -x;
    case PerturbKind::kTiny: return sign * MinPositive(f);
  }
  return x;
}

// Kernel outputs widened to f64 (contiguous).
struct Outputs {
  Tensor o, lse, dq, dk, dv;
};

struct RunOutcome {
  std::optional<Outputs> out;
  bool unsupported = false;
  std::string error;  // kernel error (a finding)
};

// `sink`, `rel_bias`: the case's learnable sink and relative bias (Problem::sink, rel_bias),
// handed to their entry points; neither changes a row's visibility (the bias is added to
// visible scores only), so every protected output stays protected.
RunOutcome Run(Kernel& kernel, const Problem& p, const Tensor& q, const Tensor& k,
               const Tensor& v, const Tensor& dout, bool backward, const Tensor& sink,
               const Tensor& rel_bias) {
  RunOutcome r;
  auto fwd = p.rel_bias ? kernel.ForwardRelBias(p, q, k, v, rel_bias, sink)
             : p.sink   ? kernel.ForwardSink(p, q, k, v, sink)
                        : kernel.Forward(p, q, k, v);
  if (auto* u = std::get_if<Unsupported>(&fwd)) {
    r.unsupported = true;
    r.error = u->reason;
    return r;
  }
  if (auto* e = std::get_if<Error>(&fwd)) {
    r.error = "forward: " + e->message;
    return r;
  }
  const ForwardResult& f = std::get<ForwardResult>(fwd);
  Outputs out;
  out.o = ToF64(f.o);
  // Left undefined for a kernel that returns no lse (Capabilities::lse): nothing judges it.
  if (f.lse.defined()) out.lse = ToF64(f.lse);
  if (backward) {
    auto bwd = p.rel_bias ? kernel.BackwardRelBias(p, q, k, v, f.o, f.lse, dout, rel_bias, sink)
               : p.sink   ? kernel.BackwardSink(p, q, k, v, f.o, f.lse, dout, sink)
                          : kernel.Backward(p, q, k, v, f.o, f.lse, dout);
    if (auto* u = std::get_if<Unsupported>(&bwd)) {
      r.unsupported = true;
      r.error = u->reason;
      return r;
    }
    if (auto* e = std::get_if<Error>(&bwd)) {
      r.error = "backward: " + e->message;
      return r;
    }
    const BackwardResult& b = std::get<BackwardResult>(bwd);
    out.dq = ToF64(b.dq);
    out.dk = ToF64(b.dk);
    out.dv = ToF64(b.dv);
  }
  r.out = std::move(out);
  return r;
}

const Tensor& Pick(const Outputs& o, std::string_view name) {
  if (name == "o") return o.o;
  if (name == "lse") return o.lse;
  if (name == "dq") return o.dq;
  if (name == "dk") return o.dk;
  return o.dv;
}

// Flat element indices of token rows (all heads, all of the last dim) of a token-major
// tensor [tokens, H, D] (padded [B, S, H, D] is the same memory).
void AddTokenRows(const Tensor& t, int64_t token, std::vector<int64_t>& idx) {
  const int64_t per_token = t.numel() / (t.dim(0) * (t.rank() == 4 ? t.dim(1) : 1));
  for (int64_t e = 0; e < per_token; ++e) idx.push_back(token * per_token + e);
}

// Flat indices of lse entries of query token `local_i` of sequence b, every head.
void AddLseRows(const Problem& p, const Sequence& s, int64_t local_i, std::vector<int64_t>& idx) {
  for (int64_t h = 0; h < p.heads_q; ++h) {
    if (p.varlen()) {
      idx.push_back(h * p.TotalQ() + s.q_begin + local_i);
    } else {
      const int64_t b = s.q_begin / p.seqlen_q;
      idx.push_back((b * p.heads_q + h) * p.seqlen_q + local_i);
    }
  }
}

// Which elements of which output must not change.
struct Protected {
  std::vector<int64_t> o, lse, dq;  // query-indexed
  std::vector<int64_t> dk, dv;      // key-indexed
};

struct Worst {
  double margin = 0;
  double observed = 0;
  double allowed = 0;
  Location where;
  std::string what;
  int64_t changed = 0;  // elements that moved beyond their allowance, over all perturbations
  int64_t judged = 0;
};

std::vector<int64_t> Unflatten(const Shape& shape, int64_t flat) {
  std::vector<int64_t> index(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    index[static_cast<size_t>(d)] = flat % shape[static_cast<size_t>(d)];
    flat /= shape[static_cast<size_t>(d)];
  }
  return index;
}

// Size of a change between two values: 0 when the bits are equal or both are NaN (a NaN
// that is there either way is special-values' finding, not a leak; payloads may differ with
// the operations that made them), |a - b| when finite, inf otherwise (a NaN appearing, an
// infinity flipping).
double Change(double a, double b) {
  if (std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b)) return 0;
  if (std::isnan(a) && std::isnan(b)) return 0;
  const double d = std::fabs(a - b);
  return std::isfinite(d) ? d : std::numeric_limits<double>::infinity();
}

// For a nondeterministic kernel each protected element may move by the larger of its own
// run-to-run change and kNondeterministicUlps units in the last place of the output format
// (`noise_format`). Two runs give one sample of an element's spread: an element whose
// unordered fp32 accumulation (atomics) happened to round the same way twice has a measured
// spread of 0 and flips by one ulp in the next run. Measured on FlashAttention-4's default
// backward on an H200 (docs/gpu-results.md): the protected dk/dv elements that moved did so
// by exactly one bf16 or f16 ulp. A leak under the check's perturbations (2^60, 448, the
// format's largest values) moves far more; a leak below 2 ulps cannot be told from a
// nondeterministic kernel's own noise, and the deterministic path (bitwise) still sees it.
constexpr double kNondeterministicUlps = 2.0;

void Judge(const Problem& p, std::string_view name, const Tensor& base, const Tensor* spread,
           const Tensor& pert, const std::vector<int64_t>& idx, const std::string& what,
           Worst& w) {
  if (!base.defined() || !pert.defined()) return;
  const auto a = base.span<const double>();
  const auto b = pert.span<const double>();
  const double* s = spread ? spread->span<const double>().data() : nullptr;
  const Layout layout = LayoutOf(p, name);
  // lse is fp32 in every kernel attest reads; o and the gradients are in the input's format.
  const std::optional<Format> noise_format =
      name == "lse" ? FormatOf(DType::kF32) : FormatOf(p.dtype);
  for (int64_t e : idx) {
    const size_t u = static_cast<size_t>(e);
    const double change = Change(a[u], b[u]);
    double allowed = s ? s[u] : 0.0;
    if (s && noise_format && std::isfinite(a[u])) {
      allowed = std::max(allowed, kNondeterministicUlps * Quantum(a[u], *noise_format));
    }
    const double m = Margin(change, allowed);
    ++w.judged;
    if (m > 1) ++w.changed;
    if (m > w.margin) {
      w.margin = m;
      w.observed = change;
      w.allowed = allowed;
      const std::vector<int64_t> index = Unflatten(base.shape(), e);
      w.where = Locate(layout, index);
      w.where.observed = b[u];
      w.where.reference = a[u];
      w.what = what;
    }
  }
}

std::string Describe(const std::vector<int64_t>& v, size_t max_items = 6) {
  std::ostringstream os;
  os << "{";
  for (size_t i = 0; i < v.size() && i < max_items; ++i) os << (i ? "," : "") << v[i];
  if (v.size() > max_items) os << ",... (" << v.size() << ")";
  os << "}";
  return os.str();
}

// A perturbation set: which tokens of which inputs change, and what must not move.
struct PerturbSet {
  std::string description;
  std::vector<int64_t> key_tokens;    // k and/or v rows perturbed
  std::vector<int64_t> query_tokens;  // q and dO rows perturbed
  bool touch_k = false, touch_v = false;
  Protected keep;
};

std::vector<int64_t> Pivots(const std::vector<int64_t>& given, int64_t len, std::mt19937_64& rng) {
  std::vector<int64_t> out;
  if (!given.empty()) {
    for (int64_t x : given) {
      if (x >= 0 && x < len) out.push_back(x);
    }
    return out;
  }
  if (len <= 0) return out;
  out.push_back(len / 2);
  const int64_t r = static_cast<int64_t>(rng() % static_cast<uint64_t>(len));
  if (r != len / 2) out.push_back(r);
  return out;
}

// The case's sequences as the perturbation sets see them: their masks and, for a sampled
// case (protected rows and keys are the flagged ones; one sequence pivots), the flags.
struct SetPlanner {
  const Problem& p;
  const CaseInputs& in;
  const NonInterferenceOptions& options;
  std::vector<MaskView> views;
  bool sampled = false;

  SetPlanner(const Problem& problem, const CaseInputs& inputs,
             const NonInterferenceOptions& opts)
      : p(problem), in(inputs), options(opts) {
    const int64_t nseq = p.batch;
    views.reserve(static_cast<size_t>(nseq));
    for (int64_t b = 0; b < nseq; ++b) views.emplace_back(p, b);
    sampled = options.query_rows != nullptr && options.key_rows != nullptr;
  }
  bool QKept(int64_t token) const {
    return !sampled || (*options.query_rows)[static_cast<size_t>(token)] != 0;
  }
  bool KKept(int64_t token) const {
    return !sampled || (*options.key_rows)[static_cast<size_t>(token)] != 0;
  }
  // Rows / keys of every sequence but `b` (cross-sequence protection comes free with every set:
  // a padded batch entry or a packed neighbour must not move either).
  void AddOtherSequences(int64_t b, Protected& keep) const {
    const int64_t nseq = p.batch;
    for (int64_t c = 0; c < nseq; ++c) {
      if (c == b) continue;
      const Sequence& s = views[static_cast<size_t>(c)].sequence();
      for (int64_t i = 0; i < s.q_len; ++i) {
        if (!QKept(s.q_begin + i)) continue;
        AddTokenRows(in.q, s.q_begin + i, keep.dq);
        AddLseRows(p, s, i, keep.lse);
      }
      for (int64_t j = 0; j < s.k_len; ++j) {
        if (!KKept(s.k_begin + j)) continue;
        AddTokenRows(in.k, s.k_begin + j, keep.dk);
        AddTokenRows(in.v, s.k_begin + j, keep.dv);
      }
    }
  }
  // o rows use the output's row length (Dv), dq rows q's (D): build o from dq's token list.
  void AddOutputRows(Protected& keep, const std::vector<int64_t>& q_tokens) const {
    for (int64_t t : q_tokens) {
      if (!QKept(t)) continue;
      const int64_t dv = p.head_dim_v * p.heads_q;
      for (int64_t e = 0; e < dv; ++e) keep.o.push_back(t * dv + e);
    }
  }
};

// Sampled: the longest sequence (the first of equals); -1 otherwise.
int64_t PivotSequence(const SetPlanner& sp) {
  const int64_t nseq = sp.p.batch;
  int64_t pivot_sequence = -1;
  if (sp.sampled) {
    for (int64_t b = 0; b < nseq; ++b) {
      const Sequence& s = sp.views[static_cast<size_t>(b)].sequence();
      if (pivot_sequence < 0 ||
          s.q_len > sp.views[static_cast<size_t>(pivot_sequence)].sequence().q_len) {
        pivot_sequence = b;
      }
    }
  }
  return pivot_sequence;
}

// The pivot queries of sequence s (the options' or drawn from `rng`).
std::vector<int64_t> PivotRows(const SetPlanner& sp, const Sequence& s, std::mt19937_64& rng) {
  std::vector<int64_t> pivots;
  if (sp.sampled && sp.options.pivot_rows.empty()) {
    // A tile's first row near the middle (its neighbour keys share the tile and a 32-block),
    // and a flagged row drawn from the seed.
    pivots.push_back(s.q_len / 2 / 64 * 64);
    std::vector<int64_t> flagged;
    for (int64_t i = 0; i < s.q_len; ++i) {
      if (sp.QKept(s.q_begin + i)) flagged.push_back(i);
    }
    const int64_t r = flagged[static_cast<size_t>(rng() % flagged.size())];
    if (r != pivots[0]) pivots.push_back(r);
  } else {
    pivots = Pivots(sp.options.pivot_rows, s.q_len, rng);
  }
  return pivots;
}

// Forward direction: keys of sequence b hidden from pivot query i0, perturbed in k and v;
// nullopt when none is.
std::optional<PerturbSet> HiddenKeysSet(const SetPlanner& sp, int64_t b, int64_t i0) {
  const NonInterferenceOptions& options = sp.options;
  const int64_t nseq = sp.p.batch;
  const MaskView& m = sp.views[static_cast<size_t>(b)];
  const Sequence& s = m.sequence();
  std::vector<int64_t> hidden;
  for (int64_t j = 0; j < s.k_len; ++j) {
    if (m.Visible(i0, j)) continue;
    if (options.same_block > 0 &&
        j / options.same_block != (i0 + m.offset()) / options.same_block) {
      continue;
    }
    hidden.push_back(j);
  }
  if (hidden.empty()) return std::nullopt;
  PerturbSet set;
  set.touch_k = options.perturb_k;
  set.touch_v = options.perturb_v;
  std::vector<int64_t> kept_rows, q_tokens;
  for (int64_t i = 0; i < s.q_len; ++i) {
    if (!sp.QKept(s.q_begin + i)) continue;
    bool sees = false;
    if (m.interval_only()) {
      // hidden is ascending: does it hold a key of the row's interval? O(log S).
      const auto [lo, hi] = m.KeyBounds(i);
      const auto it = std::lower_bound(hidden.begin(), hidden.end(), lo);
      sees = lo < hi && it != hidden.end() && *it < hi;
    } else {
      for (int64_t j : hidden) sees = sees || m.Visible(i, j);
    }
    if (sees) continue;
    kept_rows.push_back(i);
    q_tokens.push_back(s.q_begin + i);
    AddTokenRows(sp.in.q, s.q_begin + i, set.keep.dq);
    AddLseRows(sp.p, s, i, set.keep.lse);
  }
  for (int64_t j : hidden) set.key_tokens.push_back(s.k_begin + j);
  for (int64_t c = 0; c < nseq; ++c) {
    if (c == b) continue;
    const Sequence& o = sp.views[static_cast<size_t>(c)].sequence();
    for (int64_t i = 0; i < o.q_len; ++i) q_tokens.push_back(o.q_begin + i);
  }
  sp.AddOtherSequences(b, set.keep);
  set.keep.dk.clear();  // keys' gradients legitimately change with their own values
  set.keep.dv.clear();
  sp.AddOutputRows(set.keep, q_tokens);
  set.description = "b=" + std::to_string(b) + ": " +
                    std::string(set.touch_k ? "k" : "") +
                    (set.touch_k && set.touch_v ? "," : "") +
                    std::string(set.touch_v ? "v" : "") + " at keys " + Describe(hidden) +
                    " hidden from query " + std::to_string(i0) + "; protected rows " +
                    Describe(kept_rows) +
                    (sp.sampled ? " and every other sequence's sampled rows"
                                : " and every other sequence");
  return set;
}

// Backward direction: queries of sequence b that cannot see a pivot key (drawn from `rng`),
// perturbed in q and dO.
void AddBlindQuerySets(const SetPlanner& sp, int64_t b, std::mt19937_64& rng,
                       std::vector<PerturbSet>& sets) {
  const MaskView& m = sp.views[static_cast<size_t>(b)];
  const Sequence& s = m.sequence();
  for (int64_t j0 : Pivots(sp.options.pivot_keys, s.k_len, rng)) {
    std::vector<int64_t> blind;
    for (int64_t i = 0; i < s.q_len; ++i) {
      if (!m.Visible(i, j0)) blind.push_back(i);
    }
    if (blind.empty()) continue;
    PerturbSet set;
    std::vector<int64_t> kept_keys;
    for (int64_t j = 0; j < s.k_len; ++j) {
      if (!sp.KKept(s.k_begin + j)) continue;
      bool seen = false;
      for (int64_t i : blind) seen = seen || m.Visible(i, j);
      if (seen) continue;
      kept_keys.push_back(j);
      AddTokenRows(sp.in.k, s.k_begin + j, set.keep.dk);
      AddTokenRows(sp.in.v, s.k_begin + j, set.keep.dv);
    }
    for (int64_t i : blind) set.query_tokens.push_back(s.q_begin + i);
    sp.AddOtherSequences(b, set.keep);
    // Only key gradients are judged here (perturbed queries' own outputs move, and the
    // forward direction already covers rows of other sequences).
    set.keep.dq.clear();
    set.keep.lse.clear();
    set.description = "b=" + std::to_string(b) + ": q,do at queries " + Describe(blind) +
                      " that cannot see key " + std::to_string(j0) + "; protected keys " +
                      Describe(kept_keys) + " and every other sequence";
    sets.push_back(std::move(set));
  }
}

// Whole sequences: every token of sequence 0 perturbed (k, v; and q, dO for the backward
// direction); every other sequence (a padded batch entry or a packed neighbour) protected.
void AddWholeSequenceSets(const SetPlanner& sp, bool backward, std::vector<PerturbSet>& sets) {
  const NonInterferenceOptions& options = sp.options;
  const int64_t nseq = sp.p.batch;
  if (nseq > 1 && sp.views[0].sequence().k_len > 0) {
    const Sequence& s0 = sp.views[0].sequence();
    PerturbSet fwd;
    fwd.touch_k = options.perturb_k;
    fwd.touch_v = options.perturb_v;
    for (int64_t j = 0; j < s0.k_len; ++j) fwd.key_tokens.push_back(s0.k_begin + j);
    sp.AddOtherSequences(0, fwd.keep);
    fwd.keep.dk.clear();
    fwd.keep.dv.clear();
    std::vector<int64_t> q_tokens;
    for (int64_t c = 1; c < nseq; ++c) {
      const Sequence& o = sp.views[static_cast<size_t>(c)].sequence();
      for (int64_t i = 0; i < o.q_len; ++i) q_tokens.push_back(o.q_begin + i);
    }
    sp.AddOutputRows(fwd.keep, q_tokens);
    fwd.description = "every key of sequence 0; protected: every other sequence";
    sets.push_back(std::move(fwd));
    if (backward && s0.q_len > 0) {
      PerturbSet bwd;
      for (int64_t i = 0; i < s0.q_len; ++i) bwd.query_tokens.push_back(s0.q_begin + i);
      sp.AddOtherSequences(0, bwd.keep);
      bwd.keep.dq.clear();
      bwd.keep.lse.clear();
      bwd.description = "q,do of every query of sequence 0; protected: other sequences' dk, dv";
      sets.push_back(std::move(bwd));
    }
  }
}

// The perturbation sets, per sequence, from the mask (pivots drawn from `rng`), then the
// whole-sequence ones.
std::vector<PerturbSet> PerturbSets(const SetPlanner& sp, bool backward, std::mt19937_64& rng) {
  std::vector<PerturbSet> sets;
  const int64_t nseq = sp.p.batch;
  const int64_t pivot_sequence = PivotSequence(sp);
  for (int64_t b = 0; b < nseq; ++b) {
    const Sequence& s = sp.views[static_cast<size_t>(b)].sequence();
    if (s.q_len == 0 || s.k_len == 0) continue;
    if (sp.sampled && b != pivot_sequence) continue;
    const std::vector<int64_t> pivots = PivotRows(sp, s, rng);
    for (int64_t i0 : pivots) {
      if (std::optional<PerturbSet> set = HiddenKeysSet(sp, b, i0)) sets.push_back(std::move(*set));
    }
    if (!backward) continue;
    AddBlindQuerySets(sp, b, rng, sets);
  }
  AddWholeSequenceSets(sp, backward, sets);
  return sets;
}

// ---- Paged KV and seqused (docs/semantics.md "Paged KV and seqused"). ----

// A set planned on the logical problem, moved to p's layout: tokens and protected elements
// of row-major [rows, ...] outputs through the row maps, lse through LseFlatIndex.
PerturbSet ToPhysical(const Problem& p, const Problem& l, const LogicalRows& rows,
                      PerturbSet set) {
  auto rows_of = [](std::vector<int64_t>& idx, const std::vector<int64_t>& map, int64_t width) {
    for (int64_t& e : idx) e = map[static_cast<size_t>(e / width)] * width + e % width;
  };
  for (int64_t& t : set.key_tokens) t = rows.k[static_cast<size_t>(t)];
  for (int64_t& t : set.query_tokens) t = rows.q[static_cast<size_t>(t)];
  rows_of(set.keep.o, rows.q, p.heads_q * p.head_dim_v);
  rows_of(set.keep.dq, rows.q, p.heads_q * p.head_dim);
  rows_of(set.keep.dk, rows.k, p.heads_kv * p.head_dim);
  rows_of(set.keep.dv, rows.k, p.heads_kv * p.head_dim_v);
  const int64_t n = l.TotalQ();
  for (int64_t& e : set.keep.lse) e = LseFlatIndex(p, rows.q[static_cast<size_t>(e % n)], e / n);
  return set;
}

// Rows in [0, count) that `used` does not hold.
std::vector<int64_t> Unread(int64_t count, const std::vector<int64_t>& used) {
  std::vector<uint8_t> read(static_cast<size_t>(count), 0);
  for (int64_t r : used) read[static_cast<size_t>(r)] = 1;
  std::vector<int64_t> out;
  for (int64_t r = 0; r < count; ++r) {
    if (read[static_cast<size_t>(r)] == 0) out.push_back(r);
  }
  return out;
}

// Every element of every output.
Protected Everything(const Problem& p) {
  Protected keep;
  auto all = [](std::vector<int64_t>& idx, const Shape& shape) {
    idx.resize(static_cast<size_t>(Tensor::NumElements(shape)));
    for (size_t e = 0; e < idx.size(); ++e) idx[e] = static_cast<int64_t>(e);
  };
  all(keep.o, p.OShape());
  all(keep.lse, p.LseShape());
  all(keep.dq, p.QShape());
  all(keep.dk, p.KShape());
  all(keep.dv, p.VShape());
  return keep;
}

// The sets of the logical problem (masks, other sequences) moved to the pool, then the memory
// nothing reads: pool rows (pages no sequence reads, slots past a sequence's used keys) in k
// and v, and queries past seqused_q in q and dO, each protecting every output element.
std::vector<PerturbSet> LogicalPerturbSets(const Problem& p, const CaseInputs& in,
                                           const NonInterferenceOptions& options, bool backward,
                                           std::mt19937_64& rng) {
  const Problem l = LogicalProblem(p);
  const LogicalRows rows = LogicalRowsOf(p);
  CaseInputs logical;
  logical.q = GatherRows(in.q, rows.q);
  logical.k = GatherRows(in.k, rows.k);
  logical.v = GatherRows(in.v, rows.k);
  NonInterferenceOptions plain = options;
  plain.query_rows = plain.key_rows = nullptr;
  const SetPlanner planner(l, logical, plain);
  std::vector<PerturbSet> sets;
  for (PerturbSet& set : PerturbSets(planner, backward, rng)) {
    set.description += " (logical rows, through the page table)";
    sets.push_back(ToPhysical(p, l, rows, std::move(set)));
  }
  const int64_t key_rows = in.k.numel() / (p.heads_kv * p.head_dim);
  PerturbSet keys;
  keys.key_tokens = Unread(key_rows, rows.k);
  keys.touch_k = options.perturb_k;
  keys.touch_v = options.perturb_v;
  keys.keep = Everything(p);
  keys.description = fmt::format("k,v rows no sequence reads {} ({}); protected: everything",
                                 Describe(keys.key_tokens),
                                 p.paged() ? "unreferenced pages, slots past seqused_k"
                                           : "past seqused_k");
  if (!keys.key_tokens.empty()) sets.push_back(std::move(keys));
  PerturbSet queries;
  queries.query_tokens = Unread(in.q.numel() / (p.heads_q * p.head_dim), rows.q);
  queries.keep = Everything(p);
  queries.description = "q,do rows past seqused_q " + Describe(queries.query_tokens) +
                        "; protected: everything";
  if (!queries.query_tokens.empty()) sets.push_back(std::move(queries));
  return sets;
}

// Per output, each element's change between two unperturbed runs (Change): the spread a
// nondeterministic kernel is allowed.
Outputs RunToRunSpread(const Outputs& base, const Outputs& again) {
  Outputs sp;
  for (std::string_view n : {"o", "lse", "dq", "dk", "dv"}) {
    const Tensor& a = Pick(base, n);
    if (!a.defined()) continue;
    const Tensor& c = Pick(again, n);
    std::vector<double> d(static_cast<size_t>(a.numel()));
    const auto x = a.span<const double>();
    const auto y = c.span<const double>();
    for (size_t e = 0; e < d.size(); ++e) d[e] = Change(x[e], y[e]);
    Tensor t = Tensor::FromF64(a.shape(), std::move(d));
    if (n == "o") sp.o = t;
    if (n == "lse") sp.lse = t;
    if (n == "dq") sp.dq = t;
    if (n == "dk") sp.dk = t;
    if (n == "dv") sp.dv = t;
  }
  return sp;
}

// The kernel on the case's inputs with `set`'s tokens overwritten by `kind` (values of format f).
RunOutcome RunPerturbed(Kernel& kernel, const Problem& p, const CaseInputs& in,
                        const PerturbSet& set, PerturbKind kind, Format f, bool backward) {
  Tensor q = in.q, k = in.k, v = in.v, dout = in.dout;
  auto perturb_rows = [&](Tensor& t, const std::vector<int64_t>& tokens, bool query_side) {
    t = t.Clone();
    std::vector<int64_t> idx;
    for (int64_t tok : tokens) AddTokenRows(t, tok, idx);
    auto span = t.span<double>();
    for (int64_t e : idx) {
      span[static_cast<size_t>(e)] = Perturb(kind, span[static_cast<size_t>(e)], f, query_side);
    }
  };
  if (!set.key_tokens.empty()) {
    if (set.touch_k) perturb_rows(k, set.key_tokens, false);
    if (set.touch_v) perturb_rows(v, set.key_tokens, false);
  }
  if (!set.query_tokens.empty()) {
    perturb_rows(q, set.query_tokens, true);
    if (backward) perturb_rows(dout, set.query_tokens, true);
  }
  return Run(kernel, p, q, k, v, dout, backward, in.sink, in.rel_bias);
}

// The protected elements of output `n`.
const std::vector<int64_t>& ProtectedOf(const Protected& keep, std::string_view n) {
  return n == "o"    ? keep.o
         : n == "lse" ? keep.lse
         : n == "dq"  ? keep.dq
         : n == "dk"  ? keep.dk
                      : keep.dv;
}

// The verdict on output `name` from its worst change over `perturbations` perturbed runs.
Verdict NonInterferenceVerdict(std::string_view name, const Worst& w, bool deterministic,
                               size_t perturbations, bool shared_scales,
                               const NonInterferenceOptions& options, bool sampled) {
  Verdict v;
  v.check = std::string(kCheck);
  v.tensor = std::string(name);
  v.policy = deterministic ? "bitwise unchanged"
                           : "change <= max(run-to-run spread, 2 ulp)";
  v.observed = w.observed;
  v.allowed = w.allowed;
  v.margin = w.margin;
  v.pass = w.margin <= 1;
  v.worst = w.where;
  std::ostringstream msg;
  if (v.pass) {
    msg << "protected " << name << " unchanged over " << perturbations
        << " perturbations (" << w.judged << " element checks)";
    if (sampled) msg << " on sampled rows";
  } else {
    msg << (shared_scales ? "leak through shared scales" : "mask leak") << ": " << w.changed
        << " protected " << name << " elements moved; worst " << w.where.ToString()
        << " (change " << w.observed << ", allowed " << w.allowed << ") under " << w.what;
    v.repro = options.repro;
  }
  v.message = msg.str();
  if (sampled) {
    const auto flagged = [](const std::vector<uint8_t>& f) {
      return std::count(f.begin(), f.end(), uint8_t{1});
    };
    v.message += fmt::format(" [sampled: {} of {} query rows, {} of {} keys]",
                             flagged(*options.query_rows), options.query_rows->size(),
                             flagged(*options.key_rows), options.key_rows->size());
  }
  return v;
}

}  // namespace

bool HasSequenceBlockOperands(const Recipe& r) {
  for (const GemmQuant* g : {&r.qk, &r.pv, &r.dov, &r.pdo, &r.dsk, &r.dsq}) {
    for (const OperandQuant* o : {&g->a, &g->b}) {
      if (o->scheme.kind == OperandKind::kBlock && o->axis == QuantAxis::kSequence) return true;
    }
  }
  return false;
}

std::vector<Verdict> CheckNonInterference(Kernel& kernel, const Problem& p, const CaseInputs& in,
                                          const NonInterferenceOptions& options,
                                          const Recipe* recipe) {
  const Capabilities caps = kernel.capabilities();
  if (!caps.Covers(p)) return {};
  const std::optional<Format> fmt = FormatOf(p.dtype);
  if (!fmt) return {};
  if (recipe == nullptr && !caps.recipe.empty()) recipe = FindRecipe(caps.recipe);
  const bool shared_scales = recipe != nullptr && HasSequenceBlockOperands(*recipe);
  const bool backward = options.backward && caps.backward && in.dout.defined();
  std::mt19937_64 rng(options.seed ^ 0x6e6f6e2d696e7466ULL);

  // ---- Perturbation sets, per sequence, from the mask (paged / seqused: on the logical
  // problem, plus the memory nothing reads). ----
  const bool logical = HasLogicalView(p);
  NonInterferenceOptions planned = options;
  if (logical) planned.query_rows = planned.key_rows = nullptr;
  const Problem planned_problem = logical ? LogicalProblem(p) : p;
  const SetPlanner planner(planned_problem, in, planned);
  const std::vector<PerturbSet> sets = logical ? LogicalPerturbSets(p, in, options, backward, rng)
                                               : PerturbSets(planner, backward, rng);
  if (sets.empty()) return {};

  // ---- Unperturbed runs (twice for nondeterministic kernels: the allowed spread). ----
  RunOutcome base = Run(kernel, p, in.q, in.k, in.v, in.dout, backward, in.sink, in.rel_bias);
  auto kernel_failure = [&](const std::string& what, const std::string& error) {
    Verdict v = KernelError(kernel, std::string(kCheck) + ", " + what, error);
    v.repro = options.repro;
    return std::vector<Verdict>{v};
  };
  if (base.unsupported) return {};
  if (!base.out) return kernel_failure("the unperturbed inputs", base.error);
  std::optional<Outputs> spread;
  if (!caps.deterministic) {
    RunOutcome again = Run(kernel, p, in.q, in.k, in.v, in.dout, backward, in.sink, in.rel_bias);
    if (!again.out) return kernel_failure("the repeated unperturbed run", again.error);
    spread = RunToRunSpread(*base.out, *again.out);
  }

  // ---- Perturbed runs. ----
  std::vector<std::string_view> names = {"o"};
  if (caps.lse) names.push_back("lse");  // a kernel without lse: o and the gradients only
  if (backward) names.insert(names.end(), {"dq", "dk", "dv"});
  std::vector<Worst> worst(names.size());
  for (const PerturbSet& set : sets) {
    for (PerturbKind kind : kKinds) {
      RunOutcome r = RunPerturbed(kernel, p, in, set, kind, *fmt, backward);
      const std::string what = std::string(Name(kind)) + " written to " + set.description;
      if (!r.out) {
        if (r.unsupported) continue;
        return kernel_failure("perturbed inputs (" + what + ")", r.error);
      }
      for (size_t t = 0; t < names.size(); ++t) {
        const std::string_view n = names[t];
        const std::vector<int64_t>& idx = ProtectedOf(set.keep, n);
        const Tensor* sp = spread ? &Pick(*spread, n) : nullptr;
        Judge(p, n, Pick(*base.out, n), sp, Pick(*r.out, n), idx, what, worst[t]);
      }
    }
  }

  std::vector<Verdict> verdicts;
  for (size_t t = 0; t < names.size(); ++t) {
    const Worst& w = worst[t];
    if (w.judged == 0) continue;
    verdicts.push_back(NonInterferenceVerdict(names[t], w, caps.deterministic,
                                              sets.size() * std::size(kKinds), shared_scales,
                                              options, planner.sampled));
  }
  return verdicts;
}

std::vector<Verdict> RunNonInterference(CheckContext& ctx) {
  if (ctx.kernel == nullptr) return {};
  NonInterferenceOptions options;
  options.seed = ctx.seed;
  options.repro = ctx.repro;
  options.backward = ctx.WantsBackward();
  if (ctx.sample) {
    options.query_rows = &ctx.sample->query_rows;
    options.key_rows = &ctx.sample->key_rows;
  }
  std::vector<Verdict> verdicts =
      CheckNonInterference(*ctx.kernel, ctx.case_.problem, ctx.inputs, options);
  if (verdicts.empty()) {
    ctx.not_applicable = "no input is hidden from any output (no mask, one sequence), or the "
                         "kernel refused the case";
  }
  Finish(verdicts, ctx);
  return verdicts;
}

}  // namespace attest
