// The suite table and case instantiation (see suite.h). Tile boundaries refer to the tiles
// of FlashAttention-2 on sm80 (kernels/models/flash_engine.h: forward 128 x 64, backward
// 64 x 128), the tiles most production kernels share.
#include "run/suite.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "run/case_gen.h"
#include "reference/formats/format.h"
#include "reference/problem/paged.h"
#include "verify/checks/check.h"
#include "run/suite_coverage.h"

namespace attest {
namespace {

Problem P(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d = 64,
          int64_t dv = -1) {
  Problem p;
  p.batch = b;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = d;
  p.head_dim_v = dv < 0 ? d : dv;
  p.dtype = DType::kBF16;
  return p;
}

Problem Causal(Problem p, CausalAlign align = CausalAlign::kBottomRight) {
  p.causal = true;
  p.causal_align = align;
  return p;
}

Problem Window(Problem p, int64_t left, int64_t right) {
  p.window_left = left;
  p.window_right = right;
  return p;
}

Problem Scaled(Problem p, double scale) {
  p.scale = scale;
  return p;
}

Problem Softcap(Problem p, double cap) {
  p.softcap = cap;
  return p;
}

// ALiBi slopes of Press et al. (arXiv 2108.12409): 2^(-8 (h + 1) / H).
Problem Alibi(Problem p) {
  std::vector<double> slopes;
  for (int64_t h = 0; h < p.heads_q; ++h) {
    slopes.push_back(std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(p.heads_q)));
  }
  p.alibi_slopes = slopes;
  return p;
}

// Packed sequences of the given lengths (batch = number of sequences).
Problem Varlen(Problem p, const std::vector<int32_t>& q_lens, const std::vector<int32_t>& k_lens) {
  std::vector<int32_t> cq = {0}, ck = {0};
  for (int32_t l : q_lens) cq.push_back(cq.back() + l);
  for (int32_t l : k_lens) ck.push_back(ck.back() + l);
  p.batch = static_cast<int64_t>(q_lens.size());
  p.seqlen_q = *std::max_element(q_lens.begin(), q_lens.end());
  p.seqlen_k = *std::max_element(k_lens.begin(), k_lens.end());
  p.cu_seqlens_q = cq;
  p.cu_seqlens_k = ck;
  return p;
}

// Two documents per sequence, split at the given fractions of Sq and Sk.
Problem Documents(Problem p) {
  std::vector<std::vector<int32_t>> dq, dk;
  for (int64_t b = 0; b < p.batch; ++b) {
    std::vector<int32_t> q(static_cast<size_t>(p.seqlen_q)), k(static_cast<size_t>(p.seqlen_k));
    for (int64_t i = 0; i < p.seqlen_q; ++i) q[static_cast<size_t>(i)] = i < p.seqlen_q / 3 ? 0 : 1;
    for (int64_t j = 0; j < p.seqlen_k; ++j) k[static_cast<size_t>(j)] = j < p.seqlen_k / 3 ? 0 : 1;
    dq.push_back(q);
    dk.push_back(k);
  }
  p.document_ids_q = dq;
  p.document_ids_k = dk;
  return p;
}

GeneratorSpec Gaussian(nlohmann::json params = nlohmann::json::object()) {
  return {"gaussian", 0, std::move(params)};
}

// A learnable sink (Problem::sink; docs/semantics.md "Learnable sink").
Problem Sink(Problem p) {
  p.sink = true;
  return p;
}

// A learnable relative bias (Problem::rel_bias; docs/semantics.md "Learnable relative bias").
Problem RelBias(Problem p) {
  p.rel_bias = true;
  return p;
}

// Scores of order 1e4: q, k ~ N(0, 100^2) give scale * q.k ~ N(0, (100^2)^2 D / D) = 1e4^2.
GeneratorSpec HugeLogits() {
  return Gaussian({{"q", {{"std", 100.0}}}, {"k", {{"std", 100.0}}}});
}

// Values at the edges of the dtype: q at a few times its smallest subnormal (scores vanish,
// softmax is uniform), v up to its largest finite value, capped where a correct fp32
// accumulation of Sk unnormalised terms of Dv-long dot products could overflow (2^-2 fp32 max
// / (Sk Dv)); dO small enough that dP = dO.V and dS stay finite in the dtype.
void FormatEdge(Case& c) {
  const Problem& p = c.problem;
  const Format f = FormatOf(p.dtype).value_or(Format::kF32);
  const double tiny = 4 * MinPositive(f);
  const double vmax = std::min(
      MaxFinite(f), 0.25 * static_cast<double>(std::numeric_limits<float>::max()) /
                        static_cast<double>(p.seqlen_k * p.head_dim_v));
  c.generator = GeneratorSpec{
      "uniform", c.generator->seed,
      {{"q", {{"low", -tiny}, {"high", tiny}}},
       {"k", {{"low", -1.0}, {"high", 1.0}}},
       {"v", {{"low", -vmax}, {"high", vmax}}},
       {"do", {{"low", -1e-4}, {"high", 1e-4}}}}};
}

struct Builder {
  std::vector<SuiteRow> rows;
  uint64_t next_seed = 1;

