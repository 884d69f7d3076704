// `attest inspect FILE.safetensors [--json]`: what a safetensors file holds (format:
// huggingface/safetensors README; reader: reference/io/safetensors.h). Prints each tensor's
// name, dtype, shape and byte range, and the metadata; only the header is read, but it is
// validated against the file's size, so a file inspect accepts is one ReadSafetensors reads.
// A malformed or missing file exits 2 with the reader's message.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "reference/io/safetensors.h"
#include "tools/attest/command.h"

namespace attest::cli {
namespace {

struct InspectOptions {
  std::string file;
  bool json = false;
};

// A name as typed, or JSON-quoted when it holds spaces, quotes or control characters (so
// that every printed name is unambiguous).
std::string Printable(const std::string& name) {
  const bool plain = !name.empty() && std::none_of(name.begin(), name.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u <= 0x20 || u == 0x7F || c == '"' || c == '\\';
  });
  return plain ? name : nlohmann::json(name).dump();
}

nlohmann::json ToJson(const std::string& file, const SafetensorsHeader& h) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& e : h.entries) {
    tensors.push_back({{"name", e.name},
                       {"dtype", Name(e.dtype)},
                       {"safetensors_dtype", Info(e.dtype).safetensors},
                       {"shape", e.shape},
                       {"data_offsets", {e.begin, e.end}},
                       {"file_offsets", {h.data_start() + e.begin, h.data_start() + e.end}}});
  }
  return {{"file", file},
          {"header_bytes", h.header_bytes},
          {"data_bytes", h.data_bytes},
          {"tensors", tensors},
          {"metadata", h.metadata}};
}

void PrintText(const std::string& file, const SafetensorsHeader& h) {
  std::cout << fmt::format("{}: {} tensor{}, header {} bytes, data {} bytes (from byte {})\n", file,
                           h.entries.size(), h.entries.size() == 1 ? "" : "s", h.header_bytes,
                           h.data_bytes, h.data_start());
  size_t width = 4;
  for (const auto& e : h.entries) width = std::max(width, Printable(e.name).size());
  for (const auto& e : h.entries) {
    const std::string shape = fmt::format("[{}]", fmt::join(e.shape, ", "));
    std::cout << fmt::format("  {:<{}}  {:<7}  {:<20}  data [{}, {})  file [{}, {})\n",
                             Printable(e.name), width, Name(e.dtype), shape, e.begin, e.end,
                             h.data_start() + e.begin, h.data_start() + e.end);
  }
  if (!h.metadata.empty()) {
    std::cout << "metadata:\n";
    for (const auto& [key, value] : h.metadata) {
      std::cout << "  " << Printable(key) << ": " << nlohmann::json(value).dump() << "\n";
    }
  }
}

int RunInspect(const InspectOptions& opt) {
  auto header = ReadSafetensorsHeader(opt.file);
  if (!header.ok()) throw UsageError(header.error().message);
  if (opt.json) {
    std::cout << ToJson(opt.file, *header).dump(2) << "\n";
  } else {
    PrintText(opt.file, *header);
  }
  return kExitPass;
}

Runner SetupInspect(CLI::App& sub) {
  auto opt = std::make_shared<InspectOptions>();
  sub.add_option("file", opt->file, "safetensors file")->required();
  sub.add_flag("--json", opt->json, "Print JSON");
  return [opt] { return RunInspect(*opt); };
}

}  // namespace

ATTEST_COMMAND("inspect",
               "Show the tensors, dtypes, shapes and byte ranges of a safetensors "
               "file",
               90, SetupInspect);

}  // namespace attest::cli
