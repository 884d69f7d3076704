// Paged KV and seqused (docs/semantics.md "Paged KV and seqused"): where sequence b's keys
// live in a page pool, how many of its queries and keys are used, and the logical problem
// they form (a packed varlen problem over the used rows), with the gathers and scatters
// between the two layouts that the oracle and the CPU models share.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/problem/problem.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

// Pages one sequence's table row holds: ceil(seqlen_k / page_size) (0 when not paged).
int64_t PagesPerSeq(const Problem& p);
// Whether the problem has a logical view different from its layout (paged or seqused).
inline bool HasLogicalView(const Problem& p) {
  return p.paged() || p.seqused_q.has_value() || p.seqused_k.has_value();
}
// The queries and keys sequence b uses: seqused_q[b] / seqused_k[b], else its full lengths.
int64_t UsedQLen(const Problem& p, int64_t b);
int64_t UsedKLen(const Problem& p, int64_t b);
// The row of k / v, viewed as [rows, Hkv, D] (paged: [num_pages * page_size, Hkv, D]), that
// holds key j of sequence b: page_table[b][j / page_size] * page_size + j % page_size when
// paged, else the sequence's start + j.
int64_t KeyRow(const Problem& p, int64_t b, int64_t j);

// The page table a problem with page_size gets when it names none: page i of sequence b is
// page num_pages - 2 - 2 (i * batch + b) when the pool has room for a gap after each page,
// else num_pages - 1 - (i * batch + b): the table order runs backwards through the pool and
// interleaves the sequences, so a kernel that reads pages in pool order or a neighbour's
// page reads the wrong keys. num_pages 0 becomes 2 * batch * PagesPerSeq + 1.
void FillPagedDefaults(Problem& p);
// Validation of page_size, num_pages, page_table, seqused_q and seqused_k (Validate calls it;
// errors name the field).
Status CheckPaged(const Problem& p);

// The logical problem: packed varlen with sequence b of UsedQLen(b) queries and UsedKLen(b)
// keys (cu_seqlens built from them; seqlen_q / seqlen_k, every mask field and the sink
// unchanged), no pages, no seqused. Requires HasLogicalView(p).
Problem LogicalProblem(const Problem& p);
// For each row of the logical problem's packed q (k) the row of p's q (k, v) tensor it is.
struct LogicalRows {
  std::vector<int64_t> q, k;
};
LogicalRows LogicalRowsOf(const Problem& p);

// Rows `rows` of a token-major tensor (leading dims flattened to rows; the last two dims
// [H, D] kept): a contiguous f64 [rows.size(), H, D].
Tensor GatherRows(const Tensor& t, const std::vector<int64_t>& rows);
// The inverse: a contiguous f64 tensor of `shape`, holding packed row n at row rows[n] and
// `fill` everywhere else.
Tensor ScatterRows(const Tensor& packed, const std::vector<int64_t>& rows, const Shape& shape,
                   double fill);
// The flat index in p's lse layout of query row `row` (of the flattened q) and head h.
int64_t LseFlatIndex(const Problem& p, int64_t row, int64_t h);
// lse between p's layout ([B, Hq, Sq] or [Hq, total_q]) and the logical [Hq, rows.size()]:
// Gather reads the used rows, Scatter writes them and `fill` elsewhere.
Tensor GatherLse(const Problem& p, const Tensor& lse, const std::vector<int64_t>& q_rows);
Tensor ScatterLse(const Problem& p, const Tensor& packed, const std::vector<int64_t>& q_rows,
                  double fill);

}  // namespace attest
