// Problem: one attention call as the case-file JSON of docs/design.md describes it ("problem"
// object; field names are public contract), plus the extensions for mask families that
// FlexAttention-class kernels need (per-token document ids, prefix-LM, block-sparse lists).
//
// Layout (flash_attn_func conventions): q [B, Sq, Hq, D], k [B, Sk, Hkv, D],
// v [B, Sk, Hkv, Dv], o [B, Sq, Hq, Dv], lse [B, Hq, Sq]. Packed varlen (cu_seqlens set):
// q [total_q, Hq, D], k/v [total_k, Hkv, ...], lse [Hq, total_q]; `batch` counts sequences.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "reference/dtype.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

enum class CausalAlign { kBottomRight, kTopLeft };

// The mask forms a problem may name (Problem::mask_form), "" excluded.
inline constexpr const char* kMaskForms[] = {"bool", "additive", "additive_f32"};

// Block-sparse mask: key block kb is visible to query block qb iff (qb, kb) is listed.
// Blocks are counted from the start of each sequence; the same list applies to every
// batch entry and head. Combined (AND) with every other mask.
struct BlockSparse {
  int64_t block_q = 128;
  int64_t block_k = 128;
  std::vector<std::pair<int64_t, int64_t>> blocks;  // (query block, key block)

  bool operator==(const BlockSparse&) const = default;
};

// The largest split-KV count a problem may name and a kernel declare (Problem::num_splits,
// Capabilities::num_splits): far above any real kernel's (FlashAttention-2 chooses at most 128
// splits: flash_api.cpp num_splits_heuristic), and a bound on what a case file can make a
// model allocate.
inline constexpr int64_t kMaxNumSplits = 1024;

struct Problem {
  int64_t batch = 1;
  int64_t heads_q = 1;
  int64_t heads_kv = 1;
  int64_t seqlen_q = 1;  // packed: max_seqlen_q (>= every sequence's length)
  int64_t seqlen_k = 1;  // packed: max_seqlen_k
  int64_t head_dim = 64;
  int64_t head_dim_v = 64;
  DType dtype = DType::kBF16;
  std::optional<double> scale;  // null: 1/sqrt(head_dim)
  bool causal = false;
  CausalAlign causal_align = CausalAlign::kBottomRight;
  int64_t window_left = -1;  // -1: unbounded
  int64_t window_right = -1;
  double softcap = 0.0;  // 0: off
  std::optional<std::vector<double>> alibi_slopes;  // one per query head
  std::optional<std::vector<int32_t>> cu_seqlens_q;  // batch + 1 entries, starts at 0
  std::optional<std::vector<int32_t>> cu_seqlens_k;
  // Extensions (not in FlashAttention's API; FlexAttention mask_mods):
  // per-token document ids [batch][seqlen]; key j visible to query i only if equal.
  std::optional<std::vector<std::vector<int32_t>>> document_ids_q;
  std::optional<std::vector<std::vector<int32_t>>> document_ids_k;
  int64_t prefix_lm = 0;  // > 0 (needs causal): keys j < prefix_lm visible to every query
  std::optional<BlockSparse> block_sparse;
  // How a mask API is handed the mask (kMaskForms): "" the adapter's choice; "bool" a boolean
  // mask; "additive" 0 / -inf in the input dtype; "additive_f32" 0 / -inf in float32. It
  // changes nothing that is computed (the oracle ignores it): the same mask in another form
  // must give the same answer, and a suite row per form asks exactly that of APIs that take
  // masks as tensors (PyTorch SDPA's attn_mask; Capabilities::mask_forms).
  std::string mask_form;
  // Learnable attention sink (gpt-oss; FlashAttention-4's learnable_sink): the input tensor
  // `sink` [Hq] float32 (CaseInputs::sink) holds one logit per query head that joins every
  // row's softmax denominator as exp(sink_h) with no value; lse includes it, and the backward
  // returns dsink [Hq] (docs/semantics.md section 2, "Learnable sink").
  bool sink = false;
  // Learnable relative position bias (T5 / ALiBi-style learned table): the input tensor
  // `rel_bias` [Hq, seqlen_q + seqlen_k - 1] float32 (CaseInputs::rel_bias); score (i, j) of
  // head h gains rel_bias[h, i - j + seqlen_k - 1] after scale, softcap and ALiBi, with i, j
  // local to the sequence (seqlen_q / seqlen_k: packed, the max lengths); the backward
  // returns drel_bias, dS summed over each diagonal (docs/semantics.md "Learnable relative
  // bias").
  bool rel_bias = false;
  // Split-KV (flash-decoding; FlashAttention's `num_splits`): the number of splits the call
  // asks the kernel to cut each row's key range into, every split producing a partial o and
  // lse that a combine step merges; 0 (the default, not written) leaves the choice to the
  // kernel. It changes nothing that is computed (the oracle ignores it): every split count
  // must give the oracle's answer, and a suite row per declared count asks exactly that of
  // kernels that declare the counts they accept (Capabilities::num_splits).
  int64_t num_splits = 0;
  // Paged KV and seqused (docs/semantics.md "Paged KV and seqused"; reference/problem/paged.h).
  // page_size > 0: k, v are a pool [num_pages, page_size, Hkv, D|Dv] and sequence b's key j
  // is slot j % page_size of page page_table[b][j / page_size] (page_table: batch rows of
  // ceil(seqlen_k / page_size) pool indices). seqused_q / seqused_k: batch entries; sequence
  // b uses only its first seqused_q[b] queries and seqused_k[b] keys, and the diagonal rules
  // align to those lengths.
  int64_t page_size = 0;  // 0: contiguous k, v
  int64_t num_pages = 0;
  std::optional<std::vector<std::vector<int32_t>>> page_table;
  std::optional<std::vector<int32_t>> seqused_q;
  std::optional<std::vector<int32_t>> seqused_k;

