// `attest golden verify|regen` as a library (format in
// manifest.h, cases in catalog.h). verify: every file's SHA-256 matches the manifest, the
// inputs still reproduce bit for bit from the recorded generator and seed, and the float64
// oracle agrees with the stored mp256 outputs within the oracle's certification bound
// (reference/oracle/oracle.h ErrorBound). regen: rewrites inputs (deterministic bytes), mp256
// outputs and the manifest from the catalogue.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "reference/oracle/oracle.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

// The tensors a golden outputs file holds, in this order.
inline constexpr std::string_view kGoldenOutputTensors[] = {"o", "lse", "dq", "dk", "dv",
                                                            "delta"};

// One output tensor of one case: the float64 oracle against the stored mp256 values.
struct GoldenTensorCheck {
  std::string tensor;
  double max_abs_error = 0;  // max |double - mp256| over elements (inf where only one is inf)
  double bound = 0;          // ErrorBound(double) + ErrorBound(mp256), absolute
  double ref_max_abs = 0;    // max |mp256| over finite elements (scale for the relative error)
  Shape worst_index;         // where max_abs_error occurs (empty when the tensor is empty)
  bool pass = true;

  double relative_error() const { return ref_max_abs > 0 ? max_abs_error / ref_max_abs : 0; }
  double margin() const { return bound > 0 ? max_abs_error / bound : (max_abs_error > 0 ? 1e300 : 0); }
};

enum class GoldenOutcome {
  kPass,    // hashes, inputs and outputs all hold
  kDrift,   // a finding: inputs no longer reproduce, or the oracle left the bound (exit 1)
  kBroken,  // missing, corrupt or inconsistent files (exit 2)
};

struct GoldenCaseReport {
  std::string name;
  GoldenOutcome outcome = GoldenOutcome::kPass;
  std::vector<std::string> messages;  // one line each, naming the case and file or tensor
  std::vector<GoldenTensorCheck> tensors;
  double seconds = 0;
};

struct GoldenVerifyOptions {
  std::filesystem::path dir = "golden/cases";
  std::optional<std::string> only;  // one case name
  OracleOptions oracle;
};

// The error (exit 2) is for a missing or unreadable manifest or an unknown --only name;
// per-case problems are in the reports.
Expected<std::vector<GoldenCaseReport>> VerifyGolden(const GoldenVerifyOptions& options);

struct GoldenRegenOptions {
  std::filesystem::path dir = "golden/cases";
  std::optional<std::string> only;  // one catalogue name; others keep their entries
  std::string attest_version;       // recorded in provenance; empty: this build's
  std::string commit = "unknown";   // recorded in provenance
  std::string date;                 // empty: now (UTC)
  OracleOptions oracle;
  std::function<void(std::string_view)> log;  // progress lines (may be empty)
};

struct GoldenRegenReport {
  std::vector<std::string> written;    // cases whose files were (re)written
  std::vector<std::string> unchanged;  // cases whose bytes came out identical
  std::vector<std::string> dropped;    // manifest entries no longer in the catalogue
};

// Writes NAME.case.json, NAME.inputs.safetensors, NAME.mp256.safetensors for each case and
// the manifest. A case whose three files hash as before keeps its provenance (so a regen on
// an unchanged tree leaves every byte, the manifest's included, as it was).
Expected<GoldenRegenReport> RegenGolden(const GoldenRegenOptions& options);

// Exit code for a set of reports: 2 if any is broken, else 1 if any drifted, else 0.
int GoldenExitCode(const std::vector<GoldenCaseReport>& reports);

}  // namespace attest