  void Add(std::initializer_list<const char*> checks, CaseTemplate t) {
    const uint64_t seed = next_seed++;
    for (const char* c : checks) rows.push_back({c, t, seed});
  }
  void Add(std::initializer_list<const char*> checks, std::string label, Problem p,
           GeneratorSpec g = Gaussian()) {
    CaseTemplate t{std::move(label), std::move(p), std::move(g), {}, true};
    t.intent.order = StatesOrder(t.label);
    Add(checks, std::move(t));
  }
  // A label that names the order of Sq and Sk ("Sq<Sk", "Sq>>Sk") or empty rows (causal with
  // Sq > Sk) states that order as the row's purpose: a kernel whose shape limits cannot keep
  // it skips the row rather than run it at Sq = Sk.
  static bool StatesOrder(std::string_view label) {
    return label.find("Sq<") != std::string_view::npos ||
           label.find("Sq>") != std::string_view::npos ||
           label.find("empty rows") != std::string_view::npos;
  }
  // A row for the honesty check: the problem is not adapted to the kernel's head dims and
  // features (its dtype is, unless `finish` changes it).
  void Honesty(std::string label, Problem p, std::function<void(Case&)> finish = {}) {
    Add({"honesty"}, CaseTemplate{std::move(label), std::move(p), Gaussian(), std::move(finish),
                                  false});
  }
};

constexpr auto kAcc = "accuracy";
constexpr auto kUnw = "unwritten-outputs";
constexpr auto kSpec = "special-values";
constexpr auto kDet = "determinism";
constexpr auto kGqa = "gqa-mha";
constexpr auto kPerm = "permutation";
constexpr auto kWin = "window-causal";
constexpr auto kPad = "padding";
constexpr auto kLeak = "non-interference";  // verify/checks/noninterference.h (engineer "leak")
constexpr auto kCons = "consistency";       // verify/checks/consistency.h (engineer "leak")
constexpr auto kLay = "layouts";            // verify/checks/layouts.h
constexpr auto kBias = "bias";              // verify/checks/bias.h

// A learnable sink (docs/semantics.md "Learnable sink"): GQA heads with their own sinks, empty
// rows (lse = sink, o = 0), a packed batch, and the special values a sink takes (1e30: o = 0,
// lse = sink in every row; -inf: no sink in that head). Sinks drawn around 2.5 weigh about as
// much as a tenth of a row's keys, so a kernel that leaves the sink out of o, lse or dsink is
// far outside the tolerance. Kernels that do not claim sinks skip the rows. Appended after
// the other rows so that their seeds stay what they were.
void SinkRows(Builder& s) {
  const GeneratorSpec drawn = Gaussian({{"sink", {{"mean", 2.5}, {"std", 1.0}}}});
  s.Add({kAcc, kSpec, kLeak, kCons}, "sink GQA 8:2 causal batch 2",
        Sink(Causal(P(2, 8, 2, 96, 96))), drawn);
  s.Add({kAcc, kSpec, kUnw, kCons}, "sink causal Sq>Sk (empty rows)", Sink(Causal(P(1, 2, 2, 130, 77))),
        drawn);
  s.Add({kAcc, kSpec, kLeak}, "sink varlen causal",
        Sink(Causal(Varlen(P(1, 2, 2, 1, 1), {65, 1, 20}, {40, 129, 20}))), drawn);
  s.Add({kAcc, kSpec}, "sink 1e30, -inf, 0.5, -2 causal Sq>Sk",
        Sink(Causal(P(1, 4, 2, 100, 60))),
        Gaussian({{"sink", {{"values", {1e30, "-inf", 0.5, -2.0}}}}}));
}

// A learnable relative bias (docs/semantics.md "Learnable relative bias"): GQA heads with their
// own tables under a small softcap (the bias must follow it), a packed batch (the bias indexed
// by sequence-local positions), and with a sink too, over empty rows. Tables drawn with std 2
// move a score by about as much as the scores themselves, so a kernel that drops, shifts or
// misplaces the bias, or returns a wrong drel_bias, is far outside the tolerance. Kernels that do
// not claim a relative bias skip the rows. Appended after the other rows so that their seeds
// stay what they were.
void RelBiasRows(Builder& s) {
  const GeneratorSpec drawn = Gaussian({{"rel_bias", {{"std", 2.0}}}});
  s.Add({kAcc, kSpec, kLeak}, "rel_bias GQA 8:2 causal softcap 5 batch 2",
        RelBias(Softcap(Causal(P(2, 8, 2, 96, 96)), 5)), drawn);
  s.Add({kAcc, kSpec, kLeak, kUnw}, "rel_bias varlen causal",
        RelBias(Causal(Varlen(P(1, 2, 2, 1, 1), {65, 1, 20}, {40, 129, 20}))), drawn);
  s.Add({kAcc, kSpec}, "rel_bias sink causal Sq>Sk (empty rows)",
        RelBias(Sink(Causal(P(1, 4, 2, 100, 60)))),
        Gaussian({{"rel_bias", {{"std", 2.0}}}, {"sink", {{"mean", 2.5}, {"std", 1.0}}}}));
}

void QuickRows(Builder& s) {
  s.Add({kAcc, kUnw, kSpec, kDet, kGqa, kPerm, kWin, kLeak, kCons}, "GQA causal Sq<Sk batch 2",
        Causal(P(2, 4, 2, 77, 130)));
  s.Add({kAcc, kSpec}, "causal Sq>Sk (empty rows)", Causal(P(1, 2, 2, 130, 65)));
  s.Add({kAcc, kSpec, kUnw, kPad}, "varlen with zero-length documents",
        Varlen(P(1, 4, 2, 1, 1), {37, 0, 63}, {50, 30, 0}));
  s.Add({kSpec}, "huge logits (scores ~1e4)", P(1, 2, 2, 64, 96), HugeLogits());
  s.Honesty("softcap", Softcap(P(1, 2, 2, 64, 64), 30));
  // A scale of its own (ScaleRows below says why).
  s.Add({kAcc}, "scale 1/sqrt(192) (MLA)", Scaled(P(1, 2, 2, 64, 64), 1.0 / std::sqrt(192.0)));
  // A learnable sink with empty rows (SinkRows below says why the sinks are drawn near 2.5).
  s.Add({kAcc, kSpec}, "sink causal Sq>Sk (empty rows)", Sink(Causal(P(1, 2, 2, 100, 64))),
        Gaussian({{"sink", {{"mean", 2.5}, {"std", 1.0}}}}));
}

void GateRows(Builder& s) {
  // Shapes: Sq != Sk both ways, batch > 1, dense and causal. non-interference on the dense
  // batch: every other sequence is protected, so a kernel that claims no mask at all (cuDNN's
  // FP8 forward on Hopper) still gets a leak verdict, and a scale shared across the batch (one
  // current amax per tensor) leaks there.
  s.Add({kAcc, kUnw, kDet, kPerm, kCons, kLeak, kLay, kBias}, "dense batch 2",
        P(2, 4, 4, 128, 128));
  s.Add({kAcc, kUnw, kSpec, kWin, kLeak, kPad, kLay}, "causal Sq<Sk", Causal(P(1, 2, 2, 77, 130)));
  s.Add({kAcc, kUnw, kSpec, kWin, kLeak}, "causal Sq>Sk (empty rows)",
        Causal(P(1, 2, 2, 130, 77)));
  // (window-causal: a window reaching past every key must be no window; flash-attention #895
  // clamped such bounds to seqlen_k, which drops keys once Sq > Sk.)
  s.Add({kAcc, kWin}, "dense Sq>>Sk", P(1, 2, 2, 200, 33));
  s.Add({kAcc}, "dense Sq<<Sk", P(1, 2, 2, 17, 300));
  s.Add({kAcc, kPerm, kDet, kCons, kLay, kBias}, "causal batch 3", Causal(P(3, 2, 2, 96, 96)));
  // Tile boundaries +-1 of 64 and 128.
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{63, 63}, {65, 65}, {64, 129}, {127, 128},
                        {129, 127}, {1, 129}, {129, 1}}) {
    s.Add({kAcc, kUnw}, fmt::format("tile boundary {}x{}", sq, sk), P(1, 2, 1, sq, sk));
    s.Add({kAcc}, fmt::format("tile boundary {}x{} causal", sq, sk), Causal(P(1, 2, 2, sq, sk)));
  }
  // GQA / MQA.
  s.Add({kAcc, kGqa, kPerm, kLeak, kCons, kLay, kBias}, "GQA 8:2 causal batch 2",
        Causal(P(2, 8, 2, 96, 96)));
  s.Add({kAcc, kGqa}, "MQA 4:1", P(1, 4, 1, 64, 100));
  // Dv != D.
  s.Add({kAcc, kUnw, kPerm, kCons, kLay, kBias}, "Dv < D", P(2, 2, 2, 70, 90, 64, 32));
  s.Add({kAcc}, "Dv > D causal", Causal(P(1, 2, 2, 70, 90, 32, 64)));
  // Packed variable length with zero-length documents (q-empty and k-empty).
  s.Add({kAcc, kSpec, kUnw, kPerm, kLeak, kPad}, "varlen zero-length documents",
        Varlen(P(1, 4, 2, 1, 1), {37, 0, 63}, {50, 30, 0}));
  s.Add({kAcc, kSpec, kWin, kLeak, kCons, kPerm, kPad, kLay, kBias}, "varlen causal",
        Causal(Varlen(P(1, 2, 2, 1, 1), {65, 1, 20}, {40, 129, 20})));
  // Windows.
  s.Add({kAcc, kSpec, kLeak}, "window (32, 0)", Window(P(1, 2, 2, 150, 150), 32, 0));
  s.Add({kAcc, kLeak}, "window (16, 16) Sq<Sk", Window(P(1, 2, 2, 100, 160), 16, 16));
  s.Add({kAcc, kSpec}, "window (-1, 8) causal Sq>Sk", Window(Causal(P(1, 2, 2, 140, 70)), -1, 8));
  // A left-only window with Sq > Sk: flash-attention #895 clamped the unbounded right side to
  // seqlen_k, which drops visible keys once the bottom-right diagonal starts below zero.
  s.Add({kAcc, kLeak}, "window (16, -1) Sq>Sk", Window(P(1, 2, 2, 140, 70), 16, -1));
  // Score modifiers.
  s.Add({kAcc, kCons}, "softcap 30", Softcap(P(1, 2, 2, 96, 96), 30));
  s.Add({kAcc}, "softcap 20 causal", Softcap(Causal(P(1, 2, 2, 80, 120)), 20));
  s.Add({kAcc, kPerm}, "ALiBi batch 2", Alibi(P(2, 4, 2, 90, 90)));
  s.Add({kAcc, kLeak, kCons}, "ALiBi causal Sq>Sk", Alibi(Causal(P(1, 4, 4, 120, 80))));
  // Causal in both alignments.
  s.Add({kAcc, kSpec, kWin, kLeak}, "causal top-left Sq<Sk",
        Causal(P(1, 2, 2, 70, 140), CausalAlign::kTopLeft));
  s.Add({kAcc, kSpec}, "causal top-left Sq>Sk",
        Causal(P(1, 2, 2, 140, 70), CausalAlign::kTopLeft));
  // Document masks.
  s.Add({kAcc, kSpec, kLeak, kPad}, "two documents causal", Causal(Documents(P(2, 2, 2, 90, 90))));
  // Special values. Huge logits get no accuracy row: with a near-one-hot softmax, dq and dk
  // are cancellations of terms ~1e4 times larger than the result, so a correct kernel that
  // rounds dS to bf16 (FlashAttention-2) is 18x over the profile's result-scaled floor
  // (measured on cpu/flash2-bf16); what must hold there is finiteness.
  s.Add({kSpec}, "huge logits (scores ~1e4)", P(1, 2, 2, 64, 96), HugeLogits());
  s.Add({kSpec}, "huge logits causal", Causal(P(1, 2, 2, 96, 64)), HugeLogits());
  s.Add({kSpec, kAcc},
        CaseTemplate{"format-edge values", P(1, 2, 2, 64, 128), Gaussian(), FormatEdge, true});
  // Blocks of zeros: amax 0 in every block of V (a scale of 0 must not divide 0 by 0;
  // ROCm/aiter #4289). o is exactly 0 and dv exactly P^T dO.
  s.Add({kSpec, kAcc}, "zero V (amax-0 blocks)", P(1, 2, 2, 64, 96), Gaussian({{"v", {{"std", 0.0}}}}));
  // Honesty: features a kernel may or may not claim.
  s.Honesty("softcap", Softcap(P(1, 2, 2, 64, 64), 30));
  s.Honesty("ALiBi", Alibi(P(1, 2, 2, 64, 64)));
  s.Honesty("head dim 96", P(1, 2, 2, 64, 64, 96));
  s.Honesty("head dim 256, Dv 64", P(1, 1, 1, 40, 40, 256, 64));
  s.Honesty("varlen", Varlen(P(1, 2, 2, 1, 1), {20, 30}, {25, 35}));
  s.Honesty("window (8, 8)", Window(P(1, 2, 2, 64, 64), 8, 8));
  s.Honesty("GQA 4:1", P(1, 4, 1, 48, 48));
  s.Honesty("dtype f32", P(1, 2, 2, 48, 48), [](Case& c) { c.problem.dtype = DType::kF32; });
}

