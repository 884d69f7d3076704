// Tests of tools/attest/progress.h: on a non-terminal a plain line on the first update, at
// each tenth of the run, after the interval and at the end, and no more; on a terminal one
// redrawn line with a bar ended by Finish; nothing at all when quiet.
#include "tools/attest/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace attest::cli {
namespace {

// What `run` printed through a ProgressLine on an in-memory stream, with the clock at `*now`.
template <class Run>
std::string Capture(bool tty, bool quiet, double* now, Run&& run) {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  {
    ProgressLine::Options o;
    o.prefix = "check k";
    o.stream = f;
    o.tty = tty;
    o.quiet = quiet;
    o.clock = [now] { return *now; };
    ProgressLine line(o);
    run(line);
  }
  std::fclose(f);
  std::string out(buf, size);
  std::free(buf);
  return out;
}

int Lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(Progress, PlainLinesAtTenthsAndIntervalsOnly) {
  double now = 0;
  const std::string out = Capture(false, false, &now, [&](ProgressLine& p) {
    for (int i = 0; i <= 700; ++i) p.Update(i, 700, "rows");  // fast: no interval passes
  });
  // The first update, ten tenths (the last is the end): 11 lines, not 701.
  EXPECT_EQ(Lines(out), 11) << out;
  EXPECT_EQ(out.rfind("[0/700] check k: rows (0 s)\n", 0), 0u) << out;
  EXPECT_NE(out.find("[70/700] check k: rows (0 s)\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[700/700] check k: rows (0 s)\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("\r"), std::string::npos);
  // A slow step prints after the interval although no tenth passed; a forced line prints.
  const std::string slow = Capture(false, false, &now, [&](ProgressLine& p) {
    now = 0;
    p.Update(0, 1000, "a");
    now = 2;
    p.Update(1, 1000, "b");  // before the interval: nothing
    now = 6;
    p.Update(2, 1000, "c");  // after 5 s
    p.Update(3, 1000, "shrinking", /*force=*/true);
  });
  EXPECT_EQ(Lines(slow), 3) << slow;
  EXPECT_EQ(slow.find("b (2 s)"), std::string::npos) << slow;
  EXPECT_NE(slow.find("[2/1000] check k: c (6 s)"), std::string::npos) << slow;
  // An unknown total: the count alone, lines by interval.
  now = 0;
  const std::string open =
      Capture(false, false, &now, [&](ProgressLine& p) { p.Update(5, -1, "cases"); });
  EXPECT_EQ(open, "[5] check k: cases (0 s)\n");
}

TEST(Progress, TerminalRedrawsOneLineWithABar) {
  double now = 3;
  const std::string out = Capture(true, false, &now, [&](ProgressLine& p) {
    p.Update(0, 10, "rows");
    p.Update(5, 10, "rows");
    p.Finish();
  });
  EXPECT_EQ(Lines(out), 1) << out;  // Finish ends the redrawn line
  EXPECT_NE(out.find("\rcheck k [###############...............] 5/10 rows  0 s\x1b[K"),
            std::string::npos)
      << out;
}

TEST(Progress, QuietPrintsNothing) {
  double now = 0;
  EXPECT_EQ(Capture(false, true, &now, [](ProgressLine& p) { p.Update(1, 2, "x", true); }), "");
  EXPECT_EQ(Capture(true, true, &now, [](ProgressLine& p) { p.Update(1, 2, "x"); }), "");
}

}  // namespace
}  // namespace attest::cli
