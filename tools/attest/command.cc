// The subcommand list and the strict numeric options (see command.h).
#include "tools/attest/command.h"

#include <charconv>
#include <iostream>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace attest::cli {

std::vector<CommandInfo>& Commands() {
  static std::vector<CommandInfo> commands;
  return commands;
}

namespace {

template <class T>
Expected<T> ParseWhole(std::string_view text, T min, T max) {
  if (text.empty()) return Error{"expected a number, got an empty value"};
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range) {
    return Error{fmt::format("'{}' is out of range [{}, {}]", text, min, max)};
  }
  if (ec != std::errc() || ptr != end) {
    return Error{fmt::format("'{}' is not {}", text,
                             std::is_unsigned_v<T> ? "a non-negative integer" : "an integer")};
  }
  if (value < min || value > max) {
    return Error{fmt::format("'{}' is out of range [{}, {}]", text, min, max)};
  }
  return value;
}

template <class T>
CLI::Option* AddStrict(CLI::App& app, const std::string& name, T& target, T min, T max,
                       const std::string& help) {
  return app.add_option_function<std::string>(
      name,
      [&target, name, min, max](const std::string& text) {
        auto v = ParseWhole<T>(text, min, max);
        if (!v) throw CLI::ValidationError(name, v.error().message);
        target = *v;
      },
      help);
}

}  // namespace

Expected<int64_t> ParseInteger(std::string_view text, int64_t min, int64_t max) {
  return ParseWhole<int64_t>(text, min, max);
}

CLI::Option* AddUnsignedOption(CLI::App& app, const std::string& name, uint64_t& target,
                               const std::string& help) {
  return AddStrict<uint64_t>(app, name, target, 0, std::numeric_limits<uint64_t>::max(), help);
}

CLI::Option* AddIntegerOption(CLI::App& app, const std::string& name, int64_t& target,
                              int64_t min, int64_t max, const std::string& help) {
  return AddStrict<int64_t>(app, name, target, min, max, help);
}

CLI::Option* AddIntegerOption(CLI::App& app, const std::string& name, int& target, int min,
                              int max, const std::string& help) {
  return AddStrict<int>(app, name, target, min, max, help);
}

CLI::Option* AddSecondsOption(CLI::App& app, const std::string& name, double& target,
                              const std::string& help) {
  return app.add_option_function<std::string>(
      name,
      [&target, name](const std::string& text) {
        double v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(v) || !(v > 0)) {
          throw CLI::ValidationError(
              name, fmt::format("'{}' is not a number of seconds > 0 (e.g. 30, 0.5)", text));
        }
        target = v;
      },
      help);
}

void AddGpuOption(CLI::App& app, std::string& target) {
  app.add_option("--gpu", target,
                 "auto: a process a job launcher started as one of several on a node "
                 "(LOCAL_RANK, SLURM_LOCALID, ...) takes the visible GPU local_rank mod count "
                 "(docs/fuzz.md \"Campaigns across GPUs\"); keep: leave CUDA_VISIBLE_DEVICES "
                 "as it is")
      ->check(CLI::IsMember({"auto", "keep"}))
      ->capture_default_str();
}

std::optional<GpuChoice> ApplyGpuOption(const std::string& mode, bool quiet,
                                        std::string_view command) {
  if (mode != "auto") return std::nullopt;
  auto choice = ApplyLauncherGpu();
  if (!choice) throw UsageError("--gpu auto: " + choice.error().message);
  if (choice->has_value() && !quiet) {
    const GpuChoice& c = **choice;
    std::string visible;
    for (const auto& v : c.visible) visible += (visible.empty() ? "" : ",") + v;
    std::cerr << fmt::format("attest {}: {}={} of {} GPUs ({} {}): GPU {}\n", command,
                             c.rank_source, c.local_rank, c.visible.size(), c.visible_source,
                             visible, c.chosen);
  }
  return *choice;
}

}  // namespace attest::cli