// Realistic lengths (FlashAttention's tests use up to 2048; head dim 128 is the common size).
void LongRows(Builder& s) {
  s.Add({kAcc, kUnw, kDet, kCons}, "long causal D128", Causal(P(1, 4, 2, 1024, 1024, 128)));
  s.Add({kAcc, kPerm}, "long dense D128 batch 2", P(2, 2, 2, 512, 640, 128));
  s.Add({kAcc, kSpec, kGqa, kLeak}, "long window GQA", Window(Causal(P(1, 8, 2, 700, 900, 128)), 256, 0));
  s.Add({kAcc, kSpec}, "long varlen",
        Varlen(P(1, 4, 4, 1, 1, 128), {300, 0, 513, 1}, {257, 64, 513, 0}));
}

// The softmax scale as a dimension of its own: a kernel that ignores its `scale` argument
// (using 1/sqrt(D)) passes every default-scale row, so accuracy rows carry scales that differ
// from it: MLA's 1/sqrt(192) (DeepSeek-V2, arXiv 2405.04434: the query and key head dim 192
// = 128 + 64 RoPE dims, taken by D = 128 kernels), a scale above 1 with small q (scores of
// order 1), and a tiny one (a near-uniform softmax). Appended after the gate's other rows so
// that their seeds stay what they were.
void ScaleRows(Builder& s) {
  s.Add({kAcc, kCons}, "scale 1/sqrt(192) (MLA) D128",
        Scaled(P(1, 2, 2, 96, 96, 128), 1.0 / std::sqrt(192.0)));
  s.Add({kAcc, kLeak}, "scale 2 causal",
        Scaled(Causal(P(1, 2, 2, 128, 128)), 2.0), Gaussian({{"q", {{"std", 0.125}}}}));
  s.Add({kAcc}, "scale 2^-10", Scaled(P(2, 2, 2, 64, 64), 0x1p-10));
}

