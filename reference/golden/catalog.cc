// The golden case list (see catalog.h). Sizes are kept small (a few thousand score entries
// per head) so that the mp256 oracle regenerates all cases in minutes and the double oracle
// verifies them in seconds; each case still spans more than one 64-row query tile or
// 256-key tile only where tiling is what it pins.
#include "reference/golden/catalog.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace attest {
namespace {

// A dense problem with one kv head per query head; the cases below adjust fields.
Problem Dense(int64_t batch, int64_t heads, int64_t sq, int64_t sk, int64_t d, DType dtype) {
  Problem p;
  p.batch = batch;
  p.heads_q = heads;
  p.heads_kv = heads;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = d;
  p.head_dim_v = d;
  p.dtype = dtype;
  return p;
}

// Standard normal q, k, v, do unless a case asks otherwise.
GeneratorSpec Gaussian(uint64_t seed, nlohmann::json params = nlohmann::json::object()) {
  return GeneratorSpec{"gaussian", seed, std::move(params)};
}

// ALiBi slopes of Press et al. (2022) for `heads` heads: 2^(-8 (h + 1) / heads).
std::vector<double> AlibiSlopes(int64_t heads) {
  std::vector<double> s;
  for (int64_t h = 0; h < heads; ++h) s.push_back(std::exp2(-8.0 * double(h + 1) / double(heads)));
  return s;
}

// Document ids from run lengths: {3, 2} -> 0 0 0 1 1.
std::vector<int32_t> Runs(std::initializer_list<int32_t> lengths) {
  std::vector<int32_t> ids;
  int32_t doc = 0;
  for (int32_t n : lengths) {
    ids.insert(ids.end(), static_cast<size_t>(n), doc);
    ++doc;
  }
  return ids;
}

// Appends golden cases to `cases` in the order of the calls.
struct CaseList {
  std::vector<GoldenCaseSpec>& cases;
  void operator()(std::string name, std::string covers, Problem p, GeneratorSpec g) const {
    cases.push_back({std::move(name), std::move(covers), std::move(p), std::move(g)});
  }
};

using D = DType;  // D::kBF16 and the like in the tables below

// Each family below draws its generators' seeds from `seed` in order: ++seed per case.

// --- No mask, dtypes, head dims, batch -----------------------------------------------------
void AddNoMask(const CaseList& add, uint64_t& seed) {
  add("nomask_bf16", "no mask, bf16, Sq != Sk", Dense(1, 2, 33, 47, 64, D::kBF16),
      Gaussian(++seed));
  add("nomask_f16_batch3", "no mask, f16, batch 3", Dense(3, 2, 17, 29, 32, D::kF16),
      Gaussian(++seed));
  add("nomask_f32_d40", "no mask, f32, odd head dim 40", Dense(1, 2, 24, 40, 40, D::kF32),
      Gaussian(++seed));
  add("nomask_bf16_d96", "no mask, head dim 96", Dense(1, 1, 20, 36, 96, D::kBF16),
      Gaussian(++seed));
  {
    Problem p = Dense(1, 2, 16, 24, 32, D::kF16);
    p.scale = 0.5;
    add("scale_explicit", "explicit scale 0.5 (not 1/sqrt(D))", p, Gaussian(++seed));
  }
  add("huge_logits_bf16", "near one-hot softmax: q std 24 gives |s| up to ~1e2",
      Dense(1, 2, 16, 40, 32, D::kBF16), Gaussian(++seed, {{"q", {{"std", 24.0}}}}));
}

// --- Causal, both alignments ---------------------------------------------------------------
void AddCausal(const CaseList& add, uint64_t& seed) {
  {
    Problem p = Dense(1, 2, 48, 20, 32, D::kBF16);
    p.causal = true;
    add("causal_br_sq_gt_sk", "causal bottom-right, Sq > Sk: top 28 rows empty", p,
        Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 20, 48, 32, D::kBF16);
    p.causal = true;
    add("causal_br_sq_lt_sk", "causal bottom-right, Sq < Sk", p, Gaussian(++seed));
  }
  {
    Problem p = Dense(2, 2, 40, 40, 32, D::kF16);
    p.causal = true;
    add("causal_square_f16_batch2", "causal square, f16, batch 2", p, Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 40, 24, 32, D::kBF16);
    p.causal = true;
    p.causal_align = CausalAlign::kTopLeft;
    add("causal_tl_sq_gt_sk", "causal top-left, Sq > Sk (no empty rows)", p, Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 24, 40, 32, D::kBF16);
    p.causal = true;
    p.causal_align = CausalAlign::kTopLeft;
    add("causal_tl_sq_lt_sk", "causal top-left, Sq < Sk (trailing keys seen by no query)", p,
        Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 1, 64, 32, D::kBF16);
    p.causal = true;
    add("decode_sq1_causal", "decode step: Sq = 1 sees every key under bottom-right causal", p,
        Gaussian(++seed));
  }
}

// --- Sliding windows -----------------------------------------------------------------------
void AddWindows(const CaseList& add, uint64_t& seed) {
  {
    Problem p = Dense(1, 2, 36, 30, 32, D::kBF16);
    p.window_left = 0;
    p.window_right = 0;
    add("window_0_0", "window (0, 0): the diagonal key only; Sq > Sk leaves empty rows", p,
        Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 40, 40, 32, D::kF16);
    p.window_left = 8;
    p.window_right = 8;
    add("window_8_8", "symmetric local window (8, 8)", p, Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 30, 24, 32, D::kBF16);
    p.window_left = 100;
    p.window_right = 100;
    add("window_wider_than_sk", "window (100, 100) wider than Sk = 24: equals no mask", p,
        Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 32, 40, 32, D::kBF16);
    p.window_left = 6;
    add("window_left_only", "one-sided window (6, -1)", p, Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 40, 32, 32, D::kBF16);
    p.window_right = 5;
    add("window_right_only", "one-sided window (-1, 5), Sq > Sk", p, Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 48, 48, 32, D::kBF16);
    p.causal = true;
    p.window_left = 10;
    add("causal_sliding_window", "causal + window (10, -1) (Mistral-style sliding window)", p,
        Gaussian(++seed));
  }
}

// --- Prefix-LM, documents, block-sparse ------------------------------------------------------
void AddPrefixDocumentsBlockSparse(const CaseList& add, uint64_t& seed) {
  {
    Problem p = Dense(1, 2, 40, 40, 32, D::kBF16);
    p.causal = true;
    p.prefix_lm = 12;
    add("prefix_lm", "prefix-LM: 12 bidirectional keys, causal after", p, Gaussian(++seed));
  }
  {
    Problem p = Dense(2, 2, 40, 40, 32, D::kBF16);
    p.document_ids_q = {{Runs({10, 17, 13}), Runs({25, 15})}};
    p.document_ids_k = p.document_ids_q;
    add("document_ids", "per-token document ids, batch 2, non-causal", p, Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 36, 44, 32, D::kF16);
    p.causal = true;
    // Query document 2 has no key: its rows are empty; key document 1 is seen by no query.
    std::vector<int32_t> q_ids = Runs({12, 0, 24});  // ids 0 and 2
    std::vector<int32_t> k_ids = Runs({20, 24});     // ids 0 and 1
    p.document_ids_q = {{q_ids}};
    p.document_ids_k = {{k_ids}};
    add("document_ids_causal_mismatch",
        "document ids + causal, a query document without keys (empty rows) and a key document "
        "without queries (dk = dv = 0)",
        p, Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 64, 64, 32, D::kBF16);
    BlockSparse bs;
    bs.block_q = 16;
    bs.block_k = 16;
    // Query block 2 lists nothing (empty rows); key block 3 is listed for nobody.
    bs.blocks = {{0, 0}, {1, 0}, {1, 1}, {3, 0}, {3, 2}};
    p.block_sparse = bs;
    add("block_sparse", "block-sparse 16x16 list with an empty query block and an unused key "
                        "block",
        p, Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 48, 48, 32, D::kF16);
    p.causal = true;
    BlockSparse bs;
    bs.block_q = 16;
    bs.block_k = 8;
    for (int64_t qb = 0; qb < 3; ++qb) {
      for (int64_t kb = 0; kb < 6; kb += 2) bs.blocks.emplace_back(qb, kb);
    }
    p.block_sparse = bs;
    add("block_sparse_causal", "block-sparse (16, 8) AND causal, uneven block shapes", p,
        Gaussian(++seed));
  }
}

// --- GQA and Dv != D -------------------------------------------------------------------------
void AddGqaAndDv(const CaseList& add, uint64_t& seed) {
  {
    Problem p = Dense(1, 4, 24, 32, 32, D::kBF16);
    p.heads_kv = 2;
    add("gqa_ratio2", "GQA Hq/Hkv = 2", p, Gaussian(++seed));
  }
  {
    Problem p = Dense(2, 8, 20, 28, 32, D::kF16);
    p.heads_kv = 2;
    p.causal = true;
    add("gqa_ratio4_causal", "GQA Hq/Hkv = 4, causal, batch 2", p, Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 24, 36, 64, D::kBF16);
    p.head_dim_v = 32;
    add("dv_lt_d", "Dv = 32 < D = 64", p, Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 24, 36, 40, D::kF32);
    p.head_dim_v = 96;
    p.causal = true;
    add("dv_gt_d_f32", "Dv = 96 > D = 40, f32, causal", p, Gaussian(++seed));
  }
}

// --- Softcap and ALiBi ---------------------------------------------------------------------
void AddSoftcapAndAlibi(const CaseList& add, uint64_t& seed) {
  {
    Problem p = Dense(1, 2, 32, 40, 32, D::kBF16);
    p.softcap = 5.0;
    add("softcap", "softcap 5 with q std 4 so that tanh saturates", p,
        Gaussian(++seed, {{"q", {{"std", 4.0}}}}));
  }
  {
    Problem p = Dense(1, 4, 32, 40, 32, D::kBF16);
    p.alibi_slopes = AlibiSlopes(4);
    add("alibi", "ALiBi, non-causal (|i + Sk - Sq - j| distance)", p, Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 4, 40, 40, 32, D::kF16);
    p.causal = true;
    p.softcap = 8.0;
    p.alibi_slopes = AlibiSlopes(4);
    add("softcap_alibi_causal", "softcap + ALiBi + causal together", p,
        Gaussian(++seed, {{"q", {{"std", 3.0}}}}));
  }
  {
    Problem p = Dense(1, 2, 32, 32, 64, D::kBF16);
    p.softcap = 10.0;
    p.window_left = 7;
    p.window_right = 3;
    add("softcap_window", "softcap + asymmetric window (7, 3)", p, Gaussian(++seed));
  }
}

// --- Packed variable length ------------------------------------------------------------------
void AddVarlen(const CaseList& add, uint64_t& seed) {
  {
    Problem p = Dense(4, 2, 27, 26, 32, D::kBF16);
    p.cu_seqlens_q = std::vector<int32_t>{0, 13, 13, 40, 47};  // sequence 1 has no queries
    p.cu_seqlens_k = std::vector<int32_t>{0, 20, 25, 51, 60};
    add("varlen_zero_len_q", "packed varlen, 4 sequences, one with zero queries", p,
        Gaussian(++seed));
  }
  {
    Problem p = Dense(3, 4, 21, 30, 32, D::kF16);
    p.heads_kv = 2;
    p.causal = true;
    p.cu_seqlens_q = std::vector<int32_t>{0, 21, 30, 42};
    p.cu_seqlens_k = std::vector<int32_t>{0, 30, 30, 47};  // sequence 1 has no keys
    add("varlen_zero_len_k_causal_gqa",
        "packed varlen + causal + GQA 2, a sequence with no keys (all its rows empty)", p,
        Gaussian(++seed));
  }
  {
    Problem p = Dense(2, 2, 30, 30, 32, D::kBF16);
    p.window_left = 4;
    p.window_right = 4;
    p.alibi_slopes = AlibiSlopes(2);
    p.cu_seqlens_q = std::vector<int32_t>{0, 30, 42};
    p.cu_seqlens_k = std::vector<int32_t>{0, 17, 47};
    add("varlen_window_alibi", "packed varlen + window (4, 4) + ALiBi, per-sequence diagonals",
        p, Gaussian(++seed));
  }
}

// --- Sk = 1 and empty rows -----------------------------------------------------------------
void AddSk1AndEmptyRows(const CaseList& add, uint64_t& seed) {
  add("sk1", "a single key: o = v, dq = dk = 0", Dense(1, 2, 16, 1, 32, D::kBF16),
      Gaussian(++seed));
  {
    Problem p = Dense(1, 2, 8, 1, 32, D::kF16);
    p.causal = true;
    add("sk1_causal", "Sk = 1 + causal bottom-right: only the last row sees the key", p,
        Gaussian(++seed));
  }
  {
    Problem p = Dense(1, 2, 24, 40, 32, D::kBF16);
    p.causal = true;
    p.causal_align = CausalAlign::kTopLeft;
    p.window_left = 0;
    p.window_right = 0;
    p.document_ids_q = {{Runs({8, 16})}};
    p.document_ids_k = {{Runs({16, 24})}};
    add("empty_rows_diag_docs",
        "top-left diagonal AND documents: rows 8..15 see only keys of another document", p,
        Gaussian(++seed));
  }
}

std::vector<GoldenCaseSpec> Build() {
  std::vector<GoldenCaseSpec> cases;
  const CaseList add{cases};
  uint64_t seed = 1000;
  AddNoMask(add, seed);
  AddCausal(add, seed);
  AddWindows(add, seed);
  AddPrefixDocumentsBlockSparse(add, seed);
  AddGqaAndDv(add, seed);
  AddSoftcapAndAlibi(add, seed);
  AddVarlen(add, seed);
  AddSk1AndEmptyRows(add, seed);

  std::sort(cases.begin(), cases.end(),
            [](const GoldenCaseSpec& a, const GoldenCaseSpec& b) { return a.name < b.name; });
  return cases;
}

}  // namespace

std::span<const GoldenCaseSpec> GoldenCatalog() {
  static const std::vector<GoldenCaseSpec> catalog = Build();
  return catalog;
}

const GoldenCaseSpec* FindGoldenCase(std::string_view name) {
  for (const auto& c : GoldenCatalog()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

}  // namespace attest
