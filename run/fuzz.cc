// The fuzz engine (see fuzz.h).
#include "run/fuzz.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <set>

#include "kernels/exec/children.h"
#include "reference/golden/sha256.h"
#include "reference/names.h"
#include "reference/io/files.h"
#include "reference/io/json.h"
#include "verify/report/repro.h"
#include "verify/report/report.h"
#include "run/run.h"
#include "run/suite.h"

namespace attest {
namespace {

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

FuzzCheckStats& StatsFor(FuzzReport& r, std::string_view check) {
  for (auto& [name, stats] : r.per_check) {
    if (name == check) return stats;
  }
  r.per_check.emplace_back(std::string(check), FuzzCheckStats{});
  return r.per_check.back().second;
}

nlohmann::json SizeJson(const Case& c) {
  const Problem& p = c.problem;
  return {{"batch", p.batch},          {"heads_q", p.heads_q},   {"heads_kv", p.heads_kv},
          {"seqlen_q", p.seqlen_q},    {"seqlen_k", p.seqlen_k}, {"head_dim", p.head_dim},
          {"head_dim_v", p.head_dim_v}};
}

}  // namespace

Expected<std::vector<const CheckInfo*>> ResolveChecks(const std::vector<std::string>& names,
                                                      const Capabilities& caps) {
  std::vector<const CheckInfo*> out;
  if (names.empty()) return DrawnChecks(caps);
  std::vector<std::string> known;
  for (const CheckInfo& c : AllChecks()) known.emplace_back(c.name);
  for (const std::string& n : names) {
    const CheckInfo* c = FindCheck(n);
    if (c == nullptr) {
      return Error{fmt::format("--check: unknown check '{}'{} (see `attest list checks`)", n,
                               DidYouMean(n, known))};
    }
    out.push_back(c);
  }
  return out;
}

FuzzCase DrawFuzzCase(const Capabilities& caps, uint64_t seed, int64_t n,
                      const std::vector<const CheckInfo*>& checks, const DrawLimits& limits) {
  PhiloxPicker pick(MixSeed(seed, static_cast<uint64_t>(n)));
  FuzzCase f;
  f.check = pick.Element(checks);
  f.c = DrawCase(caps, pick, limits);
  if (f.check->name == "non-interference") DrawPaging(caps, pick, f.c.problem);
  return f;
}

Expected<CheckOutcome> RunCheckOnCase(Kernel& kernel, const std::string& kernel_spec, const Case& c,
                                      const CheckInfo& check, int oracle_threads) {
  RunOptions ro;
  ro.kernel_spec = kernel_spec;
  ro.oracle.threads = oracle_threads;
  const CheckInfo* one[] = {&check};
  auto r = RunCase(kernel, c, one, ro, "fuzz case");
  if (!r.ok()) return r.error();
  CheckOutcome out;
  out.applicable = !r->report.verdicts.empty();
  out.verdicts = static_cast<int64_t>(r->report.verdicts.size());
  out.verdict_digest = VerdictDigest(r->report.verdicts);
  for (Verdict& v : r->report.verdicts) {
    if (!v.pass) out.failing.push_back(std::move(v));
  }
  return out;
}

std::string VerdictDigest(const std::vector<Verdict>& verdicts) {
  std::string text;
  for (const Verdict& v : verdicts) {
    text += fmt::format("{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n", v.check, v.tensor, v.policy,
                        v.pass ? 1 : 0, v.observed, v.allowed, v.margin, v.message);
  }
  return Sha256Hex(text).substr(0, 16);
}

std::filesystem::path FuzzCasePath(const std::filesystem::path& dir, const std::string& check,
                                   const Case& c) {
  return dir / fmt::format("{}-{}.case.json", check, Sha256Hex(CaseToText(c)).substr(0, 12));
}

namespace {

// Differential mode: a failure the baseline shares is not the kernel's own.
bool BaselinePasses(const FuzzOptions& options, const CheckInfo& check, const Case& cand) {
  if (options.baseline == nullptr) return true;
  auto b = RunCheckOnCase(*options.baseline, options.baseline_spec, cand, check,
                          options.oracle_threads);
  return b.ok() && !b->failed();
}

// Shrinks the drawn case fc.c of failure f (f.shrunk and the shrink counts); returns the
// first failing verdict of the shrunk case, or `worst` when it no longer fails.
Verdict ShrinkFailure(Kernel& kernel, const FuzzOptions& options, const Capabilities& caps,
                      const FuzzCase& fc, const CheckOutcome& outcome,
                      std::chrono::steady_clock::time_point start, FuzzFailure& f,
                      Verdict worst) {
  // Never demand a larger margin than the drawn case has.
  double original_margin = 0;
  for (const Verdict& v : outcome.failing)
    original_margin = std::max(original_margin, v.margin);
  const double min_margin = std::min(options.shrink_min_margin, original_margin);
  // The --time budget covers shrinking: past it (or after a stop signal) every further
  // candidate counts as passing, so the best case so far is kept and saved, and the run
  // ends within its budget plus one kernel call instead of being killed reportless.
  auto fails = [&](const Case& cand) {
    if (StopSignal() != 0) {
      f.shrink_cut = "signal";
      return false;
    }
    if (options.seconds && Since(start) >= *options.seconds) {
      f.shrink_cut = "deadline";
      return false;
    }
    auto o =
        RunCheckOnCase(kernel, options.kernel_spec, cand, *fc.check, options.oracle_threads);
    if (!o.ok() || !o->failed()) return false;
    double margin = 0;
    for (const Verdict& v : o->failing) margin = std::max(margin, v.margin);
    return margin >= min_margin && BaselinePasses(options, *fc.check, cand);
  };
  ShrinkResult s = Shrink(fc.c, caps, fails, options.max_shrink_attempts);
  f.shrunk = s.c;
  f.shrink_steps = s.steps;
  f.shrink_attempts = s.attempts;
  auto final_o = RunCheckOnCase(kernel, options.kernel_spec, f.shrunk, *fc.check,
                                options.oracle_threads);
  if (final_o.ok() && final_o->failed()) worst = final_o->failing.front();
  return worst;
}

// Where failure f of case n can be had again: its shrunk case saved into --out and a repro
// of that file, or with no --out the fuzz command line that draws the case again.
Status RecordRepro(const FuzzOptions& options, int64_t n, FuzzFailure& f) {
  if (options.out_dir) {
    const auto path = FuzzCasePath(*options.out_dir, f.check, f.shrunk);
    if (Status s = SaveCase(path, f.shrunk); !s.ok()) return s;
    f.case_file = path;
    f.repro = ReproCommand(options.kernel_spec, path, f.check);
  } else {
    // No directory: the case is printed whole by the caller; the repro names the seed.
    f.repro = fmt::format("attest fuzz --kernel {} --seed {} --cases {} --shard {}/{}",
                          options.kernel_spec, options.seed, n + 1, options.shard_index,
                          options.shard_count);
    for (const std::string& c : options.checks) f.repro += " --check " + c;
    for (const std::string& g : options.limits.generators) f.repro += " --generator " + g;
    if (options.limits.max_seqlen != DrawLimits{}.max_seqlen) {
      f.repro += fmt::format(" --max-seqlen {}", options.limits.max_seqlen);
    }
    if (options.baseline) f.repro += " --baseline " + options.baseline_spec;
  }
  return {};
}

}  // namespace

Expected<FuzzReport> RunFuzz(Kernel& kernel, const FuzzOptions& options) {
  if (options.cases.has_value() == options.seconds.has_value()) {
    return Error{"give exactly one of --cases and --time"};
  }
  if (options.case_log && !options.out_dir) return Error{"--case-log needs --out DIR"};
  if (options.shard_count < 1 || options.shard_index < 0 ||
      options.shard_index >= options.shard_count) {
    return Error{fmt::format("--shard: {}/{} is not I/N with 0 <= I < N", options.shard_index,
                             options.shard_count)};
  }
  const Capabilities caps = kernel.capabilities();
  auto checks = ResolveChecks(options.checks, caps);
  if (!checks.ok()) return checks.error();
  const auto start = std::chrono::steady_clock::now();

  FuzzReport report;
  report.kernel = options.kernel_spec;
  report.baseline = options.baseline ? options.baseline_spec : "";
  report.seed = options.seed;
  report.shard_index = options.shard_index;
  report.shard_count = options.shard_count;
  report.cases_planned = options.cases;
  report.gpu = options.gpu;
  for (const CheckInfo* c : *checks) StatsFor(report, c->name);

  FuzzOptions::Progress progress;
  if (options.cases) {
    const int64_t total = *options.cases;
    progress.planned = std::max<int64_t>(
        0, (total - options.shard_index + options.shard_count - 1) / options.shard_count);
  }
  auto tick = [&](bool shrinking) {
    if (!options.progress) return;
    progress.seconds = Since(start);
    progress.failures = static_cast<int>(report.failures.size());
    progress.shrinking = shrinking;
    options.progress(progress);
  };

  // The output folder is this run's alone (a second run sharing it is refused now, not after
  // its first failure), and a file given as --out is refused before any case runs.
  std::optional<FolderLock> out_lock;
  if (options.out_dir) {
    auto lock = FolderLock::Acquire(*options.out_dir, "--out");
    if (!lock) return lock.error();
    out_lock.emplace(std::move(lock).value());
  }
  // A stop requested by a signal ends the loop; the case in progress is not counted (its
  // kernel processes were killed by the stop, not by a fault).
  auto interrupted = [&] {
    if (StopSignal() == 0) return false;
    report.interrupted = StopSignalName();
    return true;
  };

  std::string case_log;  // fuzz-cases.jsonl, written with the report
  int64_t n = options.shard_index;
  for (;; n += options.shard_count) {
    if (interrupted()) break;
    if (options.cases && n >= *options.cases) break;
    if (options.seconds && Since(start) >= *options.seconds) break;
    if (static_cast<int>(report.failures.size()) >= options.max_failures) break;
    const auto t0 = std::chrono::steady_clock::now();
    FuzzCase fc = DrawFuzzCase(caps, options.seed, n, *checks, options.limits);
    FuzzCheckStats& stats = StatsFor(report, fc.check->name);
    ++stats.cases;
    auto outcome =
        RunCheckOnCase(kernel, options.kernel_spec, fc.c, *fc.check, options.oracle_threads);
    if (interrupted()) {
      --stats.cases;
      break;
    }
    if (!outcome.ok()) {
      return Error{fmt::format("case {} ({}: {}): {}", n, fc.check->name,
                               DescribeProblem(fc.c.problem), outcome.error().message)};
    }
    if (outcome->applicable) ++stats.judged;
    if (options.case_log) {
      case_log += nlohmann::json{{"index", n},
                                 {"check", fc.check->name},
                                 {"case", Sha256Hex(CaseToText(fc.c)).substr(0, 16)},
                                 {"verdicts", outcome->verdicts},
                                 {"failing", outcome->failing.size()},
                                 {"digest", outcome->verdict_digest}}
                      .dump() +
                  "\n";
    }
    bool counts = outcome->failed();
    if (counts && !BaselinePasses(options, *fc.check, fc.c)) {
      ++stats.baseline_failures;
      counts = false;
    }
    if (counts) {
      ++stats.failures;
      FuzzFailure f;
      f.case_index = n;
      f.check = std::string(fc.check->name);
      f.original = fc.c;
      f.shrunk = fc.c;
      Verdict worst = outcome->failing.front();
      if (options.shrink) {
        tick(true);
        worst = ShrinkFailure(kernel, options, caps, fc, *outcome, start, f, std::move(worst));
      }
      f.tensor = worst.tensor;
      f.message = worst.message;
      f.margin = worst.margin;
      if (Status s = RecordRepro(options, n, f); !s.ok()) return s.error();
      report.failures.push_back(std::move(f));
    }
    stats.seconds += Since(t0);
    ++report.cases_run;
    ++progress.done;
    tick(false);
  }
  report.next_index = n;
  report.seconds = Since(start);
  if (options.out_dir) {
    if (options.case_log) {
      if (Status s = WriteTextFile(*options.out_dir / kFuzzCaseLogFile, case_log); !s.ok())
        return s.error();
    }
    if (Status s =
            WriteTextFile(*options.out_dir / kFuzzReportFile, report.ToJson().dump(2) + "\n");
        !s.ok()) {
      return s.error();
    }
  }
  return report;
}

nlohmann::json FuzzReport::ToJson(bool with_timings) const {
  nlohmann::json j;
  j["kernel"] = kernel;
  if (!baseline.empty()) j["baseline"] = baseline;
  j["seed"] = seed;
  j["shard"] = {shard_index, shard_count};
  j["cases_planned"] = cases_planned ? nlohmann::json(*cases_planned) : nlohmann::json(nullptr);
  j["cases_run"] = cases_run;
  j["next_index"] = next_index;
  nlohmann::json checks = nlohmann::json::object();
  for (const auto& [name, s] : per_check) {
    nlohmann::json c = {{"cases", s.cases},
                        {"judged", s.judged},
                        {"failures", s.failures},
                        {"baseline_failures", s.baseline_failures}};
    if (with_timings) c["seconds"] = s.seconds;
    checks[name] = c;
  }
  j["checks"] = checks;
  j["failures"] = nlohmann::json::array();
  for (const FuzzFailure& f : failures) {
    nlohmann::json fj = {
        {"case_index", f.case_index},
        {"check", f.check},
        {"tensor", f.tensor},
        {"message", f.message},
        {"margin", std::isfinite(f.margin) ? nlohmann::json(f.margin) : nlohmann::json("inf")},
        {"generator", f.original.generator ? f.original.generator->name : ""},
        {"original", DescribeProblem(f.original.problem)},
        {"original_size", SizeJson(f.original)},
        {"shrunk_size", SizeJson(f.shrunk)},
        {"shrink_steps", f.shrink_steps},
        {"shrink_attempts", f.shrink_attempts},
        {"shrink_cut", f.shrink_cut.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.shrink_cut)},
        {"case_file",
         f.case_file ? nlohmann::json(f.case_file->filename().string()) : nlohmann::json(nullptr)},
        {"repro", f.repro}};
    j["failures"].push_back(fj);
  }
  if (with_timings) j["seconds"] = seconds;
  j["interrupted"] = interrupted.empty() ? nlohmann::json(nullptr) : nlohmann::json(interrupted);
  if (!gpu.is_null()) j["gpu"] = gpu;
  return j;
}