// One mask in each form a mask API takes (Problem::mask_form: boolean, additive in the input
// dtype, additive in float32), each its own row, so that every form is judged against the same
// oracle: a backend that treats a boolean mask as additive, reinterprets a float32 mask or
// fills hidden positions with a finite value fails the row of that form alone. The rows apply
// to kernels that declare mask_forms (PyTorch SDPA's attn_mask); appended after the other rows
// so that their seeds stay what they were.
Problem MaskForm(Problem p, const char* form) {
  p.mask_form = form;
  return p;
}

void MaskFormRows(Builder& s) {
  for (const char* form : kMaskForms) {
    s.Add({kAcc, kLeak, kSpec}, fmt::format("window (32, 0), mask as {}", form),
          MaskForm(Window(P(1, 2, 2, 150, 150), 32, 0), form));
    s.Add({kAcc, kLeak, kSpec}, fmt::format("two documents causal, mask as {}", form),
          MaskForm(Causal(Documents(P(2, 2, 2, 90, 90))), form));
  }
}

// Causal in the top-left alignment on a packed batch, each sequence on its own diagonal (one
// with q_len < k_len, one with q_len > k_len): what PyTorch SDPA documents `is_causal` to be
// and the only causal form its nested jagged tensors take. A kernel that aligns each packed
// sequence bottom-right (FlashAttention's convention) under a top-left claim fails here.
// Appended after the other rows so that their seeds stay what they were.
void AlignmentRows(Builder& s) {
  s.Add({kAcc, kLeak, kSpec}, "varlen causal top-left",
        Causal(Varlen(P(1, 2, 2, 1, 1), {12, 20, 40}, {20, 33, 11}), CausalAlign::kTopLeft));
}

