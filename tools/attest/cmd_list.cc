// `attest list [kernels|checks|suites|recipes|profiles|formats] [--json]`: what attest knows.
// The JSON form of `kernels` is an array of {name, description, capabilities}, where
// capabilities is the exec protocol's `capabilities` object (DESIGN.md).
#include <iostream>

#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "reference/dtype.h"
#include "tools/attest/command.h"

namespace attest::cli {
namespace {

struct ListOptions {
  std::string what = "kernels";
  bool json = false;
};

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

nlohmann::json ListFormats() {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& info : AllDTypes()) {
    out.push_back({{"name", info.name},
                   {"safetensors", info.safetensors},
                   {"bytes", info.size},
                   {"float", info.is_float}});
  }
  return out;
}

int RunList(const ListOptions& opt) {
  nlohmann::json items;
  if (opt.what == "kernels") {
    items = ListKernels();
  } else if (opt.what == "formats") {
    items = ListFormats();
  } else {
    // checks, suites, recipes, profiles: registries that later layers fill.
    items = nlohmann::json::array();
  }
  if (opt.json) {
    std::cout << items.dump(2) << "\n";
    return kExitPass;
  }
  if (items.empty()) std::cout << "(no " << opt.what << ")\n";
  for (const auto& item : items) {
    std::cout << item["name"].get<std::string>();
    if (item.contains("description")) std::cout << "  " << item["description"].get<std::string>();
    std::cout << "\n";
  }
  return kExitPass;
}

Runner SetupList(CLI::App& sub) {
  auto opt = std::make_shared<ListOptions>();
  sub.add_option("what", opt->what, "What to list")
      ->check(CLI::IsMember({"kernels", "checks", "suites", "recipes", "profiles", "formats"}));
  sub.add_flag("--json", opt->json, "Print JSON");
  return [opt] { return RunList(*opt); };
}

}  // namespace

ATTEST_COMMAND("list", "List kernels, checks, suites, recipes, profiles or formats", 10,
               SetupList);

}  // namespace attest::cli