  double EffectiveScale() const;
  bool paged() const { return page_size > 0; }
  bool varlen() const { return cu_seqlens_q.has_value(); }
  int64_t gqa_ratio() const { return heads_q / heads_kv; }
  // Query head h reads kv head h / (Hq / Hkv).
  int64_t KvHead(int64_t h) const { return h / gqa_ratio(); }
  int64_t TotalQ() const;  // rows of q: B*Sq, or cu_seqlens_q.back()
  int64_t TotalK() const;

  // Shapes of the tensors of this problem (packed shapes when varlen).
  Shape QShape() const;
  Shape KShape() const;
  Shape VShape() const;
  Shape OShape() const;
  Shape LseShape() const;
  Shape SinkShape() const { return {heads_q}; }  // sink and dsink: [Hq]
  // rel_bias and drel_bias: [Hq, seqlen_q + seqlen_k - 1]; diagonal i - j + seqlen_k - 1.
  int64_t RelBiasWidth() const { return seqlen_q + seqlen_k > 0 ? seqlen_q + seqlen_k - 1 : 0; }
  Shape RelBiasShape() const { return {heads_q, RelBiasWidth()}; }

  bool operator==(const Problem&) const = default;
};

// One sequence of a (possibly packed) batch: where its rows start in the flattened
// token axis (b * Sq for padded layouts, cu_seqlens[b] for packed) and how long it is.
struct Sequence {
  int64_t q_begin = 0;
  int64_t q_len = 0;
  int64_t k_begin = 0;
  int64_t k_len = 0;
};
Sequence SequenceOf(const Problem& p, int64_t b);

// JSON <-> Problem. Parsing validates everything (see Validate) and names the offending
// field in the error: "problem.heads_q: 6 is not a multiple of heads_kv = 4".
Expected<Problem> ProblemFromJson(const nlohmann::json& j);
nlohmann::json ProblemToJson(const Problem& p);
// Semantic validation of a Problem built in code.
Status Validate(const Problem& p);
// Checks that q, k, v (and optionally do) have the problem's shapes; names the tensor.
Status ValidateInputShapes(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor* dout = nullptr);

}  // namespace attest