// Paged KV and seqused (docs/semantics.md "Paged KV and seqused"): k, v in a page pool read
// through a table that runs backwards and interleaves the sequences (paged.h
// FillPagedDefaults), with NaN, +-30000 and other sequences' rows wherever nothing may be read
// (the generator's default), and queries and keys past seqused. The first row's used key
// lengths fill whole pages; the second ends sequences inside a page, so a kernel that reads a
// last page whole reads the slots past seqused_k. Kernels that claim neither capability skip
// them. The checks run on the logical view (run/logical_view.h); layouts relates the paged
// call to the contiguous one. No special-values row: the paged mutants' NaN reads would fail
// it before non-interference, which names their bug (docs/kernels.md); logical_view_test
// and fuzzing run it on paged cases. Appended after the other rows so that their seeds stay what
// they were.
Problem Paged(Problem p, int64_t page_size, std::vector<int32_t> used_q,
              std::vector<int32_t> used_k) {
  p.page_size = page_size;
  p.seqused_q = std::move(used_q);
  p.seqused_k = std::move(used_k);
  FillPagedDefaults(p);
  return p;
}

void PagedRows(Builder& s) {
  s.Add({kAcc, kUnw, kDet, kLeak, kCons, kLay}, "paged KV, seqused, GQA causal batch 3",
        Paged(Causal(P(3, 4, 2, 50, 100)), 16, {50, 7, 33}, {64, 32, 96}));
  s.Add({kAcc, kLeak, kLay}, "paged KV, last pages partial",
        Paged(Window(P(2, 2, 2, 40, 70), 24, 8), 16, {40, 25}, {37, 70}));
}

void FullRows(Builder& s) {
  GateRows(s);
  LongRows(s);
  s.Add({kAcc, kDet}, "2k causal GQA batch 2", Causal(P(2, 8, 2, 2048, 2048, 128)));
  s.Add({kAcc, kSpec}, "2k window softcap", Softcap(Window(P(1, 4, 4, 2048, 2048, 128), 512, 0), 30));
  s.Add({kAcc}, "2k ALiBi Sq<Sk", Alibi(P(1, 4, 4, 1000, 2048, 128)));
  // The gate's rows again with two more sets of seeds.
  for (uint64_t first : {1000u, 2000u}) {
    Builder again;
    again.next_seed = first;
    GateRows(again);
    LongRows(again);
    ScaleRows(again);
    MaskFormRows(again);
    AlignmentRows(again);
    PagedRows(again);
    for (SuiteRow& r : again.rows) s.rows.push_back(std::move(r));
  }
  ScaleRows(s);
  MaskFormRows(s);
  AlignmentRows(s);
  SinkRows(s);
  PagedRows(s);
  RelBiasRows(s);
}

