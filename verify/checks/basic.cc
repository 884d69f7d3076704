// Determinism, unwritten outputs, special values, honesty (see basic.h).
#include "verify/checks/basic.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "reference/formats/format.h"
#include "reference/problem/mask.h"
#include "verify/checks/accuracy.h"
#include "verify/checks/relbias_relation.h"
#include "verify/checks/sink_relation.h"

namespace attest {
namespace {

// Where rows and key columns of a problem's tensors live in their contiguous f64 widening.
// Padded tensors flatten (b, i) to the token b * S + i, packed ones use cu_seqlens; both are
// SequenceOf's q_begin / k_begin.
struct Offsets {
  const Problem& p;
  int64_t RowO(const Sequence& s, int64_t h, int64_t i, int64_t width) const {
    return ((s.q_begin + i) * p.heads_q + h) * width;
  }
  int64_t RowK(const Sequence& s, int64_t hk, int64_t j, int64_t width) const {
    return ((s.k_begin + j) * p.heads_kv + hk) * width;
  }
  int64_t Lse(int64_t b, const Sequence& s, int64_t h, int64_t i) const {
    if (p.varlen()) return h * p.TotalQ() + s.q_begin + i;
    return (b * p.heads_q + h) * p.seqlen_q + i;
  }
};

// Counts of elements breaking an exact rule, with the first one.
struct Violations {
  int64_t count = 0;
  Location first;
  void Add(const Problem& p, std::string_view tensor, const Tensor& t, int64_t flat,
           double value) {
    if (count++ == 0) {
      first = LocateElement(p, tensor, t.shape(), flat);
      first.observed = value;
    }
  }
};

Verdict ExactRule(std::string_view tensor, std::string policy, const Violations& v,
                  int64_t checked, std::string_view what) {
  Verdict out;
  out.check = "special-values";
  out.tensor = std::string(tensor);
  out.policy = std::move(policy);
  out.observed = static_cast<double>(v.count);
  out.allowed = 0;
  out.pass = v.count == 0;
  out.margin = out.pass ? 0.0 : std::numeric_limits<double>::infinity();
  out.worst = v.first;
  out.message = out.pass ? fmt::format("{}: {} {} element(s) exact", tensor, checked, what)
                         : fmt::format("{}: {} of {} {} element(s) break the rule, first at {}",
                                       tensor, v.count, checked, what, v.first.ToString());
  return out;
}

}  // namespace

std::vector<Verdict> RunDeterminism(CheckContext& ctx) {
  constexpr std::string_view kCheck = "determinism";
  constexpr int kRepeats = 2;
  const Problem& p = ctx.case_.problem;
  const CaseInputs& in = ctx.inputs;
  const bool claimed = ctx.kernel->capabilities().deterministic;
  const auto& f0 = ctx.KernelForward();
  if (auto v = NonOutputVerdicts(kCheck, *ctx.kernel, p, f0, "forward")) return *v;
  const ForwardResult& first = std::get<ForwardResult>(f0);

  struct Run {
    const char* name;
    const Tensor* base;
    std::vector<Tensor> repeats;
  };
  // o, then lse where the kernel returns one (JudgesLse); the gradients follow.
  const bool judge_lse = JudgesLse(*ctx.kernel);
  std::vector<Run> runs = {{"o", &first.o, {}}};
  if (judge_lse) runs.push_back({"lse", &first.lse, {}});
  const size_t n_forward = runs.size();
  std::vector<Verdict> out;
  for (int r = 0; r < kRepeats; ++r) {
    auto f = ctx.kernel->Forward(p, in.q, in.k, in.v);
    if (auto v = NonOutputVerdicts(kCheck, *ctx.kernel, p, f, "repeated forward")) {
      if (v->empty()) {
        v->push_back(Failure(kCheck, "", "the same answer every run",
                             "the repeated forward answered Unsupported where the first did not"));
      }
      return *v;
    }
    runs[0].repeats.push_back(std::get<ForwardResult>(f).o);
    if (judge_lse) runs[1].repeats.push_back(std::get<ForwardResult>(f).lse);
  }
  BackwardResult bwd_first;
  if (ctx.WantsBackward()) {
    const auto& b0 = ctx.KernelBackward();
    if (auto v = NonOutputVerdicts(kCheck, *ctx.kernel, p, b0, "backward")) {
      out = *v;
    } else {
      bwd_first = std::get<BackwardResult>(b0);
      runs.push_back({"dq", &bwd_first.dq, {}});
      runs.push_back({"dk", &bwd_first.dk, {}});
      runs.push_back({"dv", &bwd_first.dv, {}});
      for (int r = 0; r < kRepeats; ++r) {
        // The same forward outputs each time, so only the backward's own variation shows.
        auto b = ctx.kernel->Backward(p, in.q, in.k, in.v, first.o, first.lse, in.dout);
        if (!std::holds_alternative<BackwardResult>(b)) {
          // Why, in the kernel's words: a crash or a timeout of the repeat is that finding.
          const std::string why = std::holds_alternative<Error>(b)
                                      ? std::get<Error>(b).message
                                      : "Unsupported: " + std::get<Unsupported>(b).reason;
          out.push_back(Failure(kCheck, "", "the same answer every run",
                                "the repeated backward returned no outputs where the first "
                                "did (" + why + ")"));
          runs.resize(n_forward);
          break;
        }
        const auto& br = std::get<BackwardResult>(b);
        runs[n_forward].repeats.push_back(br.dq);
        runs[n_forward + 1].repeats.push_back(br.dk);
        runs[n_forward + 2].repeats.push_back(br.dv);
      }
    }
  }

  const std::string policy =
      claimed ? fmt::format("bitwise equal over {} runs", kRepeats + 1)
              : std::string("not claimed deterministic (variation reported, not failed)");
  for (const Run& run : runs) {
    // An output the kernel did not return (one it claims: unwritten-outputs reports it) has
    // nothing to repeat.
    if (!run.base->defined()) continue;
    BitwiseDiff worst;
    int worst_run = -1;
    bool shape_mismatch = false;
    for (size_t r = 0; r < run.repeats.size(); ++r) {
      const Tensor& t = run.repeats[r];
      if (t.shape() != run.base->shape() || t.dtype() != run.base->dtype()) {
        shape_mismatch = true;
        break;
      }
      BitwiseDiff d = DiffBitwise(*run.base, t);
      if (d.differing > worst.differing) {
        worst = d;
        worst_run = static_cast<int>(r) + 2;
      }
    }
    if (shape_mismatch) {
      out.push_back(Failure(kCheck, run.name, policy,
                            fmt::format("{}: a repeated run returned another shape or dtype",
                                        run.name)));
      continue;
    }
    Verdict v;
    v.check = std::string(kCheck);
    v.tensor = run.name;
    v.policy = policy;
    v.observed = static_cast<double>(worst.differing);
    v.allowed = 0;
    if (worst.differing == 0) {
      v.pass = true;
      v.margin = 0;
      v.message = fmt::format("{}: bitwise equal over {} runs", run.name, kRepeats + 1);
    } else {
      v.worst = LocateElement(p, run.name, run.base->shape(), worst.first);
      v.worst.observed = worst.b;
      v.worst.reference = worst.a;
      v.pass = !claimed;
      v.margin = claimed ? std::numeric_limits<double>::infinity() : 0.0;
      v.message = fmt::format(
          "{}: run {} differs from run 1 in {} element(s), first at {} (run 1: {:.9g}){}",
          run.name, worst_run, worst.differing, v.worst.Coordinates(), worst.a,
          claimed ? " although the kernel claims deterministic" : " (not claimed)");
    }
    out.push_back(std::move(v));
  }
  return out;
}

std::vector<Verdict> RunUnwrittenOutputs(CheckContext& ctx) {
  // An unwritten element is one that still holds the harness's poison (all-ones bytes,
  // kernels/kernel.h kOutputPoisonByte), whatever the oracle says there: a NaN the kernel
  // computed (0 * inf on an empty row, a NaN block scale) is a wrong value, judged by
  // special-values and accuracy, not an unwritten one.
  constexpr std::string_view kCheck = "unwritten-outputs";
  const Problem& p = ctx.case_.problem;
  const auto& f = ctx.KernelForward();
  if (auto v = NonOutputVerdicts(kCheck, *ctx.kernel, p, f, "forward")) return *v;
  const ForwardResult& fwd = std::get<ForwardResult>(f);
  std::vector<Verdict> out;
  struct Slot {
    const char* name;
    const Tensor* t;
    Shape shape;
  };
  // A kernel that declares no lse is not asked for one; one that claims lse and omits it
  // fails here ("not returned").
  std::vector<Slot> slots = {{"o", &fwd.o, p.OShape()}};
  if (JudgesLse(*ctx.kernel)) slots.push_back({"lse", &fwd.lse, p.LseShape()});
  if (ctx.WantsBackward()) {
    const auto& b = ctx.KernelBackward();
    if (auto v = NonOutputVerdicts(kCheck, *ctx.kernel, p, b, "backward")) {
      for (auto& x : *v) out.push_back(std::move(x));
    } else {
      const BackwardResult& bwd = std::get<BackwardResult>(b);
      slots.push_back({"dq", &bwd.dq, p.QShape()});
      slots.push_back({"dk", &bwd.dk, p.KShape()});
      slots.push_back({"dv", &bwd.dv, p.VShape()});
    }
  }
  const std::string policy = "every element written (none still holds the all-ones poison)";
  for (const Slot& s : slots) {
    if (Status st = CheckOutputTensor(*s.t, s.name, s.shape); !st.ok()) {
      out.push_back(Failure(kCheck, s.name, "output of the problem's shape and a float dtype",
                            st.error().message + " (an output the kernel did not produce as "
                                                 "specified)"));
      continue;
    }
    const int64_t n = s.t->numel();
    Violations v;
    for (int64_t e = 0; e < n; ++e) {
      if (IsOutputPoison(*s.t, e)) {
        v.Add(p, s.name, *s.t, e, std::numeric_limits<double>::quiet_NaN());
      }
    }
    Verdict verdict;
    verdict.check = std::string(kCheck);
    verdict.tensor = s.name;
    verdict.policy = policy;
    verdict.observed = static_cast<double>(v.count);
    verdict.pass = v.count == 0;
    verdict.margin = verdict.pass ? 0.0 : std::numeric_limits<double>::infinity();
    verdict.worst = v.first;
    verdict.message =
        verdict.pass ? fmt::format("{}: all {} elements written", s.name, n)
                     : fmt::format("{}: {} of {} element(s) still hold the harness's poison "
                                   "(never written), first at {}",
                                   s.name, v.count, n, v.first.ToString());
    out.push_back(std::move(verdict));
  }
  return out;
}

namespace {

// An output special-values judges: the kernel's tensor, its shape and the oracle's values.
struct OracleSlot {
  const char* name;
  const Tensor* t;
  Shape shape;
  Tensor ref;
};

// The special-values rules' view of one case: the kernel's outputs widened to f64 (obs[k] for
// slots[k]; lse only where the kernel returns it) and, for a sampled case, its empty rows.
struct SpecialValuesCase {
  const Problem& p;
  const std::vector<OracleSlot>& slots;
  const std::vector<Tensor>& obs;
  bool judge_lse;
  bool sampled;
  const std::vector<uint8_t>& empty_q;  // sampled or with a sink: the mask's empty rows
  // A learnable sink (Problem::sink): [Hq]; an empty row's lse is sink_h (docs/semantics.md),
  // the declared empty-row lse where sink_h is -inf. Empty without a sink.
  const std::vector<double>& sink;
};

// 1. Finite wherever the oracle is finite (overflow in huge logits, NaN from 0 * inf at
// format edges). lse may be -inf exactly where the oracle's is. A sampled case
// (CheckContext::sample): where the oracle did not compute (NaN), the kernel must be finite
// too, except the lse of an empty row (known exactly from the mask, verify/metrics/sample.h): the
// oracle of finite inputs is finite there (o a convex combination of v rows, lse a finite
// log-sum-exp).
void JudgeFiniteWhereOracleIs(const SpecialValuesCase& c, const std::string& sample_note,
                              std::vector<Verdict>& out) {
  const Problem& p = c.p;
  const auto lse_token = [&](int64_t e) {
    return p.varlen() ? e % p.TotalQ()
                      : (e / (p.heads_q * p.seqlen_q)) * p.seqlen_q + e % p.seqlen_q;
  };
  for (size_t k = 0; k < c.slots.size(); ++k) {
    if (k == 1 && !c.judge_lse) continue;
    const auto so = c.obs[k].span<const double>();
    const auto sr = c.slots[k].ref.span<const double>();
    Violations v;
    int64_t finite_refs = 0;
    for (size_t e = 0; e < so.size(); ++e) {
      if (c.sampled && std::isnan(sr[e])) {
        if (k == 1 && c.empty_q[static_cast<size_t>(lse_token(static_cast<int64_t>(e)))]) continue;
        ++finite_refs;
        if (!std::isfinite(so[e])) {
          v.Add(p, c.slots[k].name, c.obs[k], static_cast<int64_t>(e), so[e]);
        }
        continue;
      }
      if (!std::isfinite(sr[e])) continue;
      ++finite_refs;
      if (!std::isfinite(so[e])) {
        v.Add(p, c.slots[k].name, c.obs[k], static_cast<int64_t>(e), so[e]);
        if (v.count == 1) v.first.reference = sr[e];
      }
    }
    out.push_back(ExactRule(c.slots[k].name, "finite where the oracle is finite", v, finite_refs,
                            "finite-reference"));
    out.back().message += sample_note;
  }
}

// What step 2 of special-values found: elements breaking the exact rules of empty rows
// (o, lse, dq) and of keys no query sees (dk, dv), and how many rows and keys were judged.
struct ExactZeros {
  Violations o_bad, lse_bad, dq_bad, dk_bad, dv_bad;
  int64_t empty_rows = 0, unseen_keys = 0;
};

// Empty rows of sequence b (oracle lse = -inf; with a sink, no visible key): o and dq exactly 0,
// lse exactly `empty_lse` (with a sink: the head's sink, unless it is -inf).
void JudgeEmptyRows(const SpecialValuesCase& c, int64_t b, const Sequence& s, bool backward,
                    double empty_lse, ExactZeros& z) {
  const Problem& p = c.p;
  const auto rl = c.slots[1].ref.span<const double>();
  const Offsets at{p};
  for (int64_t h = 0; h < p.heads_q; ++h) {
    for (int64_t i = 0; i < s.q_len; ++i) {
      const int64_t l = at.Lse(b, s, h, i);
      const bool by_mask = c.sampled || p.sink;
      const bool empty = by_mask ? c.empty_q[static_cast<size_t>(s.q_begin + i)] != 0
                                 : std::isinf(rl[static_cast<size_t>(l)]) &&
                                       rl[static_cast<size_t>(l)] < 0;
      if (!empty) continue;
      ++z.empty_rows;
      const double sink =
          p.sink ? c.sink[static_cast<size_t>(h)] : -std::numeric_limits<double>::infinity();
      const double want = std::isinf(sink) ? empty_lse : sink;
      if (c.judge_lse) {
        const double lo = c.obs[1].span<const double>()[static_cast<size_t>(l)];
        if (lo != want) z.lse_bad.Add(p, "lse", c.obs[1], l, lo);
      }
      const int64_t ro = at.RowO(s, h, i, p.head_dim_v);
      for (int64_t d = 0; d < p.head_dim_v; ++d) {
        const double x = c.obs[0].span<const double>()[static_cast<size_t>(ro + d)];
        if (x != 0) z.o_bad.Add(p, "o", c.obs[0], ro + d, x);
      }
      if (backward) {
        const int64_t rq = at.RowO(s, h, i, p.head_dim);
        for (int64_t d = 0; d < p.head_dim; ++d) {
          const double x = c.obs[2].span<const double>()[static_cast<size_t>(rq + d)];
          if (x != 0) z.dq_bad.Add(p, "dq", c.obs[2], rq + d, x);
        }
      }
    }
  }
}

// Keys no query of sequence b sees (the mask is the same for every head): dk and dv exactly 0.
void JudgeUnseenKeys(const SpecialValuesCase& c, int64_t b, const Sequence& s, ExactZeros& z) {
  const Problem& p = c.p;
  const Offsets at{p};
  const MaskView mask(p, b);
  for (int64_t j = 0; j < s.k_len; ++j) {
    bool seen = false;
    for (int64_t i = 0; i < s.q_len && !seen; ++i) seen = mask.Visible(i, j);
    if (seen) continue;
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      ++z.unseen_keys;
      const int64_t rk = at.RowK(s, hk, j, p.head_dim);
      for (int64_t d = 0; d < p.head_dim; ++d) {
        const double x = c.obs[3].span<const double>()[static_cast<size_t>(rk + d)];
        if (x != 0) z.dk_bad.Add(p, "dk", c.obs[3], rk + d, x);
      }
      const int64_t rv = at.RowK(s, hk, j, p.head_dim_v);
      for (int64_t d = 0; d < p.head_dim_v; ++d) {
        const double x = c.obs[4].span<const double>()[static_cast<size_t>(rv + d)];
        if (x != 0) z.dv_bad.Add(p, "dv", c.obs[4], rv + d, x);
      }
    }
  }
}

// 2. Empty rows (oracle lse = -inf) and unseen keys: exact zeros, and lse = -inf or the
// +inf the kernel declares (Capabilities::empty_row_lse; docs/design.md: nothing else).
void JudgeEmptyRowsAndUnseenKeys(const SpecialValuesCase& c, const Kernel& kernel, bool backward,
                                 std::vector<Verdict>& out) {
  const Problem& p = c.p;
  const double empty_lse = EmptyRowLse(kernel.capabilities());
  const std::string lse_rule =
      fmt::format("lse = {}{} on empty rows", p.sink ? "the head's sink (a -inf sink: " : "",
                  empty_lse > 0 ? "+inf (declared)" : "-inf") + (p.sink ? ")" : "");
  ExactZeros z;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence s = SequenceOf(p, b);
    JudgeEmptyRows(c, b, s, backward, empty_lse, z);
    if (!backward) continue;
    JudgeUnseenKeys(c, b, s, z);
  }
  if (z.empty_rows > 0) {
    out.push_back(ExactRule("o", "o = 0 on empty rows", z.o_bad, z.empty_rows * p.head_dim_v,
                            "empty-row"));
    if (c.judge_lse) {
      out.push_back(ExactRule("lse", lse_rule, z.lse_bad, z.empty_rows, "empty-row"));
    }
    if (backward) {
      out.push_back(ExactRule("dq", "dq = 0 on empty rows", z.dq_bad, z.empty_rows * p.head_dim,
                              "empty-row"));
    }
  }
  if (z.unseen_keys > 0) {
    out.push_back(ExactRule("dk", "dk = 0 for keys no query sees", z.dk_bad,
                            z.unseen_keys * p.head_dim, "unseen-key"));
    out.push_back(ExactRule("dv", "dv = 0 for keys no query sees", z.dv_bad,
                            z.unseen_keys * p.head_dim_v, "unseen-key"));
  }
}

}  // namespace