namespace {

Expected<nlohmann::json> MergeReports(const std::vector<std::filesystem::path>& dirs) {
  if (dirs.empty()) return Error{"--merge: give at least one directory"};
  nlohmann::json merged;
  std::set<int64_t> seen;
  std::map<std::string, nlohmann::json> checks;
  std::vector<std::string> check_order;
  nlohmann::json failures = nlohmann::json::array();
  int64_t cases_run = 0;
  double seconds = 0;
  for (const auto& dir : dirs) {
    const auto path = dir / kFuzzReportFile;
    ReadLimits limits;
    limits.max_bytes = uint64_t{256} << 20;
    limits.what = "fuzz report";
    auto text = ReadRegularFile(path.string(), limits);
    if (!text) {
      return Error{fmt::format("{} (is {} a fuzz --out directory?)", text.error().message,
                               dir.string())};
    }
    auto parsed = ParseJson(*text, path.string());
    if (!parsed) return parsed.error();
    nlohmann::json j = std::move(parsed).value();
    for (const char* key : {"kernel", "seed", "shard", "cases_run", "checks", "failures"}) {
      if (!j.contains(key))
        return Error{fmt::format("{}: missing field \"{}\"", path.string(), key)};
    }
    const int64_t index = j["shard"][0].get<int64_t>();
    const int64_t count = j["shard"][1].get<int64_t>();
    if (merged.empty()) {
      merged["kernel"] = j["kernel"];
      merged["seed"] = j["seed"];
      merged["shard_count"] = count;
      merged["cases_planned"] = j.value("cases_planned", nlohmann::json(nullptr));
    } else {
      for (const char* key : {"kernel", "seed"}) {
        if (j[key] != merged[key]) {
          return Error{fmt::format("{}: {} {} differs from {} in the first report", path.string(),
                                   key, JsonExcerpt(j[key]), JsonExcerpt(merged[key]))};
        }
      }
      if (count != merged["shard_count"].get<int64_t>()) {
        return Error{fmt::format("{}: shard count {} differs from {}", path.string(), count,
                                 merged["shard_count"].get<int64_t>())};
      }
      if (j.value("cases_planned", nlohmann::json(nullptr)) != merged["cases_planned"]) {
        return Error{fmt::format("{}: --cases differs from the first report", path.string())};
      }
    }
    if (!seen.insert(index).second) {
      return Error{fmt::format("{}: shard {}/{} given twice", path.string(), index, count)};
    }
    if (j.contains("interrupted") && j["interrupted"].is_string()) {
      merged["interrupted_shards"].push_back(index);
    }
    cases_run += j["cases_run"].get<int64_t>();
    seconds += j.value("seconds", 0.0);
    for (const auto& [name, c] : j["checks"].items()) {
      if (!checks.count(name)) {
        check_order.push_back(name);
        checks[name] = {{"cases", 0}, {"judged", 0}, {"failures", 0}, {"baseline_failures", 0}};
      }
      for (const char* key : {"cases", "judged", "failures", "baseline_failures"}) {
        checks[name][key] = checks[name][key].get<int64_t>() + c.value(key, int64_t{0});
      }
    }
    for (auto f : j["failures"]) {
      f["shard"] = index;
      if (f.contains("case_file") && f["case_file"].is_string()) {
        f["case_file"] = (dir / f["case_file"].get<std::string>()).string();
      }
      failures.push_back(f);
    }
  }
  std::sort(failures.begin(), failures.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return a["case_index"].get<int64_t>() < b["case_index"].get<int64_t>();
  });
  merged["shards"] = seen;
  nlohmann::json missing = nlohmann::json::array();
  for (int64_t i = 0; i < merged["shard_count"].get<int64_t>(); ++i) {
    if (!seen.count(i)) missing.push_back(i);
  }
  merged["missing_shards"] = missing;
  merged["cases_run"] = cases_run;
  nlohmann::json cj = nlohmann::json::object();
  for (const auto& name : check_order) cj[name] = checks[name];
  merged["checks"] = cj;
  merged["failures"] = failures;
  merged["seconds"] = seconds;
  return merged;
}

}  // namespace

