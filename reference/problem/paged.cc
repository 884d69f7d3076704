// Paged KV and seqused: validation, the default page table, the logical problem and the
// gathers/scatters between layouts (see paged.h; docs/semantics.md "Paged KV and seqused").
#include "reference/problem/paged.h"

#include <cassert>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "reference/formats/format.h"

namespace attest {
namespace {

constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();
// A default table larger than this is not built (validation then asks for page_table).
constexpr int64_t kMaxDefaultTable = int64_t{1} << 24;

Status CheckSeqused(const Problem& p, const std::vector<int32_t>& used, std::string_view name,
                    bool keys) {
  if (static_cast<int64_t>(used.size()) != p.batch) {
    return Error{fmt::format("problem.{}: has {} entries, expected batch = {}", name,
                             used.size(), p.batch)};
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence s = SequenceOf(p, b);
    const int64_t len = keys ? s.k_len : s.q_len;
    const int32_t u = used[static_cast<size_t>(b)];
    if (u < 0 || u > len) {
      return Error{fmt::format("problem.{}[{}]: {} is outside [0, {}] (the sequence's {} length)",
                               name, b, u, len, keys ? "key" : "query")};
    }
  }
  return {};
}

Status CheckPageTable(const Problem& p) {
  if (p.num_pages < 1 || p.num_pages > kMaxIndex) {
    return Error{fmt::format("problem.num_pages: {} must be in [1, {}] with page_size set",
                             p.num_pages, kMaxIndex)};
  }
  if (!p.page_table) {
    return Error{"problem.page_table: missing (page_size is set: batch rows of page indices)"};
  }
  const auto& table = *p.page_table;
  const int64_t pps = PagesPerSeq(p);
  if (static_cast<int64_t>(table.size()) != p.batch) {
    return Error{fmt::format("problem.page_table: has {} rows, expected batch = {}",
                             table.size(), p.batch)};
  }
  // A page read by two sequences would make dk, dv a sum over both (shared prefixes): not
  // in this semantics, so referenced pages are distinct.
  std::vector<int64_t> owner(static_cast<size_t>(p.num_pages), -1);
  for (int64_t b = 0; b < p.batch; ++b) {
    const auto& row = table[static_cast<size_t>(b)];
    if (static_cast<int64_t>(row.size()) != pps) {
      return Error{fmt::format(
          "problem.page_table[{}]: has {} entries, expected ceil(seqlen_k / page_size) = {}", b,
          row.size(), pps)};
    }
    const int64_t used_pages = (UsedKLen(p, b) + p.page_size - 1) / p.page_size;
    for (int64_t i = 0; i < pps; ++i) {
      const int32_t page = row[static_cast<size_t>(i)];
      if (page < 0 || page >= p.num_pages) {
        return Error{fmt::format("problem.page_table[{}][{}]: page {} is outside [0, {})", b, i,
                                 page, p.num_pages)};
      }
      if (i >= used_pages) continue;
      int64_t& o = owner[static_cast<size_t>(page)];
      if (o >= 0) {
        return Error{fmt::format(
            "problem.page_table[{}][{}]: page {} is already read by sequence {} (pages a "
            "sequence reads are its own)",
            b, i, page, o)};
      }
      o = b;
    }
  }
  return {};
}

// A contiguous f64 copy (or the tensor itself when it already is one).
Tensor AsF64(const Tensor& t) {
  if (t.dtype() != DType::kF64) return ToF64(t);
  return t.contiguous() ? t : t.Clone();
}

}  // namespace

int64_t LseFlatIndex(const Problem& p, int64_t row, int64_t h) {
  if (p.varlen()) return h * p.TotalQ() + row;
  const int64_t b = row / p.seqlen_q, i = row % p.seqlen_q;
  return (b * p.heads_q + h) * p.seqlen_q + i;
}

int64_t PagesPerSeq(const Problem& p) {
  if (!p.paged()) return 0;
  return (p.seqlen_k + p.page_size - 1) / p.page_size;
}

int64_t UsedQLen(const Problem& p, int64_t b) {
  if (p.seqused_q) return (*p.seqused_q)[static_cast<size_t>(b)];
  return SequenceOf(p, b).q_len;
}

int64_t UsedKLen(const Problem& p, int64_t b) {
  if (p.seqused_k) return (*p.seqused_k)[static_cast<size_t>(b)];
  return SequenceOf(p, b).k_len;
}

int64_t KeyRow(const Problem& p, int64_t b, int64_t j) {
  if (!p.paged()) return SequenceOf(p, b).k_begin + j;
  const auto& row = (*p.page_table)[static_cast<size_t>(b)];
  const int64_t page = row[static_cast<size_t>(j / p.page_size)];
  return page * p.page_size + j % p.page_size;
}

void FillPagedDefaults(Problem& p) {
  if (!p.paged() || p.batch < 1 || p.batch > kMaxIndex) return;
  const int64_t pps = PagesPerSeq(p);
  if (p.batch * pps > kMaxDefaultTable) return;
  if (p.num_pages == 0) p.num_pages = 2 * p.batch * pps + 1;
  if (p.page_table) return;
  const int64_t used = p.batch * pps;
  const bool gaps = p.num_pages >= 2 * used + 1;
  std::vector<std::vector<int32_t>> table(static_cast<size_t>(p.batch));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t i = 0; i < pps; ++i) {
      const int64_t n = i * p.batch + b;
      const int64_t page = gaps ? p.num_pages - 2 - 2 * n : p.num_pages - 1 - n;
      table[static_cast<size_t>(b)].push_back(static_cast<int32_t>(std::max<int64_t>(page, 0)));
    }
  }
  p.page_table = std::move(table);
}

