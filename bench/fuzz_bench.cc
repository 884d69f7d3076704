// Fuzz throughput (docs/fuzz.md): cases/s of `attest fuzz` per kernel and check family,
// with shrinking counted (a failing case is shrunk and saved as the CLI does, and the run goes
// on). The goal: >= 50 cases/s for cpu/flash2-bf16 on shapes with S <= 256.
//
//   fuzz_bench [--cases N] [--max-seqlen S] [--seed S] [kernel...]
//
// Prints a markdown table: wall and CPU seconds (getrusage, all threads: meaningful when other
// work shares the machine), cases/s from each, failures found. Single-threaded oracle, as
// `attest fuzz` runs it.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/builtin.h"
#include "run/fuzz.h"

namespace {

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t cases = 100;
  int64_t max_seqlen = 256;
  uint64_t seed = 1;
  std::vector<std::string> kernels;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--cases") {
      cases = std::atoll(next().c_str());
    } else if (a == "--max-seqlen") {
      max_seqlen = std::atoll(next().c_str());
    } else if (a == "--seed") {
      seed = std::strtoull(next().c_str(), nullptr, 10);
    } else {
      kernels.push_back(a);
    }
  }
  if (kernels.empty()) kernels = {"cpu/flash2-bf16", "cpu/mxfp8-cudnn", "mutant/causal-top-left"};
  std::printf("fuzz throughput: %lld cases per row, S <= %lld, seed %llu, shrinking counted\n\n",
              static_cast<long long>(cases), static_cast<long long>(max_seqlen),
              static_cast<unsigned long long>(seed));
  std::printf(
      "| kernel | check family | cases | failures | wall s | cases/s (wall) | CPU s | "
      "cases/s (CPU) |\n|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (const std::string& spec : kernels) {
    auto kernel = attest::Kernels().Create(spec);
    if (!kernel.ok()) {
      std::fprintf(stderr, "%s\n", kernel.error().message.c_str());
      return 2;
    }
    std::vector<std::string> families = {""};  // "" = every check, drawn per case
    for (const attest::CheckInfo& c : attest::AllChecks()) families.emplace_back(c.name);
    for (const std::string& family : families) {
      attest::FuzzOptions o;
      o.kernel_spec = spec;
      o.seed = seed;
      o.cases = cases;
      o.max_failures = static_cast<int>(cases);
      o.limits.max_seqlen = max_seqlen;
      if (!family.empty()) o.checks = {family};
      const double cpu0 = CpuSeconds();
      const auto t0 = std::chrono::steady_clock::now();
      auto r = attest::RunFuzz(**kernel, o);
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double cpu = CpuSeconds() - cpu0;
      if (!r.ok()) {
        std::fprintf(stderr, "%s %s: %s\n", spec.c_str(), family.c_str(),
                     r.error().message.c_str());
        return 2;
      }
      std::printf("| %s | %s | %lld | %zu | %.2f | %.1f | %.2f | %.1f |\n", spec.c_str(),
                  family.empty() ? "all (drawn)" : family.c_str(),
                  static_cast<long long>(r->cases_run), r->failures.size(), wall,
                  static_cast<double>(r->cases_run) / wall, cpu,
                  static_cast<double>(r->cases_run) / cpu);
      std::fflush(stdout);
    }
  }
  return 0;
}