// Packed documents summing to `total` tokens, causal: each of the given long documents after a
// run of five 1-3 token documents, then documents of `fill` tokens (each after one 1-token
// document), the last one shorter.
Problem PackedDocuments(Problem p, const std::vector<int32_t>& long_docs, int32_t fill,
                        int32_t total) {
  std::vector<int32_t> lens;
  int32_t used = 0, tiny = 1;
  auto push = [&](int32_t l) {
    l = std::min(l, total - used);
    if (l <= 0) return;
    lens.push_back(l);
    used += l;
  };
  for (int32_t l : long_docs) {
    for (int r = 0; r < 5; ++r, tiny = tiny % 3 + 1) push(tiny);  // 1, 2, 3, 1, 2 tokens
    push(l);
  }
  while (used < total) {
    push(1);
    push(fill);
  }
  return Causal(Varlen(std::move(p), lens, lens));
}

// The long suite (docs/checks.md "Sampled rows"; times in docs/long-suite.md): 8k to 128k
// tokens, sampled (verify/metrics/sample.h ShouldSample), forward judged. Heads are few and the 128k
// rows use masks whose visible pairs are modest (a sliding window, packed documents): the CPU
// models compute the whole attention, and the suite must finish in 10 minutes on 2 cores (a
// full-causal 128k row cannot: docs/long-suite.md).
void LongSuiteRows(Builder& s) {
  s.Add({kAcc, kUnw, kSpec}, "8k causal D128", Causal(P(1, 2, 2, 8192, 8192, 128)));
  s.Add({kAcc, kLeak}, "8k causal GQA 4:1 D64 Sq<Sk", Causal(P(1, 4, 1, 6000, 8192, 64)));
  s.Add({kAcc}, "8k window (1024, 0) D256", Window(Causal(P(1, 2, 2, 8192, 8192, 256)), 1024, 0));
  s.Add({kAcc, kSpec}, "32k window (2048, 0) GQA 2:1 D128",
        Window(Causal(P(1, 2, 1, 32768, 32768, 128)), 2048, 0));
  s.Add({kAcc, kLeak}, "32k window (512, 512) D64",
        Window(P(1, 1, 1, 32768, 32768, 64), 512, 512));
  s.Add({kAcc}, "32k causal D64", Causal(P(1, 1, 1, 32768, 32768, 64)));
  s.Add({kAcc}, "32k window (1024, 0) D256",
        Window(Causal(P(1, 1, 1, 32768, 32768, 256)), 1024, 0));
  s.Add({kAcc, kUnw, kSpec}, "128k window (4096, 0) D128",
        Window(Causal(P(1, 1, 1, 131072, 131072, 128)), 4096, 0));
  s.Add({kAcc}, "128k window (1024, 0) GQA 2:1 D64",
        Window(Causal(P(1, 2, 1, 131072, 131072, 64)), 1024, 0));
  s.Add({kAcc, kUnw, kSpec}, "128k packed documents: 1-3 tokens, 32k, 16k, 8k, 4k, 2k D128",
        PackedDocuments(P(1, 1, 1, 1, 1, 128), {32768, 16384, 8192, 8192, 4096, 4096}, 2048,
                        131072));
  // Split-KV shapes: a few queries against a long cache (bottom-right causal: every query
  // sees nearly every key). Cheap enough to judge every row (ShouldSample: at most 8.6e9).
  s.Add({kAcc, kUnw}, "split-KV Sq1 Sk128k GQA 8:1 D128", Causal(P(1, 8, 1, 1, 131072, 128)));
  s.Add({kAcc}, "split-KV Sq64 Sk128k GQA 4:1 D128", Causal(P(1, 4, 1, 64, 131072, 128)));
  s.Add({kAcc}, "split-KV Sq16 Sk32k batch 2 D256", Causal(P(2, 2, 2, 16, 32768, 256)));
}

// Split-KV rows (Capabilities::num_splits): shapes where the split matters (a few queries
// against many key tiles, splits that see no key of a row, packed sequences of which one has no
// keys), each run once per declared count with that count in the problem, judged against the
// oracle, and once by splits-agree, which runs every count itself. The seed is the template's,
// so every count sees the same inputs. Only for kernels that declare two counts or more.
// The last template has a learnable sink (a combine must add it once, not once per split:
// docs/semantics.md "Split-KV count"); drawn near 2.5 as SinkRows says why.
std::vector<CaseTemplate> SplitTemplates() {
  std::vector<CaseTemplate> t;
  auto add = [&](std::string label, Problem p) {
    nlohmann::json g = {{"q", {{"std", 2.0}}}};
    if (p.sink) g["sink"] = {{"mean", 2.5}, {"std", 1.0}};
    t.push_back(CaseTemplate{std::move(label), std::move(p), Gaussian(std::move(g)), {}, true});
  };
  add("split-KV decode GQA 8:2 batch 2", Causal(P(2, 8, 2, 1, 300)));
  add("split-KV causal Sq<Sk", Causal(P(1, 2, 2, 77, 450)));
  add("split-KV window (100, 0)", Window(P(1, 2, 2, 64, 400), 100, 0));
  add("split-KV varlen causal", Causal(Varlen(P(1, 4, 2, 1, 1), {5, 0, 40, 3}, {300, 70, 0, 129})));
  add("split-KV decode sink GQA 8:2 batch 2", Sink(Causal(P(2, 8, 2, 1, 300))));
  return t;
}
constexpr uint64_t kSplitSeed = 200000;

