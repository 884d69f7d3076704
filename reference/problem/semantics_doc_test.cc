// docs/semantics.md cannot drift from the code: every mask drawing in it follows a marker
// `<!-- mask: {"problem": {...}, "sequence": b} -->` and must equal RenderMask of that problem.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "reference/problem/mask.h"

namespace attest {
namespace {

struct Drawing {
  int line = 0;  // 1-based line of the marker
  std::string marker_json;
  std::string block;  // the fenced block's lines, each ending in '\n'
};

std::vector<Drawing> ReadDrawings(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path << ": cannot open";
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  const std::string open = "<!-- mask: ", close = " -->";
  std::vector<Drawing> out;
  for (size_t n = 0; n < lines.size(); ++n) {
    const std::string& l = lines[n];
    if (l.rfind(open, 0) != 0) continue;
    Drawing d;
    d.line = static_cast<int>(n + 1);
    EXPECT_TRUE(l.size() >= open.size() + close.size() &&
                l.compare(l.size() - close.size(), close.size(), close) == 0)
        << path << ":" << d.line << ": marker does not end with -->";
    d.marker_json = l.substr(open.size(), l.size() - open.size() - close.size());
    EXPECT_TRUE(n + 1 < lines.size() && lines[n + 1] == "```")
        << path << ":" << d.line << ": marker not followed by a ``` block";
    size_t k = n + 2;
    for (; k < lines.size() && lines[k] != "```"; ++k) d.block += lines[k] + "\n";
    EXPECT_LT(k, lines.size()) << path << ":" << d.line << ": unterminated block";
    out.push_back(d);
    n = k;
  }
  return out;
}

TEST(SemanticsDoc, EveryMaskDrawingMatchesRenderMask) {
  const std::string path = std::string(ATTEST_SOURCE_DIR) + "/docs/semantics.md";
  const std::vector<Drawing> drawings = ReadDrawings(path);
  // The page promises causal (both alignments, Sq < Sk and Sq > Sk), windows, documents,
  // prefix-LM, block-sparse and varlen drawings; losing markers would silently skip checks.
  EXPECT_GE(drawings.size(), 10u);
  for (const Drawing& d : drawings) {
    const auto j = nlohmann::json::parse(d.marker_json, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << path << ":" << d.line << ": marker JSON does not parse";
    const auto p = ProblemFromJson(j.at("problem"));
    ASSERT_TRUE(p.ok()) << path << ":" << d.line << ": " << p.error().message;
    const int64_t b = j.value("sequence", int64_t{0});
    ASSERT_TRUE(b >= 0 && b < p->batch) << path << ":" << d.line << ": sequence out of range";
    EXPECT_EQ(d.block, RenderMask(*p, b))
        << path << ":" << d.line << ": the drawing differs from RenderMask (right)";
  }
}

TEST(SemanticsDoc, RenderMaskFormat) {
  Problem p;
  p.seqlen_q = 3;
  p.seqlen_k = 2;
  p.causal = true;
  EXPECT_EQ(RenderMask(p), "..\nx.\nxx\n");  // bottom-right: j <= i - 1
  p.seqlen_q = 0;
  EXPECT_EQ(RenderMask(p), "");
  p.seqlen_q = 2;
  p.seqlen_k = 0;
  EXPECT_EQ(RenderMask(p), "\n\n");
}

}  // namespace
}  // namespace attest