std::vector<Verdict> RunSpecialValues(CheckContext& ctx) {
  constexpr std::string_view kCheck = "special-values";
  const Problem& p = ctx.case_.problem;
  const auto& f = ctx.KernelForward();
  if (auto v = NonOutputVerdicts(kCheck, *ctx.kernel, p, f, "forward")) return *v;
  const ForwardResult& fwd = std::get<ForwardResult>(f);
  std::vector<Verdict> out;
  const BackwardResult* bwd = nullptr;
  if (ctx.WantsBackward()) {
    const auto& b = ctx.KernelBackward();
    if (auto v = NonOutputVerdicts(kCheck, *ctx.kernel, p, b, "backward")) {
      for (auto& x : *v) out.push_back(std::move(x));
    } else {
      bwd = &std::get<BackwardResult>(b);
    }
  }
  std::vector<OracleSlot> slots;
  if (bwd != nullptr) {
    const BackwardOut& o = ctx.OracleBackward();
    slots = {{"o", &fwd.o, p.OShape(), o.o},   {"lse", &fwd.lse, p.LseShape(), o.lse},
             {"dq", &bwd->dq, p.QShape(), o.dq}, {"dk", &bwd->dk, p.KShape(), o.dk},
             {"dv", &bwd->dv, p.VShape(), o.dv}};
  } else {
    const ForwardOut& o = ctx.OracleForward();
    slots = {{"o", &fwd.o, p.OShape(), o.o}, {"lse", &fwd.lse, p.LseShape(), o.lse}};
  }
  // Slot 1 is lse: its oracle values find the empty rows below; the kernel's are judged only
  // where it returns them (JudgesLse).
  const bool judge_lse = JudgesLse(*ctx.kernel);
  std::vector<Tensor> obs(slots.size());
  for (size_t k = 0; k < slots.size(); ++k) {
    if (k == 1 && !judge_lse) continue;
    if (Status st = CheckOutputTensor(*slots[k].t, slots[k].name, slots[k].shape); !st.ok()) {
      out.push_back(Failure(kCheck, slots[k].name, "output of the problem's shape",
                            "cannot check: " + st.error().message));
      return out;
    }
    obs[k] = ToF64(*slots[k].t);
  }

  const bool sampled = ctx.sample.has_value();
  const std::vector<uint8_t> empty_q =
      sampled || p.sink ? EmptyQueryRows(p) : std::vector<uint8_t>();
  const std::string sample_note = sampled ? " [" + ctx.sample->Describe() + "]" : "";
  std::vector<double> sink;
  if (p.sink) {
    const Tensor w = ToF64(ctx.inputs.sink);
    sink.assign(w.span<const double>().begin(), w.span<const double>().end());
  }
  const SpecialValuesCase c{p, slots, obs, judge_lse, sampled, empty_q, sink};
  JudgeFiniteWhereOracleIs(c, sample_note, out);
  JudgeEmptyRowsAndUnseenKeys(c, *ctx.kernel, bwd != nullptr, out);
  if (!sampled) JudgeMinusInfSinkHeads(ctx, fwd, out);
  if (!sampled) JudgeZeroRelBias(ctx, out);
  return out;
}