std::vector<SuiteRow> SplitRows(const Capabilities& caps) {
  std::vector<SuiteRow> rows;
  if (caps.num_splits.size() < 2) return rows;
  uint64_t seed = kSplitSeed;
  for (const CaseTemplate& t : SplitTemplates()) {
    ++seed;
    for (int64_t n : caps.num_splits) {
      CaseTemplate each = t;
      each.label = fmt::format("{}, num_splits {}", t.label, n);
      each.problem.num_splits = n;
      for (const char* check : {kAcc, kUnw, kSpec, kLeak}) rows.push_back({check, each, seed});
    }
    rows.push_back({"splits-agree", t, seed});
  }
  return rows;
}

// The gate's fuzz tail: cases of the fuzz engine at a CPU model's few milliseconds each.
constexpr int64_t kGateFuzzCases = 48;
// Seeds of generated coverage rows: above every table row's (the full suite's reach 2000+).
constexpr uint64_t kCoverageSeed = 100000;

std::vector<Suite> BuildSuites() {
  std::vector<Suite> t;
  Builder quick, gate, full, long_rows;
  QuickRows(quick);
  long_rows.next_seed = 5000;
  LongSuiteRows(long_rows);
  GateRows(gate);
  LongRows(gate);
  ScaleRows(gate);
  MaskFormRows(gate);
  AlignmentRows(gate);
  SinkRows(gate);
  PagedRows(gate);
  RelBiasRows(gate);
  FullRows(full);
  t.push_back({"quick", "a few cases per check family (< 30 s for a CPU model)",
               std::move(quick.rows)});
  t.push_back({"gate",
               "the merge gate: shapes, tile boundaries, GQA, Dv != D, varlen, windows, softcap, "
               "ALiBi, both causal alignments, special values, honesty; every claimed feature "
               "pair and length boundary; a fixed-seed fuzz tail (< 5 min for a CPU model)",
               std::move(gate.rows), true, kGateFuzzCases});
  t.push_back({"full", "gate plus long sequences, head dim 128 and a second set of seeds",
               std::move(full.rows), true, kGateFuzzCases});
  t.push_back({"long",
               "8k-128k tokens on sampled rows (verify/metrics/sample.h), forward judged: causal, "
               "sliding windows, packed documents of 1-3 tokens and of 16k, GQA, D 64-256, "
               "split-KV shapes (< 10 min for cpu/flash2-bf16 on 2 cores)",
               std::move(long_rows.rows), false, 0, true});
  return t;
}

template <class T>
bool Allows(const std::vector<T>& list, const T& x) {
  return list.empty() || std::find(list.begin(), list.end(), x) != list.end();
}

int64_t Nearest(const std::vector<int64_t>& list, int64_t x) {
  int64_t best = list.front();
  for (int64_t v : list) {
    if (std::llabs(v - x) < std::llabs(best - x)) best = v;
  }
  return best;
}

}  // namespace

std::span<const Suite> AllSuites() {
  static const std::vector<Suite> kTable = BuildSuites();
  return kTable;
}