Status CheckPaged(const Problem& p) {
  if (p.page_size < 0 || p.page_size > kMaxIndex) {
    return Error{fmt::format("problem.page_size: {} is out of range [0, {}]", p.page_size,
                             kMaxIndex)};
  }
  if (!p.paged() && (p.num_pages != 0 || p.page_table)) {
    return Error{fmt::format("problem.{}: set without page_size (0: contiguous k, v)",
                             p.num_pages != 0 ? "num_pages" : "page_table")};
  }
  if (HasLogicalView(p) && p.document_ids_q) {
    return Error{fmt::format(
        "problem.{}: cannot be combined with document_ids_q/k (the used rows form packed "
        "sequences, which are already separate documents)",
        p.paged() ? "page_size" : (p.seqused_q ? "seqused_q" : "seqused_k"))};
  }
  if (p.seqused_q) {
    if (Status s = CheckSeqused(p, *p.seqused_q, "seqused_q", false); !s) return s;
  }
  if (p.seqused_k) {
    if (Status s = CheckSeqused(p, *p.seqused_k, "seqused_k", true); !s) return s;
  }
  if (p.paged()) return CheckPageTable(p);
  return {};
}

Problem LogicalProblem(const Problem& p) {
  assert(HasLogicalView(p));
  Problem l = p;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (int64_t b = 0; b < p.batch; ++b) {
    cu_q.push_back(static_cast<int32_t>(cu_q.back() + UsedQLen(p, b)));
    cu_k.push_back(static_cast<int32_t>(cu_k.back() + UsedKLen(p, b)));
  }
  l.cu_seqlens_q = std::move(cu_q);
  l.cu_seqlens_k = std::move(cu_k);
  l.page_size = 0;
  l.num_pages = 0;
  l.page_table.reset();
  l.seqused_q.reset();
  l.seqused_k.reset();
  return l;
}

LogicalRows LogicalRowsOf(const Problem& p) {
  LogicalRows r;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence s = SequenceOf(p, b);
    for (int64_t i = 0; i < UsedQLen(p, b); ++i) r.q.push_back(s.q_begin + i);
    for (int64_t j = 0; j < UsedKLen(p, b); ++j) r.k.push_back(KeyRow(p, b, j));
  }
  return r;
}

Tensor GatherRows(const Tensor& t, const std::vector<int64_t>& rows) {
  const Tensor c = AsF64(t);
  const int64_t heads = c.dim(c.rank() - 2), width = c.dim(c.rank() - 1);
  const int64_t per_row = heads * width;
  Tensor out = Tensor::Zeros(DType::kF64, {static_cast<int64_t>(rows.size()), heads, width});
  const double* src = c.data<const double>();
  double* dst = out.data<double>();
  for (size_t n = 0; n < rows.size(); ++n) {
    std::memcpy(dst + static_cast<int64_t>(n) * per_row, src + rows[n] * per_row,
                static_cast<size_t>(per_row) * sizeof(double));
  }
  return out;
}

Tensor ScatterRows(const Tensor& packed, const std::vector<int64_t>& rows, const Shape& shape,
                   double fill) {
  const Tensor c = AsF64(packed);
  Tensor out = Tensor::Zeros(DType::kF64, shape);
  const auto all = out.span<double>();
  std::fill(all.begin(), all.end(), fill);
  const int64_t per_row = shape[shape.size() - 2] * shape[shape.size() - 1];
  const double* src = c.data<const double>();
  for (size_t n = 0; n < rows.size(); ++n) {
    std::memcpy(all.data() + rows[n] * per_row, src + static_cast<int64_t>(n) * per_row,
                static_cast<size_t>(per_row) * sizeof(double));
  }
  return out;
}

Tensor GatherLse(const Problem& p, const Tensor& lse, const std::vector<int64_t>& q_rows) {
  const Tensor c = AsF64(lse);
  const auto n = static_cast<int64_t>(q_rows.size());
  Tensor out = Tensor::Zeros(DType::kF64, {p.heads_q, n});
  const double* src = c.data<const double>();
  double* dst = out.data<double>();
  for (int64_t h = 0; h < p.heads_q; ++h) {
    for (int64_t r = 0; r < n; ++r) {
      dst[h * n + r] = src[LseFlatIndex(p, q_rows[static_cast<size_t>(r)], h)];
    }
  }
  return out;
}

Tensor ScatterLse(const Problem& p, const Tensor& packed, const std::vector<int64_t>& q_rows,
                  double fill) {
  const Tensor c = AsF64(packed);
  const auto n = static_cast<int64_t>(q_rows.size());
  Tensor out = Tensor::Zeros(DType::kF64, p.LseShape());
  const auto all = out.span<double>();
  std::fill(all.begin(), all.end(), fill);
  const double* src = c.data<const double>();
  for (int64_t h = 0; h < p.heads_q; ++h) {
    for (int64_t r = 0; r < n; ++r) {
      all[LseFlatIndex(p, q_rows[static_cast<size_t>(r)], h)] = src[h * n + r];
    }
  }
  return out;
}

}  // namespace attest