std::vector<Verdict> RunHonesty(CheckContext& ctx) {
  constexpr std::string_view kCheck = "honesty";
  const Problem& p = ctx.case_.problem;
  const Capabilities caps = ctx.kernel->capabilities();
  std::string why;
  const bool covered = caps.Covers(p, &why);
  const auto& f = ctx.KernelForward();
  std::vector<Verdict> out;
  if (const auto* u = std::get_if<Unsupported>(&f)) {
    if (covered) {
      out.push_back(Failure(kCheck, "", "a claimed feature is never refused",
                            fmt::format("{} answered Unsupported ({}) to a forward its "
                                        "capabilities cover",
                                        ctx.kernel->name(), u->reason)));
    } else {
      out.push_back(Passing(kCheck, "", "refuses what it does not claim",
                            fmt::format("honest refusal ({}): {}", why, u->reason)));
    }
    return out;
  }
  if (auto v = NonOutputVerdicts(kCheck, *ctx.kernel, p, f, "forward")) return *v;
  const ForwardResult& fwd = std::get<ForwardResult>(f);
  const BackwardResult* bwd = nullptr;
  if (ctx.inputs.dout.defined() && (caps.backward || !covered)) {
    // Outside its capabilities the kernel may still try a backward; it must then be right.
    const auto& b = ctx.KernelBackward();
    if (const auto* u = std::get_if<Unsupported>(&b)) {
      if (covered) {
        out.push_back(Failure(kCheck, "", "a claimed feature is never refused",
                              fmt::format("{} answered Unsupported ({}) to a backward its "
                                          "capabilities cover",
                                          ctx.kernel->name(), u->reason)));
      }
    } else if (const auto* e = std::get_if<Error>(&b)) {
      out.push_back(KernelError(*ctx.kernel, "backward", e->message));
    } else {
      bwd = &std::get<BackwardResult>(b);
    }
  }
  for (Verdict& v : JudgeAgainstOracle(ctx, kCheck, fwd, bwd)) {
    if (!covered) {
      v.message = fmt::format("answered a case outside its capabilities ({}): {}", why,
                              v.message);
    }
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace attest
