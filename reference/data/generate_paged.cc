// Inputs of paged and seqused problems (generate.h PlaceLogicalInputs; docs/semantics.md
// "Paged KV and seqused"): the generator's data for the same problem without pages, placed in
// the pool through the page table, and hostile values wherever the problem says nothing is
// read, so that a kernel that reads there is seen.
#include <cmath>
#include <cstring>
#include <limits>

#include "reference/data/generate.h"
#include "reference/problem/paged.h"

namespace attest {
namespace {

// Hostile row r of a [rows, H, X] tensor `t`: NaN, +-30000 (finite in every format but
// e4m3fn, where it saturates or becomes NaN, both equally visible) or a copy of another
// row of `source` (another sequence's data), in turn.
void FillHostileRow(const Tensor& source, Tensor& t, int64_t r) {
  const int64_t per_row = t.dim(t.rank() - 2) * t.dim(t.rank() - 1);
  double* row = t.data<double>() + r * per_row;
  const int64_t source_rows = source.numel() / per_row;
  switch (r % 3) {
    case 0:
      std::fill(row, row + per_row, std::numeric_limits<double>::quiet_NaN());
      break;
    case 1:
      for (int64_t e = 0; e < per_row; ++e) row[e] = (e % 2 == 0 ? 30000.0 : -30000.0);
      break;
    default:
      if (source_rows == 0) {
        std::fill(row, row + per_row, 30000.0);
      } else {
        const int64_t from = (r * 7919 + 1) % source_rows;
        std::memcpy(row, source.data<const double>() + from * per_row,
                    static_cast<size_t>(per_row) * sizeof(double));
      }
  }
}

// Query rows past seqused_q (q, dO) and key rows past seqused_k (k, v) of the contiguous
// layout `plain` (p without pages).
void FillTails(const Problem& p, const Problem& plain, GeneratedInputs& in) {
  const Tensor q = in.q.Clone(), dout = in.dout.Clone(), k = in.k.Clone(), v = in.v.Clone();
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence s = SequenceOf(plain, b);
    for (int64_t i = UsedQLen(p, b); i < s.q_len; ++i) {
      FillHostileRow(q, in.q, s.q_begin + i);
      FillHostileRow(dout, in.dout, s.q_begin + i);
    }
    for (int64_t j = UsedKLen(p, b); j < s.k_len; ++j) {
      FillHostileRow(k, in.k, s.k_begin + j);
      FillHostileRow(v, in.v, s.k_begin + j);
    }
  }
}

// Pool tensor of `shape` holding row KeyRow(b, j) = contiguous row (b, j) for every key of
// every sequence, hostile rows elsewhere.
Tensor ToPool(const Problem& p, const Problem& plain, const Tensor& rows,
              const Shape& shape) {
  Tensor pool = Tensor::Zeros(DType::kF64, shape);
  const int64_t slots = shape[0] * shape[1];
  for (int64_t r = 0; r < slots; ++r) FillHostileRow(rows, pool, r);
  const int64_t per_row = shape[2] * shape[3];
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence s = SequenceOf(plain, b);
    for (int64_t j = 0; j < s.k_len; ++j) {
      std::memcpy(pool.data<double>() + KeyRow(p, b, j) * per_row,
                  rows.data<const double>() + (s.k_begin + j) * per_row,
                  static_cast<size_t>(per_row) * sizeof(double));
    }
  }
  return pool;
}

}  // namespace

Expected<GeneratedInputs> PlaceLogicalInputs(const Problem& p, const GeneratorSpec& spec) {
  // The same problem without pages and seqused: the generator's rows do not depend on either.
  Problem plain = p;
  plain.page_size = 0;
  plain.num_pages = 0;
  plain.page_table.reset();
  plain.seqused_q.reset();
  plain.seqused_k.reset();
  auto gen = GenerateInputs(plain, spec);
  if (!gen.ok()) return gen.error();
  FillTails(p, plain, *gen);
  if (p.paged()) {
    gen->k = ToPool(p, plain, gen->k, p.KShape());
    gen->v = ToPool(p, plain, gen->v, p.VShape());
  }
  return gen;
}

}  // namespace attest