const Suite* FindSuite(std::string_view name) {
  for (const Suite& s : AllSuites()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::vector<SuiteRow> FuzzTailRows(const Capabilities& caps, uint64_t run_seed, int64_t cases) {
  std::vector<SuiteRow> rows;
  const std::vector<const CheckInfo*> checks = DrawnChecks(caps);
  for (int64_t n = 0; n < cases; ++n) {
    // The picks of run/fuzz.cc DrawFuzzCase over the checks drawn for the kernel (fuzz_test.cc
    // checks that the two agree): the check first, then the case.
    PhiloxPicker pick(MixSeed(run_seed, static_cast<uint64_t>(n)));
    const CheckInfo& check =
        *checks[static_cast<size_t>(pick.Int(0, static_cast<int64_t>(checks.size()) - 1))];
    Case c = DrawCase(caps, pick);
    if (check.name == "non-interference") DrawPaging(caps, pick, c.problem);
    const GeneratorSpec g = *c.generator;
    CaseTemplate t{fmt::format("fuzz case {} (attest fuzz --seed {})", n, run_seed), c.problem,
                   g, [g](Case& x) { x.generator = g; }, true};
    rows.push_back({std::string(check.name), std::move(t), 0});
  }
  return rows;
}

std::vector<SuiteRow> RowsFor(const Suite& suite, const Capabilities& caps, uint64_t run_seed) {
  std::vector<SuiteRow> rows = suite.rows;
  if (suite.cover_capabilities) {
    for (SuiteRow& r : CoverageRows(suite.rows, caps, kCoverageSeed)) rows.push_back(std::move(r));
    for (SuiteRow& r : SplitRows(caps)) rows.push_back(std::move(r));
  }
  for (SuiteRow& r : FuzzTailRows(caps, run_seed, suite.fuzz_cases)) rows.push_back(std::move(r));
  return rows;
}

uint64_t MixSeed(uint64_t run_seed, uint64_t row_seed) {
  // SplitMix64 (Steele, Lea, Flood, OOPSLA 2014) of the pair.
  uint64_t z = run_seed * 0x9E3779B97F4A7C15ull + row_seed + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string DescribeProblem(const Problem& p) {
  std::string s = fmt::format("B{} H{}:{} Sq{} Sk{} D{}", p.batch, p.heads_q, p.heads_kv,
                              p.seqlen_q, p.seqlen_k, p.head_dim);
  if (p.head_dim_v != p.head_dim) s += fmt::format(" Dv{}", p.head_dim_v);
  s += fmt::format(" {}", Name(p.dtype));
  if (p.causal) s += p.causal_align == CausalAlign::kTopLeft ? " causal(top-left)" : " causal";
  if (p.window_left >= 0 || p.window_right >= 0) {
    s += fmt::format(" window({}, {})", p.window_left, p.window_right);
  }
  if (p.softcap > 0) s += fmt::format(" softcap {}", p.softcap);
  if (p.alibi_slopes) s += " alibi";
  if (p.varlen()) s += " varlen";
  if (p.document_ids_q) s += " documents";
  if (p.prefix_lm > 0) s += fmt::format(" prefix {}", p.prefix_lm);
  if (p.block_sparse) s += " block-sparse";
  if (!p.mask_form.empty()) s += " mask " + p.mask_form;
  if (p.sink) s += " sink";
  if (p.rel_bias) s += " rel_bias";
  if (p.num_splits != 0) s += fmt::format(" splits {}", p.num_splits);
  if (p.paged()) s += fmt::format(" paged({})", p.page_size);
  if (p.seqused_q || p.seqused_k) s += " seqused";
  return s;
}

InstantiatedCase Instantiate(const SuiteRow& row, const Capabilities& caps, uint64_t run_seed) {
  const CaseTemplate& t = row.case_template;
  InstantiatedCase out;
  Problem p = t.problem;
  // 1. The kernel's dtype (every row; honesty rows may override it in `finish`).
  if (!caps.dtypes.empty() && !Allows(caps.dtypes, p.dtype)) p.dtype = caps.dtypes.front();
  // 2. Head dims it supports, keeping Dv = D cases square.
  if (t.adapt) {
    const bool square = p.head_dim_v == p.head_dim;
    if (!Allows(caps.head_dims, p.head_dim)) p.head_dim = Nearest(caps.head_dims, p.head_dim);
    if (square) p.head_dim_v = p.head_dim;
    if (!Allows(caps.head_dims_v, p.head_dim_v) && square) {
      p.head_dim_v = Nearest(caps.head_dims_v, p.head_dim_v);
    }
  }
  // 2b. A kernel whose diagonal rules are top-left only (kernel.h causal_top_left_only: SDPA's
  // is_causal on nested jagged tensors) gets the row's diagonal top-left: the same row on the
  // one alignment that kernel can state, as run/case_gen.cc aligns drawn cases. Equal lengths
  // mean the same mask either way; honesty rows keep theirs (a refusal is what they judge).
  const bool diagonal = p.causal || p.window_left >= 0 || p.window_right >= 0 ||
                        p.alibi_slopes.has_value();  // kernel.cc Capabilities::Covers
  if (t.adapt && caps.causal_top_left_only && diagonal &&
      p.causal_align == CausalAlign::kBottomRight) {
    p.causal_align = CausalAlign::kTopLeft;
  }
  // 3. Shape limits: the nearest legal shape that keeps what the row is for.
  std::string moved;
  if (caps.shapes.any()) {
    Problem fitted = p;
    const std::string why = FitShape(fitted, caps.shapes, t.adapt ? t.intent : kAnyShape);
    if (why.empty()) {
      if (fitted != p) {
        moved = fmt::format(" (moved inside the kernel's shape limits from B{} Sq{} Sk{})", p.batch,
                            p.seqlen_q, p.seqlen_k);
      }
      p = std::move(fitted);
    } else if (t.adapt) {
      out.label = t.label + ": " + DescribeProblem(p);
      out.skipped = "shape limits: " + why;
      return out;
    }
  }
  Case c;
  c.problem = p;
  c.generator = t.generator;
  c.generator->seed = MixSeed(run_seed, row.seed);
  if (t.finish) t.finish(c);
  out.label = t.label + ": " + DescribeProblem(c.problem) + moved;
  if (Status s = Validate(c.problem); !s.ok()) {
    out.skipped = "invalid suite case: " + s.error().message;
    return out;
  }
  // 4. Features: rows outside the capabilities are skipped, except honesty rows.
  std::string why;
  if (t.adapt && !caps.Covers(c.problem, &why)) {
    out.skipped = "the kernel does not claim " + why;
    return out;
  }
  out.c = std::move(c);
  return out;
}

}  // namespace attest
