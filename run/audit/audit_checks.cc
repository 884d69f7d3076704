// `attest audit`'s non-interference and consistency cases (Auditor::MeasureNonInterference,
// MeasureConsistency; see audit.h, docs/audit.md): the checks that judge kernels elsewhere,
// run on a ladder of masks, packed documents and batches, failing cases saved for repro.
#include <algorithm>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "reference/case/inputs.h"
#include "run/audit/audit_internal.h"
#include "verify/checks/bias.h"
#include "verify/checks/check.h"
#include "verify/checks/consistency.h"
#include "verify/checks/noninterference.h"

namespace attest::audit_internal {

Status Auditor::MeasureNonInterference(AuditResult& r) {
  const AuditPlan& plan = opt_.plan;
  std::vector<NonInterferenceCase> cases;
  auto add = [&](std::string label, const Problem& p) {
    NonInterferenceCase n;
    n.label = std::move(label);
    n.c = MakeCase(p, "gaussian", ++row_);
    for (int64_t b = 0; b < p.batch; ++b) {
      const Sequence sq = SequenceOf(p, b);
      n.size += sq.q_len * sq.k_len;
    }
    cases.push_back(std::move(n));
  };
  const int64_t d = plan.seqlen_head_dim;
  for (int64_t s : plan.ni_seqlens) add(fmt::format("causal S={}", s), MakeProblem(s, d, true));
  const int64_t big = plan.ni_seqlens.empty() ? 64 : plan.ni_seqlens.back();
  {
    Problem p = MakeProblem(big, d, true);
    p.seqlen_q = big / 2;
    add(fmt::format("causal Sq={} < Sk={}", p.seqlen_q, p.seqlen_k), p);
  }
  {
    // A left window short enough that the middle row (the check's first pivot) hides keys.
    Problem p = MakeProblem(big, d, false);
    p.window_left = std::max<int64_t>(4, big / 8);
    p.window_right = 0;
    add(fmt::format("window ({}, 0) S={}", p.window_left, big), p);
  }
  {
    // Three packed documents, the middle one empty, none a multiple of 32 long: every
    // document boundary falls inside a 32-block.
    Problem p = MakeProblem(big, d, false);
    const int32_t a = static_cast<int32_t>(big / 2 + 3), b = static_cast<int32_t>(big - 5);
    p.batch = 3;
    p.cu_seqlens_q = p.cu_seqlens_k = std::vector<int32_t>{0, a, a, a + b};
    p.seqlen_q = p.seqlen_k = std::max(a, b);
    add(fmt::format("packed documents {}, 0, {}", a, b), p);
  }
  {
    // Two dense sequences, no mask: the only thing the second may not see is the first. A
    // scale shared across the batch (a per-tensor amax) moves it; every kernel claims this.
    Problem p = MakeProblem(big, d, false);
    p.batch = 2;
    add(fmt::format("dense batch 2 S={}", big), p);
  }
  std::stable_sort(cases.begin(), cases.end(),
                   [](const auto& x, const auto& y) { return x.size < y.size; });
  for (NonInterferenceCase& n : cases) {
    Step("non-interference: " + n.label);
    std::string why;
    if (!caps_.Covers(n.c.problem, &why)) {
      n.note = "not applicable: the kernel does not claim " + why;
      continue;
    }
    auto in = MakeCaseInputs(n.c);
    if (!in.ok()) return Error{n.label + ": " + in.error().message};
    NonInterferenceOptions o;
    o.seed = n.c.generator->seed;  // as `attest repro` on the saved case draws it
    o.repro = AuditCommand(opt_.kernel_spec, opt_.seed);
    n.verdicts = CheckNonInterference(kernel_, n.c.problem, *in, o);
    if (n.verdicts.empty()) n.note = "not applicable: nothing is hidden from any row";
    for (const Verdict& v : n.verdicts) {
      if (v.pass) continue;
      if (v.check == kKernelErrorCheck) {
        if (n.kernel_error.empty()) n.kernel_error = v.message;
      } else {
        n.leaks = true;
      }
    }
  }
  r.non_interference.cases = std::move(cases);
  for (size_t i = 0; i < r.non_interference.cases.size(); ++i) {
    NonInterferenceCase& n = r.non_interference.cases[i];
    if (!n.kernel_error.empty()) ++r.non_interference.kernel_errors;
    for (Verdict& v : n.verdicts) {
      if (v.pass) continue;
      if (r.non_interference.smallest_leak < 0 && v.check != kKernelErrorCheck) {
        r.non_interference.smallest_leak = static_cast<int>(i);
        if (!opt_.out_dir.empty()) {
          auto path = SaveFailureCase(n.c, opt_.out_dir, opt_.kernel_spec, v);
          if (!path.ok()) return path.error();
          r.non_interference.case_file = path->string();
          r.non_interference.repro = ReproCommand(opt_.kernel_spec, *path);
        }
      }
      if (Status s = SaveRepro(v, n.c); !s.ok()) return s;
    }
  }
  return {};
}

Status Auditor::MeasureConsistency(AuditResult& r) {
  const int64_t s = opt_.plan.consistency_seqlen, d = opt_.plan.seqlen_head_dim;
  std::vector<ConsistencyCase> cases;
  auto add = [&](std::string label, const Problem& p) {
    ConsistencyCase c;
    c.label = std::move(label);
    c.c = MakeCase(p, "gaussian", ++row_);
    cases.push_back(std::move(c));
  };
  const std::string_view mask = causal_ ? " causal" : "";
  add(fmt::format("S={}", s), MakeProblem(s, d, false));
  if (causal_) {
    add(fmt::format("causal S={}", s), MakeProblem(s, d, true));
  } else {
    Problem p = MakeProblem(s, d, false);
    p.seqlen_q = s / 2;
    add(fmt::format("Sq={} < Sk={}", p.seqlen_q, s), p);
  }
  {
    Problem p = MakeProblem(s, d, causal_);
    p.heads_q = 4;
    p.heads_kv = 2;
    add(fmt::format("GQA 4:2{} S={}", mask, s), p);
  }
  {
    Problem p = MakeProblem(s, d, causal_);
    const int32_t a = static_cast<int32_t>(s / 2 + 3), b = static_cast<int32_t>(s - 7);
    p.batch = 2;
    p.cu_seqlens_q = p.cu_seqlens_k = std::vector<int32_t>{0, a, a + b};
    p.seqlen_q = p.seqlen_k = std::max(a, b);
    add(fmt::format("packed documents {}, {}{}", a, b, mask), p);
  }
  for (ConsistencyCase& c : cases) {
    Step("consistency: " + c.label);
    std::string why;
    if (!backward_) {
      c.note = "not applicable: the kernel has no backward";
      continue;
    }
    if (!caps_.Covers(c.c.problem, &why)) {
      c.note = "not applicable: the kernel does not claim " + why;
      continue;
    }
    auto in = MakeCaseInputs(c.c);
    if (!in.ok()) return Error{c.label + ": " + in.error().message};
    ConsistencyOptions o;
    o.repro = AuditCommand(opt_.kernel_spec, opt_.seed);
    c.verdicts = CheckConsistency(kernel_, c.c.problem, *in, o, nullptr, &profile_);
    if (c.verdicts.empty()) c.note = "not applicable to this case";
    for (Verdict& v : c.verdicts) {
      if (Status st = SaveRepro(v, c.c); !st.ok()) return st;
    }
    // The bias check on the same case: the mean signed error of every output, in ulps.
    CheckContext ctx;
    ctx.kernel = &kernel_;
    ctx.kernel_spec = opt_.kernel_spec;
    ctx.case_ = c.c;
    ctx.inputs = std::move(in).value();
    ctx.profile = &profile_;
    ctx.oracle_options = oracle_;
    ctx.cuda_oracle = opt_.cuda_oracle;
    ctx.label = c.label;
    ctx.repro = o.repro;
    c.bias = CheckBias(ctx, BiasOptions{});
    c.bias_note = ctx.not_applicable;
    for (Verdict& v : c.bias) {
      if (Status st = SaveRepro(v, c.c); !st.ok()) return st;
    }
  }
  r.consistency = std::move(cases);
  return {};
}

}  // namespace attest::audit_internal
