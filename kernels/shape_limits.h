// Shape limits a kernel declares (the `shapes` object of its capabilities), and how a problem
// is moved to the nearest shape a limited kernel accepts.
//
// Most research and in-house kernels have ordinary shape limits: the Triton fused-attention
// tutorial (triton-lang/triton python/tutorials/06-fused-attention.py) takes Sq = Sk, lengths a
// multiple of its BLOCK_M/BLOCK_N and head dims 16..256 in powers of two; ThunderKittens'
// H100 attention takes lengths that are multiples of its 192-row tiles; decode kernels cap
// the batch. A kernel that declares such limits is judged on problems inside them: suites move
// each row to the nearest legal shape that keeps what the row is for (FitShape with the row's
// ShapeIntent), the fuzz generators and the shrinker produce legal problems only, and a
// refusal of a problem outside the limits is honest (Capabilities::Covers).
//
// Sequence lengths are per sequence: Sq and Sk of a padded batch, every packed sequence's
// q_len and k_len (cu_seqlens). Limits with default values say nothing.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "reference/problem/problem.h"
#include "reference/status.h"

namespace attest {

struct ShapeLimits {
  int64_t seqlen_q_multiple = 1;  // every query length is a multiple of this
  int64_t seqlen_k_multiple = 1;  // every key length is a multiple of this
  bool equal_seqlens = false;     // q_len == k_len in every sequence
  int64_t min_seqlen_q = 0;       // e.g. 1: no zero-length query side
  int64_t min_seqlen_k = 0;
  int64_t max_seqlen_q = 0;  // 0: no limit
  int64_t max_seqlen_k = 0;
  int64_t max_batch = 0;  // sequences of a padded or packed batch; 0: no limit

  // Whether any limit is set.
  bool any() const { return *this != ShapeLimits{}; }
  bool operator==(const ShapeLimits&) const = default;
};

// Why `p` breaks `s` (e.g. "seqlen_q 77 is not a multiple of 64"), or "" when it does not.
std::string ShapeViolation(const ShapeLimits& s, const Problem& p);

// The JSON form: only the limits that are set are written; parsing names the field
// ("capabilities.shapes.seqlen_q_multiple: must be a positive integer") and rejects limits no
// problem can meet (a maximum below the multiple or the minimum).
nlohmann::json ShapeLimitsToJson(const ShapeLimits& s);
Expected<ShapeLimits> ShapeLimitsFromJson(const nlohmann::json& j);

// What a suite row's shape is for, which a move to legal lengths must keep.
struct ShapeIntent {
  // The order of q_len and k_len (Sq < Sk, Sq > Sk, Sq = Sk) in every sequence: a row for
  // empty causal rows (Sq > Sk, bottom-right) is no such row once the lengths are equal.
  bool order = true;
  // More than one sequence, when the row has more than one.
  bool batch = true;
  // Zero-length sequences (packed documents with q_len or k_len 0), when the row has them.
  bool empty_sequences = true;
};
// A move that may drop any of them (the fuzz generators and the shrinker, whose problems are
// drawn rather than written for a purpose).
inline constexpr ShapeIntent kAnyShape{false, false, false};

// Drops the block-sparse pairs past the problem's lengths (after they changed).
void DropBlocksPastLengths(Problem& p);

// Moves `p` to the nearest shape inside `s`, keeping `intent`; returns "" on success, else
// why no legal shape keeps it (then `p` is unspecified). The move, for each sequence:
//   1. each length is rounded up to its multiple (0 stays 0 where the minimum allows it), so
//      that it touches as many tiles of the kernel's block as before: a tile-boundary row
//      (63, 64, 65 for a block of 64) becomes one of one or two whole tiles of the kernel;
//   2. raised to the minimum, lowered to the largest legal length under the maximum;
//   3. with equal_seqlens, both sides become the longer one (a multiple of both multiples);
//   4. where `intent.order` holds and the order of q_len and k_len changed, the side that
//      must be longer grows by its multiple (if the maximum allows).
// Then the batch is cut to max_batch (padded: fewer rows; packed: the first sequences), per-
// token document ids are extended with their last id or cut, block-sparse lists keep the
// blocks that still exist, and a prefix-LM past the keys is cut to them.
std::string FitShape(Problem& p, const ShapeLimits& s, const ShapeIntent& intent = {});

}  // namespace attest
