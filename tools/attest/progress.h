// Progress output of the long-running commands (`attest check`, `fuzz`, `audit`), one helper
// for all of them, on stderr so that stdout stays the report: on a terminal one line redrawn
// in place (carriage return, then ECMA-48 "erase in line", CSI K) with a bar; anywhere else
// (a CI log, a pipe) a plain line now and then — the first update, each tenth of the run, at
// most `interval_s` apart otherwise, and the last — so that a log shows the run is alive
// without a line per step.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

namespace attest::cli {

class ProgressLine {
 public:
  struct Options {
    std::string prefix;             // "check cpu/flash2-bf16", "fuzz cpu/flash2-bf16"
    std::FILE* stream = stderr;     // where lines go
    bool tty = false;               // redraw in place (see Detect)
    bool quiet = false;             // print nothing
    double interval_s = 5;          // longest gap between plain lines
    std::function<double()> clock;  // seconds since an epoch; unset: the steady clock
  };
  // Options for `stream` with `tty` set from isatty(3).
  static Options Detect(std::string prefix, bool quiet, std::FILE* stream = stderr);

  explicit ProgressLine(Options options);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // `done` of `total` steps (total < 0: unknown), with a status text ("12.3 cases/s, 0
  // failures"). `force` prints a plain line now (a phase change such as shrinking).
  void Update(int64_t done, int64_t total, std::string_view status, bool force = false);
  // Ends a redrawn line (a newline), so that what follows starts on its own line.
  void Finish();
  double Elapsed() const;

 private:
  Options opt_;
  double start_ = 0;
  double last_line_ = 0;
  int64_t last_tenth_ = -1;
  int64_t last_done_ = -1;
  bool printed_ = false;
  bool dirty_ = false;  // a redrawn line is open
};

}  // namespace attest::cli
