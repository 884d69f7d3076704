// Internals of `attest audit`'s data collection (run/audit/audit.h) shared by its three files:
// audit.cc (the accuracy sweeps, gradient bias and the run), audit_leak.cc (the leak maps) and
// audit_checks.cc (the non-interference and consistency cases).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "kernels/kernel.h"
#include "reference/case/case_file.h"
#include "reference/oracle/oracle.h"
#include "run/audit/audit.h"
#include "run/suite.h"
#include "verify/report/repro.h"
#include "verify/report/report.h"
#include "verify/tolerance/tolerance.h"

namespace attest::audit_internal {

// Outputs of one kernel call pair, widened to f64.
struct Outputs {
  Tensor o, lse, dq, dk, dv;
  std::string note;  // set when there are no outputs
  bool ok() const { return o.defined(); }
};

// Forward (and with `backward` backward) of `kernel` on one input set; a note instead of
// outputs when the kernel declines or fails (audit.cc).
Outputs RunKernel(Kernel& kernel, const Problem& p, const Tensor& q, const Tensor& k,
                  const Tensor& v, const Tensor& dout, bool backward);

// One audit of a kernel beside a baseline (RunAudit): the plan's measurements in order, each
// step reported to AuditOptions::progress.
class Auditor {
 public:
  Auditor(const AuditOptions& options, Kernel& kernel, Kernel& baseline, const Profile& profile,
          DType dtype)
      : opt_(options), kernel_(kernel), baseline_(baseline), profile_(profile), dtype_(dtype) {
    caps_ = kernel.capabilities();
    backward_ = caps_.backward;
    // A kernel without a causal mask gets its curves, consistency and bias cases unmasked
    // (else every one of them would be "not applicable" and the audit judge nothing).
    causal_ = caps_.causal;
    baseline_backward_ = baseline.capabilities().backward;
    oracle_.threads = options.threads;
  }

  Expected<AuditResult> Run();

 private:
  void Step(const std::string& what) {
    if (opt_.progress) opt_.progress({done_, total_, what});
    ++done_;
  }
  // "causal" or "non-causal", as the sweeps and cases are run (causal_).
  std::string_view MaskWord() const { return causal_ ? "causal" : "non-causal"; }
  Problem MakeProblem(int64_t s, int64_t d, bool causal) const {
    Problem p;
    p.batch = 1;
    p.heads_q = p.heads_kv = opt_.plan.heads;
    p.seqlen_q = p.seqlen_k = s;
    p.head_dim = p.head_dim_v = d;
    p.dtype = dtype_;
    p.causal = causal;
    return p;
  }
  Case MakeCase(const Problem& p, std::string generator, uint64_t row) const {
    Case c;
    c.problem = p;
    const nlohmann::json& all = opt_.plan.distribution_params;
    nlohmann::json params = all.is_object() && all.contains(generator) ? all[generator]
                                                                       : nlohmann::json::object();
    c.generator = GeneratorSpec{std::move(generator), MixSeed(opt_.seed, row), std::move(params)};
    return c;
  }
  // Saves a failing verdict's case into out_dir/cases and points its repro line at it.
  Status SaveRepro(Verdict& v, const Case& c) {
    if (v.pass || opt_.out_dir.empty()) return {};
    auto path = SaveFailureCase(c, opt_.out_dir / "cases", opt_.kernel_spec, v);
    if (!path.ok()) return path.error();
    v.repro = ReproCommand(opt_.kernel_spec, *path, v.check);
    return {};
  }
  Expected<AuditCase> Measure(const std::string& label, const Case& c, bool judge);
  Status MeasureLeakMaps(AuditResult& r);
  Status MeasureNonInterference(AuditResult& r);
  Status MeasureConsistency(AuditResult& r);
  Status MeasureBias(AuditResult& r);

  const AuditOptions& opt_;
  Kernel& kernel_;
  Kernel& baseline_;
  const Profile& profile_;
  DType dtype_;
  Capabilities caps_;
  bool backward_ = false;
  bool causal_ = true;
  bool baseline_backward_ = false;
  OracleOptions oracle_;
  int64_t done_ = 0, total_ = 0;
  uint64_t row_ = 0;  // case counter mixed into generator seeds
};

}  // namespace attest::audit_internal
