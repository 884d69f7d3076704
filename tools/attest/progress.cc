// The progress line of long-running commands (see progress.h).
#include "tools/attest/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

namespace attest::cli {
namespace {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

ProgressLine::Options ProgressLine::Detect(std::string prefix, bool quiet, std::FILE* stream) {
  Options o;
  o.prefix = std::move(prefix);
  o.stream = stream;
  o.tty = isatty(fileno(stream)) != 0;
  o.quiet = quiet;
  return o;
}

ProgressLine::ProgressLine(Options options) : opt_(std::move(options)) {
  if (!opt_.clock) opt_.clock = SteadySeconds;
  start_ = opt_.clock();
}

ProgressLine::~ProgressLine() { Finish(); }

double ProgressLine::Elapsed() const { return opt_.clock() - start_; }

void ProgressLine::Update(int64_t done, int64_t total, std::string_view status, bool force) {
  if (opt_.quiet) return;
  const double now = Elapsed();
  const std::string count =
      total >= 0 ? fmt::format("{}/{}", done, total) : fmt::format("{}", done);
  if (opt_.tty) {
    // 1. The bar, when the total is known.
    std::string bar;
    if (total > 0) {
      constexpr int64_t kWidth = 30;
      const int64_t filled = std::clamp<int64_t>(kWidth * done / total, 0, kWidth);
      bar = fmt::format("[{}{}] ", std::string(static_cast<size_t>(filled), '#'),
                        std::string(static_cast<size_t>(kWidth - filled), '.'));
    }
    // 2. The status cut to what a terminal line holds.
    constexpr size_t kStatus = 60;
    std::string text(status.substr(0, kStatus));
    if (status.size() > kStatus) text += "...";
    fmt::print(opt_.stream, "\r{} {}{} {}  {:.0f} s\x1b[K", opt_.prefix, bar, count, text, now);
    std::fflush(opt_.stream);
    dirty_ = true;
    return;
  }
  // A plain line on the first update, a new tenth, the last step, or after the interval.
  const int64_t tenth = total > 0 ? 10 * done / total : -1;
  const bool last = total >= 0 && done == total && last_done_ != done;
  const bool due = force || !printed_ || last || (total > 0 && tenth > last_tenth_) ||
                   now - last_line_ >= opt_.interval_s;
  if (!due) return;
  fmt::print(opt_.stream, "[{}] {}: {} ({:.0f} s)\n", count, opt_.prefix, status, now);
  std::fflush(opt_.stream);
  printed_ = true;
  last_line_ = now;
  last_tenth_ = std::max(last_tenth_, tenth);
  last_done_ = done;
}

void ProgressLine::Finish() {
  if (dirty_) {
    std::fputc('\n', opt_.stream);
    std::fflush(opt_.stream);
  }
  dirty_ = false;
}

}  // namespace attest::cli
