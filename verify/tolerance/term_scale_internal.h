// Pieces shared by the gradient term scales (term_scale.cc) and the rounding floors
// (rounding_floor.cc): the oracle's tiles and product, the waves their key tiles run in, and
// the f64 inputs. Not part of the public API.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_gemm.h"
#include "reference/oracle/oracle_internal.h"
#include "reference/problem/mask.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest::term_scale_internal {

// The oracle's tiles (oracle.h AutoTiles; the tile sizes do not depend on the problem).
inline const int64_t kTileQ = AutoTiles(Problem{}).q;
inline const int64_t kTileK = AutoTiles(Problem{}).k;
// A key tile's sums are one k block of the oracle's product (ComputeRoundingFloors adds each
// tile's product to its running sum as the product itself would).
static_assert(oracle_internal::kGemmKc >= 128);

// C = alpha op(A) op(B) (beta 0) or C += op(A) op(B) (beta 1, alpha 1), row-major, by the
// oracle's own product (reference/oracle/oracle_gemm.h): its rounding sequence is fixed and
// the same on every ISA, so the term scales, and the tolerances built from them, are the
// same bits on every machine (a BLAS dgemm sums in the order of whichever kernel the CPU
// selects). B is packed into panels per call, as dgemm does.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc);

// Tiles per wave of InWaves: 4 per worker, at most 64 unless there are more workers.
int64_t WaveSize(int workers);

// tile(x, i, worker) for the tiles i in [0, n), in waves of `wave` tiles run on up to `workers`
// threads (x < wave: the tile's slot in its wave); after each wave, merge(x, i) for its tiles
// in order. Sums merged there keep one order whatever the thread count.
template <class Tile, class Merge>
void InWaves(int64_t n, int64_t wave, int workers, Tile&& tile, Merge&& merge) {
  for (int64_t w0 = 0; w0 < n; w0 += wave) {
    const int64_t nw = std::min(wave, n - w0);
    oracle_internal::ParallelFor(nw, oracle_internal::ThreadCount(workers, nw),
                                 [&](int64_t x, int worker) { tile(x, w0 + x, worker); });
    for (int64_t x = 0; x < nw; ++x) merge(x, w0 + x);
  }
}

// `t` as a contiguous f64 tensor of `shape`; an error naming the tensor otherwise.
Expected<Tensor> F64Input(const Tensor& t, const char* name, const Shape& shape);

// |x| of every element of an f64 tensor.
std::vector<double> Abs(const Tensor& t);

// Offset of (b, h, i) in lse / delta: [B, Hq, Sq] or, packed, [Hq, total_q] (oracle.h).
int64_t LseIndex(const Problem& p, int64_t b, int64_t h, const Sequence& seq, int64_t i);

}  // namespace attest::term_scale_internal
