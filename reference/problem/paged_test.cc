// Paged KV and seqused in the problem (problem.h, paged.h; docs/semantics.md "Paged KV and
// seqused"): the JSON keys round-trip, the default page table, shapes, KeyRow and the logical
// problem, and every validation rule rejecting a value by name.
#include "reference/problem/paged.h"

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace attest {
namespace {

using nlohmann::json;

json Paged() {
  return {{"batch", 2},      {"heads_q", 2},   {"heads_kv", 1},       {"seqlen_q", 5},
          {"seqlen_k", 10},  {"head_dim", 8},  {"head_dim_v", 4},     {"page_size", 4},
          {"seqused_q", {5, 2}}, {"seqused_k", {10, 3}}};
}

void ExpectRejected(const json& patch, const std::string& needle) {
  json j = Paged();
  j.merge_patch(patch);
  const auto p = ProblemFromJson(j);
  ASSERT_FALSE(p.ok()) << "accepted: " << patch.dump();
  EXPECT_NE(p.error().message.find(needle), std::string::npos)
      << "message \"" << p.error().message << "\" lacks \"" << needle << "\"";
}

TEST(PagedProblem, DefaultsShapesRowsAndRoundTrip) {
  const auto p = ProblemFromJson(Paged());
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(PagesPerSeq(*p), 3);
  EXPECT_EQ(p->num_pages, 13);  // 2 * batch * pages per sequence + 1
  // Backwards through the pool, sequences interleaved, a gap page after each.
  EXPECT_EQ(*p->page_table, (std::vector<std::vector<int32_t>>{{11, 7, 3}, {9, 5, 1}}));
  EXPECT_EQ(p->KShape(), (Shape{13, 4, 1, 8}));
  EXPECT_EQ(p->VShape(), (Shape{13, 4, 1, 4}));
  EXPECT_EQ(p->QShape(), (Shape{2, 5, 2, 8}));
  EXPECT_EQ(KeyRow(*p, 0, 0), 44);
  EXPECT_EQ(KeyRow(*p, 0, 9), 3 * 4 + 1);
  EXPECT_EQ(KeyRow(*p, 1, 2), 9 * 4 + 2);
  EXPECT_EQ(UsedQLen(*p, 1), 2);
  EXPECT_EQ(UsedKLen(*p, 1), 3);
  const Problem l = LogicalProblem(*p);
  EXPECT_EQ(*l.cu_seqlens_q, (std::vector<int32_t>{0, 5, 7}));
  EXPECT_EQ(*l.cu_seqlens_k, (std::vector<int32_t>{0, 10, 13}));
  EXPECT_FALSE(HasLogicalView(l));
  EXPECT_TRUE(Validate(l).ok());
  const LogicalRows rows = LogicalRowsOf(*p);
  EXPECT_EQ(rows.q, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(rows.k.size(), 13u);
  EXPECT_EQ(rows.k[10], 36);
  const json j = ProblemToJson(*p);
  const auto back = ProblemFromJson(j);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, *p);
  EXPECT_EQ(j.at("page_size"), 4);
  // Contiguous problems write none of the keys.
  Problem c;
  const json cj = ProblemToJson(c);
  for (const char* key : {"page_size", "num_pages", "page_table", "seqused_q", "seqused_k"}) {
    EXPECT_FALSE(cj.contains(key)) << key;
  }
}

TEST(PagedProblem, ValidationNamesTheField) {
  ExpectRejected({{"page_size", -1}}, "problem.page_size: -1 is out of range");
  ExpectRejected({{"page_size", 0}, {"num_pages", 3}}, "problem.num_pages: set without page_size");
  ExpectRejected({{"page_size", 0}, {"page_table", {{0}, {1}}}},
                 "problem.page_table: set without page_size");
  ExpectRejected({{"num_pages", -2}}, "problem.num_pages: -2 must be in [1,");
  ExpectRejected({{"page_table", {{0, 1, 2}}}},
                 "problem.page_table: has 1 rows, expected batch = 2");
  ExpectRejected({{"page_table", {{0, 1}, {3, 4, 5}}}},
                 "problem.page_table[0]: has 2 entries, expected ceil(seqlen_k / page_size) = 3");
  ExpectRejected({{"page_table", {{0, 1, 2}, {3, 13, 5}}}},
                 "problem.page_table[1][1]: page 13 is outside [0, 13)");
  ExpectRejected({{"page_table", {{0, 1, 2}, {2, 4, 5}}}},
                 "problem.page_table[1][0]: page 2 is already read by sequence 0");
  // Pages past a sequence's used keys may repeat (never read): sequence 1 uses one page.
  json shared = Paged();
  shared["page_table"] = {{0, 1, 2}, {3, 0, 0}};
  EXPECT_TRUE(ProblemFromJson(shared).ok());
  ExpectRejected({{"seqused_q", {5}}}, "problem.seqused_q: has 1 entries, expected batch = 2");
  ExpectRejected({{"seqused_q", {6, 0}}}, "problem.seqused_q[0]: 6 is outside [0, 5]");
  ExpectRejected({{"seqused_k", {10, -1}}}, "problem.seqused_k[1]: -1 is outside [0, 10]");
  ExpectRejected({{"seqused_k", {10, "x"}}}, "problem.seqused_k[1]: expected an integer");
  ExpectRejected({{"page_table", {{0, 1, 2}, {3, "x", 5}}}},
                 "problem.page_table[1][1]: expected an integer");
  ExpectRejected({{"document_ids_q", {{0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}}},
                  {"document_ids_k", {std::vector<int>(10, 0), std::vector<int>(10, 0)}}},
                 "problem.page_size: cannot be combined with document_ids_q/k");
  ExpectRejected({{"pagesize", 4}}, "did you mean \"page_size\"");
}

}  // namespace
}  // namespace attest
