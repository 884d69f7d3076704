// `attest golden verify|regen` (see golden.h). The verification bound is the oracle's own
// certification bound (reference/oracle/oracle.h ErrorBound) plus the one rounding of each
// stored mp256 value to double; nothing here invents a tolerance.
#include "reference/golden/golden.h"

#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "reference/case/case_file.h"
#include "reference/case/inputs.h"
#include "reference/data/generate.h"
#include "reference/formats/format.h"
#include "reference/golden/catalog.h"
#include "reference/golden/manifest.h"
#include "reference/golden/sha256.h"
#include "reference/io/safetensors.h"

namespace attest {
namespace {

namespace fs = std::filesystem;

// Unit roundoff of the mp256 oracle (oracle.h: MPFR with 257 bits of precision).
constexpr double kMp256UnitRoundoff = 0x1p-257;
// Unit roundoff of double: the one rounding of each exact value when mp256 results are stored.
constexpr double kDoubleUnitRoundoff = 0x1p-53;

#ifndef ATTEST_VERSION_STRING
#define ATTEST_VERSION_STRING "unknown"
#endif

constexpr std::string_view kInputTensors[] = {"q", "k", "v", "do"};

std::optional<OracleTensor> OracleTensorOf(std::string_view name) {
  for (OracleTensor t : {OracleTensor::kO, OracleTensor::kLse, OracleTensor::kDq,
                         OracleTensor::kDk, OracleTensor::kDv, OracleTensor::kDelta}) {
    if (Name(t) == name) return t;
  }
  return std::nullopt;
}

const Tensor* OutputOf(const BackwardOut& out, std::string_view name) {
  if (name == "o") return &out.o;
  if (name == "lse") return &out.lse;
  if (name == "dq") return &out.dq;
  if (name == "dk") return &out.dk;
  if (name == "dv") return &out.dv;
  if (name == "delta") return &out.delta;
  return nullptr;
}

Shape UnflattenIndex(int64_t flat, const Shape& shape) {
  Shape index(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

// max |a - b| elementwise; equal values (including equal infinities, e.g. lse = -inf on empty
// rows) count as 0, any other disagreement involving a non-finite value as +inf.
GoldenTensorCheck Compare(std::string_view name, const Tensor& computed, const Tensor& stored) {
  GoldenTensorCheck check;
  check.tensor = std::string(name);
  const auto a = computed.span<const double>();
  const auto b = stored.span<const double>();
  int64_t worst = -1;
  for (size_t n = 0; n < a.size(); ++n) {
    if (std::isfinite(b[n])) check.ref_max_abs = std::max(check.ref_max_abs, std::abs(b[n]));
    double err;
    if (a[n] == b[n]) {
      err = 0;
    } else if (std::isfinite(a[n]) && std::isfinite(b[n])) {
      err = std::abs(a[n] - b[n]);
    } else {
      err = std::numeric_limits<double>::infinity();
    }
    if (worst < 0 || err > check.max_abs_error) {
      check.max_abs_error = err;
      worst = static_cast<int64_t>(n);
    }
  }
  if (worst >= 0) check.worst_index = UnflattenIndex(worst, stored.shape());
  return check;
}

// The certified distance between the float64 oracle and the stored mp256 values: each run's
// ErrorBound (the mp256 run has the same magnitudes as the double run, with u = 2^-257),
// plus the rounding of the exact value to double when the mp256 result was stored.
double CertifiedBound(const OracleStats& double_stats, OracleTensor t, double ref_max_abs) {
  OracleStats mp_stats = double_stats;
  mp_stats.unit_roundoff = kMp256UnitRoundoff;
  return ErrorBound(double_stats, t) + ErrorBound(mp_stats, t) +
         kDoubleUnitRoundoff * ref_max_abs;
}

std::string NowUtc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void Fail(GoldenCaseReport& r, GoldenOutcome outcome, std::string message) {
  if (outcome == GoldenOutcome::kBroken || r.outcome == GoldenOutcome::kPass) r.outcome = outcome;
  r.messages.push_back(fmt::format("{}: {}", r.name, message));
}

// 1. Every file the manifest lists exists and hashes as recorded.
bool CheckHashes(const fs::path& dir, const GoldenEntry& e, GoldenCaseReport& r) {
  bool ok = true;
  for (const std::string& file :
       {GoldenCaseFile(e.name), GoldenInputsFile(e.name), GoldenOutputsFile(e.name)}) {
    if (!e.sha256.contains(file)) {
      Fail(r, GoldenOutcome::kBroken, fmt::format("manifest has no sha256 for {}", file));
      ok = false;
    }
  }
  for (const auto& [file, expected] : e.sha256) {
    const fs::path path = dir / file;
    if (!fs::exists(path)) {
      Fail(r, GoldenOutcome::kBroken, fmt::format("{}: missing file", path.string()));
      ok = false;
      continue;
    }
    auto got = Sha256File(path);
    if (!got) {
      Fail(r, GoldenOutcome::kBroken, got.error().message);
      ok = false;
    } else if (*got != expected) {
      Fail(r, GoldenOutcome::kBroken,
           fmt::format("{}: corrupt: sha256 {} but the manifest records {}", path.string(),
                       *got, expected));
      ok = false;
    }
  }
  return ok;
}

// 2. The stored inputs are exactly what the recorded generator and seed give today.
void CheckInputsReproduce(const GoldenEntry& e, const CaseInputs& stored, GoldenCaseReport& r) {
  Case gen;
  gen.problem = e.problem;
  gen.generator = GeneratorSpec{e.provenance.generator, e.provenance.seed, e.provenance.params};
  auto fresh = MakeCaseInputs(gen);
  if (!fresh) {
    Fail(r, GoldenOutcome::kBroken,
         fmt::format("cannot regenerate inputs from the provenance: {}", fresh.error().message));
    return;
  }
  const Tensor* a[] = {&stored.q, &stored.k, &stored.v, &stored.dout};
  const Tensor* b[] = {&fresh->q, &fresh->k, &fresh->v, &fresh->dout};
  for (size_t n = 0; n < 4; ++n) {
    if (!a[n]->BitwiseEqual(*b[n])) {
      Fail(r, GoldenOutcome::kDrift,
           fmt::format("tensor {}: stored inputs differ from generator '{}' seed {} (the "
                       "generator or the rounding changed)",
                       kInputTensors[n], e.provenance.generator, e.provenance.seed));
    }
  }
}

GoldenCaseReport VerifyOne(const fs::path& dir, const GoldenEntry& e,
                           const OracleOptions& oracle) {
  const auto start = std::chrono::steady_clock::now();
  GoldenCaseReport r;
  r.name = e.name;
  if (!CheckHashes(dir, e, r)) return r;

  auto c = LoadCase(dir / GoldenCaseFile(e.name));
  if (!c) {
    Fail(r, GoldenOutcome::kBroken, c.error().message);
    return r;
  }
  if (ProblemToJson(c->problem) != ProblemToJson(e.problem)) {
    Fail(r, GoldenOutcome::kBroken,
         fmt::format("{}: problem differs from the manifest's", GoldenCaseFile(e.name)));
    return r;
  }
  if (!c->inputs) {
    Fail(r, GoldenOutcome::kBroken,
         fmt::format("{}: no \"inputs\" file (golden cases pin their inputs)",
                     GoldenCaseFile(e.name)));
    return r;
  }
  auto in = MakeCaseInputs(*c);
  if (!in) {
    Fail(r, GoldenOutcome::kBroken, in.error().message);
    return r;
  }
  if (!in->dout.defined()) {
    Fail(r, GoldenOutcome::kBroken,
         fmt::format("{}: no tensor named 'do'", GoldenInputsFile(e.name)));
    return r;
  }
  CheckInputsReproduce(e, *in, r);

  const std::string out_path = (dir / GoldenOutputsFile(e.name)).string();
  auto stored = ReadSafetensors(out_path);
  if (!stored) {
    Fail(r, GoldenOutcome::kBroken, stored.error().message);
    return r;
  }
  const BackwardOut computed =
      Backward<double>(e.problem, in->q, in->k, in->v, in->dout, oracle);
  for (std::string_view name : kGoldenOutputTensors) {
    const Tensor* ref = stored->Find(name);
    const Tensor* got = OutputOf(computed, name);
    if (ref == nullptr) {
      Fail(r, GoldenOutcome::kBroken, fmt::format("{}: no tensor named '{}'", out_path, name));
      continue;
    }
    if (ref->dtype() != DType::kF64 || ref->shape() != got->shape()) {
      Fail(r, GoldenOutcome::kBroken,
           fmt::format("{}: tensor '{}' is {}, expected f64{}", out_path, name, ref->Describe(),
                       got->shape()));
      continue;
    }
    GoldenTensorCheck check = Compare(name, *got, *ref);
    check.bound = CertifiedBound(computed.stats, *OracleTensorOf(name), check.ref_max_abs);
    check.pass = check.max_abs_error <= check.bound;
    if (!check.pass) {
      Fail(r, GoldenOutcome::kDrift,
           fmt::format("tensor {}: max |double - mp256| = {:.3e} at {} exceeds the certified "
                       "bound {:.3e} (margin {:.2f})",
                       name, check.max_abs_error, check.worst_index, check.bound,
                       check.margin()));
    }
    r.tensors.push_back(std::move(check));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

Status WriteInputs(const fs::path& path, const Problem& p, const CaseInputs& in) {
  NamedTensors file;
  const Tensor* tensors[] = {&in.q, &in.k, &in.v, &in.dout};
  for (size_t n = 0; n < 4; ++n) {
    auto coded = FromF64(*tensors[n], p.dtype);
    if (!coded) return Error{fmt::format("{}: tensor {}: {}", path.string(), kInputTensors[n],
                                         coded.error().message)};
    file.Add(std::string(kInputTensors[n]), std::move(*coded));
  }
  return WriteSafetensors(path.string(), file);
}

Status WriteOutputs(const fs::path& path, const BackwardOut& out) {
  NamedTensors file;
  for (std::string_view name : kGoldenOutputTensors) {
    file.Add(std::string(name), *OutputOf(out, name));
  }
  file.metadata["precision"] = "mp256";
  return WriteSafetensors(path.string(), file);
}

}  // namespace

Expected<std::vector<GoldenCaseReport>> VerifyGolden(const GoldenVerifyOptions& options) {
  auto manifest = LoadManifest(options.dir / "manifest.json");
  if (!manifest) return manifest.error();
  std::vector<GoldenCaseReport> reports;
  if (options.only && manifest->Find(*options.only) == nullptr) {
    return Error{fmt::format("{}: no case named '{}'",
                             (options.dir / "manifest.json").string(), *options.only)};
  }
  for (const GoldenEntry& e : manifest->cases) {
    if (options.only && e.name != *options.only) continue;
    reports.push_back(VerifyOne(options.dir, e, options.oracle));
  }
  return reports;
}

Expected<GoldenRegenReport> RegenGolden(const GoldenRegenOptions& options) {
  const fs::path& dir = options.dir;
  const fs::path manifest_path = dir / "manifest.json";
  GoldenManifest manifest;
  if (fs::exists(manifest_path)) {
    auto old = LoadManifest(manifest_path);
    if (!old) return old.error();
    manifest = std::move(*old);
  }
  if (options.only && FindGoldenCase(*options.only) == nullptr) {
    return Error{fmt::format("golden regen: '{}' is not in the catalogue (reference/golden/"
                             "catalog.cc)",
                             *options.only)};
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Error{fmt::format("{}: cannot create: {}", dir.string(), ec.message())};

  GoldenRegenReport report;
  const std::string version =
      options.attest_version.empty() ? std::string(ATTEST_VERSION_STRING) : options.attest_version;
  const std::string date = options.date.empty() ? NowUtc() : options.date;
  for (const GoldenCaseSpec& spec : GoldenCatalog()) {
    if (options.only && spec.name != *options.only) continue;
    if (options.log) options.log(fmt::format("{}: {}", spec.name, spec.covers));
    // 1. Inputs: the generator's values rounded to the problem's dtype, stored in that dtype.
    Case gen;
    gen.problem = spec.problem;
    gen.generator = spec.generator;
    auto in = MakeCaseInputs(gen);
    if (!in) return Error{fmt::format("{}: {}", spec.name, in.error().message)};
    const fs::path inputs_path = fs::absolute(dir / GoldenInputsFile(spec.name));
    if (Status s = WriteInputs(inputs_path, spec.problem, *in); !s) return s.error();
    // 2. The case file points at them (SaveCase writes the path relative to the case file).
    Case pinned;
    pinned.problem = spec.problem;
    pinned.inputs = inputs_path.string();
    if (Status s = SaveCase(dir / GoldenCaseFile(spec.name), pinned); !s) return s.error();
    // 3. mp256 outputs from exactly the stored (rounded) inputs.
    const BackwardOut out = Backward(Precision::kMp256, spec.problem, in->q, in->k, in->v,
                                     in->dout, options.oracle);
    if (Status s = WriteOutputs(dir / GoldenOutputsFile(spec.name), out); !s) return s.error();
    // 4. The manifest entry; provenance is kept when every byte came out the same.
    GoldenEntry entry;
    entry.name = spec.name;
    entry.problem = spec.problem;
    for (const std::string& file : {GoldenCaseFile(spec.name), GoldenInputsFile(spec.name),
                                    GoldenOutputsFile(spec.name)}) {
      auto digest = Sha256File(dir / file);
      if (!digest) return digest.error();
      entry.sha256[file] = *digest;
    }
    const GoldenEntry* old = manifest.Find(spec.name);
    if (old != nullptr && old->sha256 == entry.sha256 &&
        ProblemToJson(old->problem) == ProblemToJson(entry.problem)) {
      entry.provenance = old->provenance;
      report.unchanged.push_back(spec.name);
    } else {
      entry.provenance = GoldenProvenance{spec.generator.name, spec.generator.seed,
                                          spec.generator.params, version,
                                          options.commit,        "mp256",
                                          date};
      report.written.push_back(spec.name);
    }
    manifest.Upsert(std::move(entry));
    // Saved after every case so that an interrupted regen keeps what it finished.
    if (Status s = SaveManifest(manifest_path, manifest); !s) return s.error();
  }
  if (!options.only) {
    std::vector<GoldenEntry> kept;
    for (GoldenEntry& e : manifest.cases) {
      if (FindGoldenCase(e.name) != nullptr) {
        kept.push_back(std::move(e));
      } else {
        report.dropped.push_back(e.name);
      }
    }
    manifest.cases = std::move(kept);
    if (Status s = SaveManifest(manifest_path, manifest); !s) return s.error();
  }
  return report;
}

int GoldenExitCode(const std::vector<GoldenCaseReport>& reports) {
  int code = 0;
  for (const auto& r : reports) {
    if (r.outcome == GoldenOutcome::kBroken) return 2;
    if (r.outcome == GoldenOutcome::kDrift) code = 1;
  }
  return code;
}

}  // namespace attest
