// Judging outputs produced elsewhere (`attest compare`; docs/design.md
// "CLI contract"): a case file's inputs, outputs from any source (a PyTorch script, a GPU
// run) in a safetensors file, the float64 oracle, the same-precision baseline where the
// profile asks for one, and one verdict per (tensor, policy).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "reference/case/case_file.h"
#include "reference/formats/format.h"
#include "reference/io/safetensors.h"
#include "reference/oracle/oracle.h"
#include "reference/status.h"
#include "verify/metrics/metrics.h"
#include "verify/tolerance/tolerance.h"
#include "verify/tolerance/verdict.h"

namespace attest {

struct CompareOutputsOptions {
  // The profile to judge by; nullptr: the row of the problem's dtype (ProfileForDType).
  const Profile* profile = nullptr;
  // The format the metrics count ULPs in (TensorMetrics::max_ulp). Default: each tensor's
  // stored dtype. Profile policies that pin a format (bf16 o, fp32 lse) use theirs.
  std::optional<Format> output_format;
  // The producer declares lse = +inf for empty rows (docs/design.md "Empty rows").
  bool lse_pos_inf_for_empty = false;
  // The producer returns lse (kernels/kernel.h Capabilities::lse). False: lse is neither
  // required nor judged, even when the file holds one.
  bool lse = true;
  // Put into every failing verdict: the command that reproduces this comparison.
  std::string repro;
  OracleOptions oracle;
};

struct CompareOutputsResult {
  Report report;
  std::vector<TensorMetrics> metrics;           // one per compared tensor, in o lse dq dk dv order
  std::vector<TensorMetrics> baseline_metrics;  // same order, when a baseline was computed
};

// `outputs` must hold o and (unless options.lse is false) lse of the problem's shapes; dq,
// dk, dv are optional (the case
// must then provide "do"). Any float dtype is widened exactly. Errors (exit code 2 at the
// CLI) name the tensor or field: missing or misshapen outputs, inputs that cannot be made, a
// profile that needs a baseline the dtype has none of.
Expected<CompareOutputsResult> CompareOutputs(const Case& c, const NamedTensors& outputs,
                                              const CompareOutputsOptions& options = {});

}  // namespace attest
