// Repro command lines (see repro.h).
#include "verify/report/repro.h"

#include <fmt/format.h>

#include "reference/golden/sha256.h"

namespace attest {

std::string ShellQuote(std::string_view s) {
  if (!s.empty() && s.find_first_of(" \t\n'\"$`\\;&|<>()*?[]#~!{}") == std::string_view::npos) {
    return std::string(s);
  }
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string ReproCommand(std::string_view kernel, const std::filesystem::path& case_file,
                         std::string_view check) {
  std::string line = fmt::format("attest repro --kernel {} --case {}", ShellQuote(kernel),
                                 ShellQuote(case_file.string()));
  if (!check.empty()) line += " --check " + ShellQuote(check);
  return line;
}

std::string PendingReproCommand(std::string_view kernel, std::string_view case_label,
                                std::string_view check) {
  return fmt::format("attest repro --kernel {} --case {} --check {}", ShellQuote(kernel),
                     ShellQuote(case_label), ShellQuote(check));
}

namespace {

std::string Sanitize(std::string_view s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  return out.substr(0, 80);
}

}  // namespace

std::string FailureCaseFileName(std::string_view case_text, std::string_view kernel,
                                std::string_view check, std::string_view tensor) {
  const uint64_t hash = ContentHash64(case_text);
  return fmt::format("{}-{}-{}-{:08x}.case.json", Sanitize(kernel), Sanitize(check),
                     Sanitize(tensor.empty() ? "all" : tensor), static_cast<uint32_t>(hash >> 32));
}

std::string CheckCommand(std::string_view kernel, std::string_view suite, uint64_t seed) {
  return fmt::format("attest check --kernel {} --suite {} --seed {}", ShellQuote(kernel),
                     ShellQuote(suite), seed);
}

std::string AuditCommand(std::string_view kernel, uint64_t seed) {
  return fmt::format("attest audit --kernel {} --seed {}", ShellQuote(kernel), seed);
}

}  // namespace attest