Expected<nlohmann::json> MergeFuzzReports(const std::vector<std::filesystem::path>& dirs) {
  // A report is a file anyone could have edited: a field of the wrong type is an Error naming
  // the problem, not an exception out of the merge.
  try {
    return MergeReports(dirs);
  } catch (const nlohmann::json::exception& e) {
    return Error{fmt::format("--merge: malformed fuzz report: {}", e.what())};
  }
}

Expected<std::optional<std::string>> MergeFuzzCaseLogs(
    const std::vector<std::filesystem::path>& dirs) {
  std::map<int64_t, std::string> lines;
  size_t with_log = 0;
  for (const auto& dir : dirs) {
    const auto path = dir / kFuzzCaseLogFile;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) continue;
    ++with_log;
    ReadLimits limits;
    limits.max_bytes = uint64_t{1} << 30;
    limits.what = "fuzz case log";
    auto text = ReadRegularFile(path.string(), limits);
    if (!text) return text.error();
    size_t start = 0, number = 0;
    while (start < text->size()) {
      size_t end = text->find('\n', start);
      if (end == std::string::npos) end = text->size();
      const std::string line = text->substr(start, end - start);
      start = end + 1;
      ++number;
      int64_t index = -1;
      try {
        index = nlohmann::json::parse(line).at("index").get<int64_t>();
      } catch (const nlohmann::json::exception& e) {
        return Error{fmt::format("{}:{}: not a case-log line: {}", path.string(), number,
                                 e.what())};
      }
      if (!lines.emplace(index, line).second) {
        return Error{fmt::format("{}:{}: case {} is in another shard's log too", path.string(),
                                 number, index)};
      }
    }
  }
  if (with_log == 0) return std::optional<std::string>{};
  if (with_log != dirs.size()) {
    return Error{fmt::format("--merge: {} of {} shard directories have a {} (run every shard "
                             "with --case-log, or none)",
                             with_log, dirs.size(), kFuzzCaseLogFile)};
  }
  std::string out;
  for (const auto& [index, line] : lines) out += line + "\n";
  return std::optional<std::string>(std::move(out));
}

}  // namespace attest
