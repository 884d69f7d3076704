// `attest list [kernels|checks|suites|recipes|profiles|formats|schemes] [--json]`: what attest
// knows. The JSON form of `kernels` is an array of {name, description, capabilities}, where
// capabilities is the exec protocol's `capabilities` object (docs/design.md).
// `attest list suites --coverage --kernel K [--suite S]`: which claimed feature pairs and
// length boundaries each suite reaches for kernel K (run/suite_coverage.h).
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "reference/formats/format.h"
#include "reference/formats/quantize.h"
#include "reference/recipes/recipe.h"
#include "reference/recipes/recipe_json.h"
#include "run/check_run.h"
#include "tools/attest/command.h"
#include "verify/checks/check.h"
#include "run/suite_coverage.h"
#include "run/suite.h"
#include "verify/tolerance/tolerance.h"

namespace attest::cli {
namespace {

struct ListOptions {
  std::string what = "kernels";
  bool json = false;
  bool coverage = false;
  bool verbose = false;  // -v: whole descriptions (else one line each, cut at the terminal's 100)
  std::string kernel;
  std::string suite;
  uint64_t seed = 0;
};

int ListCoverage(const ListOptions& opt) {
  if (opt.what != "suites") throw UsageError("--coverage: only with `attest list suites`");
  if (opt.kernel.empty()) throw UsageError("--coverage: needs --kernel K");
  auto kernel = Kernels().Create(opt.kernel);
  if (!kernel.ok()) throw UsageError(kernel.error().message);
  if (!opt.suite.empty()) SuiteNamed(opt.suite, "--suite");
  const Capabilities caps = (*kernel)->capabilities();
  nlohmann::json all = nlohmann::json::array();
  for (const Suite& s : AllSuites()) {
    if (!opt.suite.empty() && s.name != opt.suite) continue;
    const SuiteCoverage c = CoverageOf(s, caps, opt.seed);
    if (opt.json) {
      nlohmann::json j = CoverageToJson(c);
      j["kernel"] = opt.kernel;
      all.push_back(std::move(j));
    } else {
      std::cout << "suite " << CoverageToText(c) << "\n";
    }
  }
  if (opt.json) std::cout << all.dump(2) << "\n";
  return kExitPass;
}

nlohmann::json ListKernels() {
  nlohmann::json out = nlohmann::json::array();
  const KernelRegistry& registry = Kernels();
  for (const auto& name : registry.Names()) {
    auto kernel = registry.Create(name);
    if (!kernel.ok()) throw UsageError(kernel.error().message);
    out.push_back({{"name", name},
                   {"description", registry.Description(name)},
                   {"capabilities", CapabilitiesToJson((*kernel)->capabilities())}});
  }
  return out;
}

nlohmann::json ListChecks() {
  nlohmann::json out = nlohmann::json::array();
  for (const CheckInfo& c : AllChecks()) {
    out.push_back({{"name", c.name}, {"description", c.description}});
  }
  return out;
}

nlohmann::json ListSuites() {
  nlohmann::json out = nlohmann::json::array();
  for (const Suite& s : AllSuites()) {
    out.push_back({{"name", s.name}, {"description", s.description}, {"rows", s.rows.size()}});
  }
  return out;
}

// Every built-in recipe in the schema a kernel declares one in (recipe_json.h).
nlohmann::json ListRecipes() {
  nlohmann::json out = nlohmann::json::array();
  for (const Recipe& r : AllRecipes()) out.push_back(RecipeToJson(r));
  return out;
}

nlohmann::json ListFormats() {
  nlohmann::json out = nlohmann::json::array();
  for (const FormatSpec& f : AllFormats()) {
    const auto dtype = DTypeOf(f.format);
    out.push_back({{"name", f.name},
                   {"description", fmt::format("{} bits: {} exponent, {} mantissa, bias {}",
                                               f.bits(), f.exponent_bits, f.mantissa_bits,
                                               f.bias)},
                   {"safetensors", dtype ? std::string(Info(*dtype).safetensors) : "U8"},
                   {"max", MaxFinite(f.format)}});
  }
  return out;
}

nlohmann::json ListSchemes() {
  nlohmann::json out = nlohmann::json::array();
  for (const Scheme& s : AllSchemes()) {
    out.push_back({{"name", s.name}, {"description", s.description}});
  }
  return out;
}

int RunList(const ListOptions& opt) {
  if (opt.coverage) return ListCoverage(opt);
  if (!opt.kernel.empty() || !opt.suite.empty()) {
    throw UsageError("--kernel, --suite: only with --coverage");
  }
  nlohmann::json items;
  if (opt.what == "kernels") items = ListKernels();
  if (opt.what == "checks") items = ListChecks();
  if (opt.what == "suites") items = ListSuites();
  if (opt.what == "recipes") items = ListRecipes();
  if (opt.what == "profiles") items = ProfilesToJson();
  if (opt.what == "formats") items = ListFormats();
  if (opt.what == "schemes") items = ListSchemes();
  if (opt.json) {
    std::cout << items.dump(2) << "\n";
    return kExitPass;
  }
  if (items.empty()) std::cout << "(no " << opt.what << ")\n";
  constexpr size_t kLine = 100;  // one line per item unless -v
  for (const auto& item : items) {
    const std::string name = item["name"].get<std::string>();
    std::string line = name;
    std::string text;
    if (item.contains("description")) text = item["description"].get<std::string>();
    if (text.empty() && item.contains("summary")) text = item["summary"].get<std::string>();
    if (!text.empty()) line += std::string(name.size() < 28 ? 28 - name.size() : 2, ' ') + text;
    if (!opt.verbose && line.size() > kLine) line = line.substr(0, kLine - 3) + "...";
    std::cout << line << "\n";
  }
  if (opt.what == "kernels") {
    // The kernels no list can hold: a user's own, in the forms --kernel takes.
    std::cout << "\nYour own kernels (--kernel):\n"
                 "  plugin:LIB.so[:NAME]        a C ABI plugin (docs/plugins.md)\n"
                 "  exec:COMMAND                a worker process speaking the exec protocol "
                 "(docs/protocol.md)\n"
                 "  recipe:FILE.json            a declared low-precision recipe run as a CPU model\n"
                 "  Python: attest.check(fn, api=...) in process (docs/python.md, docs/byok.md)\n";
    if (!opt.verbose) std::cout << "(-v: whole descriptions)\n";
  }
  return kExitPass;
}

Runner SetupList(CLI::App& sub) {
  auto opt = std::make_shared<ListOptions>();
  sub.add_option("what", opt->what, "What to list (default: kernels)")
      ->check(CLI::IsMember(
          {"kernels", "checks", "suites", "recipes", "profiles", "formats", "schemes"}));
  sub.add_flag("--json", opt->json, "Print JSON");
  sub.add_flag("-v,--verbose", opt->verbose, "Whole descriptions (else one line each)");
  sub.add_flag("--coverage", opt->coverage,
               "With `suites`: the claimed feature pairs and length boundaries each suite "
               "reaches for --kernel");
  sub.add_option("--kernel", opt->kernel, "Kernel whose capabilities --coverage measures");
  sub.add_option("--suite", opt->suite, "Only this suite (with --coverage)");
  sub.add_option("--seed", opt->seed, "Run seed of the fuzz tail (with --coverage)");
  return [opt] { return RunList(*opt); };
}

}  // namespace

ATTEST_COMMAND("list", "List kernels, checks, suites, recipes, profiles, formats or schemes",
               10, SetupList);

}  // namespace attest::cli
