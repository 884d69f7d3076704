// The mutant catalogue (see mutants.h; bug sources in docs/references.md and in each
// row's `bug` text; docs/kernels.md "Mutants").
#include "kernels/mutants/mutants.h"

#include <utility>

#include <nlohmann/json.hpp>

#include "kernels/models/flash_models.h"
#include "kernels/models/lowp_models.h"
#include "reference/problem/paged.h"

namespace attest {
namespace {

// ---- Recipe edits ----------------------------------------------------------------------------

// A static-descale FP8 operand (the parent's Fp8Static, reference/recipes/recipe.cc) turned
// into one with a current-scaling fp32 scale per (batch, head): a 2-D block of the fp8-block
// scheme spanning the whole sequence (row_axis 1 of [B, S, H, D]) and the whole head dim.
// FlashAttention-3's descale shape (hopper/flash_api.cpp CHECK_SHAPE(k_descale, batch_size,
// num_heads_k)), filled from the data instead of a calibration.
void CurrentScalePerBatchHead(OperandQuant& q) {
  constexpr int64_t kWhole = int64_t{1} << 40;
  q.scheme.block = "fp8-block-e4m3";
  q.scheme.block_options.tensor_amax.reset();
  q.scheme.block_options.row_axis = 1;
  q.scheme.block_options.block_rows = kWhole;
  q.scheme.block_options.block_size = kWhole;
  q.axis = QuantAxis::kHeadDim;
}

// The parent's recipe row (reference/recipes/recipe.cc; mutants_test checks every parent
// names one).
Recipe ParentRecipeRow(std::string_view name) {
  if (const Recipe* r = FindRecipe(name)) return *r;
  return *FindRecipe("bf16");
}

// ---- Documented cases ------------------------------------------------------------------------

// bf16, batch 1, D = Dv = 64 (a multiple of the MX block, so every parent covers it).
Problem Case(int64_t sq, int64_t sk, int64_t hq = 2, int64_t hkv = 2) {
  Problem p;
  p.batch = 1;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = p.head_dim_v = 64;
  p.dtype = DType::kBF16;
  return p;
}
template <class Fn>
Problem Case(Problem p, Fn&& edit) {
  edit(p);
  return p;
}

GeneratorSpec Gaussian(uint64_t seed, nlohmann::json params = nlohmann::json::object()) {
  return GeneratorSpec{"gaussian", seed, std::move(params)};
}

// ---- The catalogue ---------------------------------------------------------------------------

// Appends mutants to `rows` in the order of the calls (the catalogue's order: tests and docs
// count and list it).
struct MutantList {
  std::vector<MutantSpec>& rows;
  void operator()(MutantSpec s) const { rows.push_back(std::move(s)); }
};

constexpr std::string_view kBf16 = "cpu/flash2-bf16";

// -- Leakage through shared block scales --
void AddLeakageMutants(const MutantList& add) {
  add({.name = "v-scale-crosses-causal",
       .parent = "cpu/mxfp8-pvbf16",
       .parent_recipe = "mxfp8-pvbf16",
       .bug = "V quantised in MXFP8 blocks of 32 along the sequence: a block straddles the causal "
              "diagonal, so a future key's value moves the scale of visible ones "
              "(TransformerEngine #3248, flash-attention #2707, cudnn-frontend PRs #983/#1123)",
       .change = "recipe: P·V's V operand MXFP8 along the sequence instead of bf16",
       .bug_class = "non-interference",
       // The parent's MXFP8 operand of Q·Kᵀ, blocked along the sequence for P·V's V.
       .edit_recipe =
           [](Recipe& r) {
             r.pv.b = r.qk.b;
             r.pv.b.axis = QuantAxis::kSequence;
           },
       .problem = Case(Case(96, 96), [](Problem& p) { p.causal = true; }),
       .generator = Gaussian(101),
       .differs = {"o", "dq", "dk"}});
  add({.name = "doc-scale-crosses-boundary",
       .parent = "cpu/mxfp8-pvbf16",
       .parent_recipe = "mxfp8-pvbf16",
       .bug = "K's column-wise copy for dS·K blocked along the packed token axis: a 32-block "
              "spans two documents of a varlen batch, so one document's keys set the scale of "
              "another's (TransformerEngine #3248; cudnn-frontend PR #1123)",
       .change = "recipe: dS·K's K operand MXFP8 along the (packed) sequence",
       .bug_class = "non-interference",
       .edit_recipe =
           [](Recipe& r) {
             r.dsk.b = r.qk.b;
             r.dsk.b.axis = QuantAxis::kSequence;
           },
       .problem = Case(Case(60, 60),
                       [](Problem& p) {
                         p.batch = 2;
                         p.cu_seqlens_q = p.cu_seqlens_k = std::vector<int32_t>{0, 40, 100};
                       }),
       .generator = Gaussian(102),
       .differs = {"dq"}});
  // Per-tensor current scaling leaks as block scales do (docs/references.md "Which products can
  // leak"): cpu/nvfp4-mixed scales V per token; TransformerEngine's Float8CurrentScaling
  // takes one amax over the whole tensor.
  add({.name = "v-tensor-current-scale",
       .parent = "cpu/nvfp4-mixed",
       .parent_recipe = "nvfp4-mixed",
       .bug = "V quantised to FP8 with one current-scaling amax over the whole tensor "
              "(TransformerEngine Float8CurrentScaling): a future key's value moves the scale "
              "of every visible one (docs/references.md: per-tensor current scaling leaks; "
              "TransformerEngine #3248)",
       .change = "recipe: P·V's and dO·Vᵀ's V operand FP8 per-tensor current scale instead of "
                 "per token",
       .bug_class = "non-interference",
       .edit_recipe =
           [](Recipe& r) {
             // The parent's per-token-head FP8 V, with one amax over the whole tensor.
             for (OperandQuant* v : {&r.pv.b, &r.dov.b}) {
               v->scheme.per_vector_tensor_scale = false;
               v->axis = QuantAxis::kSequence;
             }
           },
       .problem = Case(Case(64, 64), [](Problem& p) { p.causal = true; }),
       .generator = Gaussian(123),
       .differs = {"o", "dq", "dk"}});
  add({.name = "fp8-current-descale",
       .parent = "cpu/fp8-e4m3-tensor",
       .parent_recipe = "fp8-e4m3-tensor",
       .bug = "FP8 descales computed from the current (batch, head) slice's amax instead of "
              "a calibration: the amax spans the sequence, so future keys and queries move how "
              "visible ones are quantised (FlashAttention-3 takes static descales; vLLM's "
              "on-the-fly calculate_kv_scales has this form)",
       .change = "recipe: Q, K, V FP8 with a per-(batch, head) current scale instead of the "
                 "static descale",
       .bug_class = "non-interference",
       .edit_recipe =
           [](Recipe& r) {
             for (OperandQuant* x : {&r.qk.a, &r.qk.b, &r.pv.b}) CurrentScalePerBatchHead(*x);
           },
       .problem = Case(Case(64, 64), [](Problem& p) { p.causal = true; }),
       .generator = Gaussian(124),
       .differs = {"o", "lse"}});
}

// -- Forward/backward mismatch --
void AddForwardBackwardMismatchMutants(const MutantList& add) {
  add({.name = "bwd-dp-from-unquantized-v",
       .parent = "cpu/nvfp4-mixed",
       .parent_recipe = "nvfp4-mixed",
       .bug = "backward forms dP = dO·Vᵀ from the bf16 V instead of the forward's FP8 V, while "
              "D = rowsum(dO∘O) comes from the O that the FP8 V produced: D ≠ rowsum(P∘dP), so "
              "Σ_j dS_ij ≠ 0 and the backward differentiates a forward that never ran "
              "(Attn-QAT, arXiv 2603.00040)",
       .change = "recipe: dO·Vᵀ's V operand used as stored instead of FP8 per token",
       .bug_class = "consistency",
       .edit_recipe = [](Recipe& r) { r.dov.b = OperandQuant{}; },
       .problem = Case(64, 64),
       .generator = Gaussian(103),
       .differs = {"dq", "dk"}});
  // On the leak-free MXFP8 parent: a mutant is one bug on a parent that passes the gate, so
  // that its first failing check is its own (cpu/mxfp8-cudnn leaks by design, and the fault
  // does not depend on the recipe).
  add({.name = "delta-from-other-o",
       .parent = "cpu/mxfp8-pvbf16",
       .parent_recipe = "mxfp8-pvbf16",
       .bug = "D = rowsum(dO∘O) computed from another O than forward returned (its FP8 copy), "
              "so D ≠ rowsum(P∘dP) (Attn-QAT, arXiv 2603.00040; cuDNN computes D from the "
              "BF16 O: cudnn-frontend mxfp8_ref.py)",
       .change = "wrapper: the backward reads o rounded to e4m3fn (saturating) for D",
       .bug_class = "consistency",
       .edit_backward_o = OAsE4m3,
       .problem = Case(64, 64),
       .generator = Gaussian(104),
       .differs = {"dq", "dk"}});
}

// -- Masks --
void AddMaskMutants(const MutantList& add) {
  add({.name = "empty-row-nan",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "a fully masked row normalised without a guard gives 0·(1/0) = NaN instead of "
              "o = 0 (flash-attention #443 class; FlexAttention test_fully_masked_out_rows)",
       .change = "wrapper: o = NaN in rows whose lse is −inf (no visible key)",
       .bug_class = "special-values",
       .edit_forward = NanInEmptyRows,
       .problem = Case(Case(80, 48), [](Problem& p) { p.causal = true; }),
       .generator = Gaussian(105),
       .differs = {"o", "dq", "dk"}});
  add({.name = "bwd-diag-tile-unmasked",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "keys past the causal bound unmasked in the backward's diagonal tile only "
              "(flash-attention #443: keys beyond seqlen_k unmasked in the backward; ROCm/aiter "
              "#3551: a backward missing its bounds mask)",
       .change = "hook BackwardTileMask: a partially masked tile computed fully visible",
       .bug_class = "non-interference",
       .hooks = &DiagTileUnmaskedHooks(),
       .problem = Case(Case(100, 100), [](Problem& p) { p.causal = true; }),
       .generator = Gaussian(106),
       .differs = {"dq", "dk", "dv"}});
  add({.name = "window-right-clamped",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "window right bound clamped to seqlen_k: with Sq > Sk and bottom-right alignment "
              "keys inside the window are dropped (flash-attention #895, flash_api.cpp)",
       .change = "problem fault kWindowRightClamped",
       .bug_class = "window-causal",
       .problem_fault = ProblemFault::kWindowRightClamped,
       .problem = Case(Case(96, 32), [](Problem& p) { p.window_left = 16; }),
       .generator = Gaussian(107),
       .differs = {"o", "lse", "dq", "dk", "dv"}});
  add({.name = "causal-top-left",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "causal aligned top-left (PyTorch SDPA is_causal) where bottom-right is meant "
              "(flash-attention #1778 convention; docs/references.md on SDPA)",
       .change = "problem fault kCausalTopLeft",
       .bug_class = "window-causal",
       .problem_fault = ProblemFault::kCausalTopLeft,
       .problem = Case(Case(32, 80), [](Problem& p) { p.causal = true; }),
       .generator = Gaussian(108),
       .differs = {"o", "lse", "dq", "dk", "dv"}});
  add({.name = "causal-bottom-right",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "causal aligned bottom-right where the API documents top-left, the mirror of "
              "causal-top-left (SDPA's flash route on nested jagged tensors: docs/findings/"
              "P3-njt-is-causal-alignment.md)",
       .change = "claims causal_top_left_only; problem fault kCausalBottomRight",
       .bug_class = "window-causal",
       .problem_fault = ProblemFault::kCausalBottomRight,
       .claims_causal_top_left_only = true,
       .problem = Case(Case(32, 80),
                       [](Problem& p) {
                         p.causal = true;
                         p.causal_align = CausalAlign::kTopLeft;
                       }),
       .generator = Gaussian(108),
       .differs = {"o", "lse", "dq", "dk", "dv"}});
}

// -- Score modifiers --
void AddScoreModifierMutants(const MutantList& add) {
  add({.name = "softcap-s-tanh-s",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "softcap computed as s·tanh(s) instead of cap·tanh(s/cap) (flash-attention PR "
              "#2402)",
       .change = "hook Softcap: t·tanh(t) for t = scale·q·k, divided by the cap",
       .bug_class = "accuracy",
       .hooks = &SoftcapSTanhSHooks(),
       .problem = Case(Case(64, 64), [](Problem& p) { p.softcap = 5.0; }),
       .generator = Gaussian(109, {{"q", {{"std", 2.0}}}}),
       .differs = {"o", "lse", "dq", "dk", "dv"}});
  add({.name = "softcap-no-bwd-derivative",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "softcap's derivative 1 − tanh² missing in the backward (flash-attention PR "
              "#2402; PR #2544: varlen backward with softcap wrong dq)",
       .change = "hook SoftcapDerivative: none",
       .bug_class = "consistency",
       .hooks = &SoftcapNoDerivativeHooks(),
       .problem = Case(Case(64, 64), [](Problem& p) { p.softcap = 2.0; }),
       .generator = Gaussian(110, {{"q", {{"std", 3.0}}}}),
       .differs = {"dq", "dk"}});
}

// -- Softmax statistics --
void AddSoftmaxStatisticsMutants(const MutantList& add) {
  add({.name = "lse-log2",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "lse returned in log2 units, off by a factor ln 2 (pytorch #181645: flex "
              "returned lse off by ln 2)",
       .change = "wrapper: lse · log2(e); hook LseLog2: the backward reads it as base 2",
       .bug_class = "accuracy",
       .hooks = &LseLog2BackwardHooks(),
       .edit_forward = LseInLog2Units,
       .problem = Case(64, 64),
       .generator = Gaussian(111),
       .differs = {"lse"}});
  add({.name = "lse-scaled-twice",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "the row max scaled twice in lse = m·scale + log(l) (pytorch #181645 class); the "
              "backward's P recomputed from it is unnormalised",
       .change = "hook RowLse: (max · scale) · scale + log(sum)",
       .bug_class = "accuracy",
       .hooks = &LseScaledTwiceHooks(),
       .problem = Case(64, 64),
       .generator = Gaussian(112, {{"q", {{"std", 2.0}}}}),
       .differs = {"lse", "dq", "dk", "dv"}});
  add({.name = "split-kv-combine",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "split-KV partials combined with weights l_s/Σl instead of exp(lse_s − lse): "
              "results differ beyond rounding (flash-attention #1647)",
       .change = "hooks KvSplits = 2, CombineKvSplits with weights l_s/Σl",
       .bug_class = "accuracy",
       .hooks = &SplitKvBadCombineHooks(),
       .problem = Case(32, 256),
       .generator = Gaussian(113, {{"q", {{"std", 2.0}}}}),
       .differs = {"o", "lse", "dq", "dk"}});
  add({.name = "gqa-h-mod-hkv",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "GQA query head h mapped to kv head h % Hkv instead of h / (Hq/Hkv) "
              "(TransformerEngine #3216 class: FA4 GQA dq wrong)",
       .change = "hooks KvHead = h % Hkv, GroupHead = r·Hkv + g",
       .bug_class = "gqa-mha",
       .hooks = &GqaHeadModHooks(),
       .problem = Case(48, 48, 4, 2),
       .generator = Gaussian(114),
       .differs = {"o", "lse", "dq", "dk", "dv"}});
}

// -- FP8 P and block scales --
void AddFp8ScaleMutants(const MutantList& add) {
  add({.name = "p-scale-past-e4m3-max",
       .parent = "cpu/mxfp8-cudnn",
       .parent_recipe = "mxfp8-cudnn",
       .bug = "a lazy online-softmax rescale (threshold 8 in log2 units) lets P·16 reach 2^12 "
              "> 448 before the E4M3 cast, which saturates or gives NaN as the parent's cast "
              "does (flash-attention #2577: FA4 FP8 cosine dropping at 128-key boundaries)",
       .change = "hook RowMax: the max kept unless it grows by more than 2^8",
       .bug_class = "special-values",
       .hooks = &LazyRescaleHooks(),
       .problem = Case(64, 256),
       .generator = Gaussian(115, {{"q", {{"std", 3.0}}}}),
       .differs = {"o", "lse", "dq", "dk"}});
  add({.name = "rowsum-before-p-cast",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "P cast to E4M3 without a scale while the row sum is taken before the cast: P "
              "below 2^-9 underflows and the row loses mass (ROCm/FlyDSL PR #1020: up to 36%)",
       .change = "recipe: P before P·V rounded to e4m3fn (saturating, no pre-scale)",
       .bug_class = "accuracy",
       .edit_recipe =
           [](Recipe& r) {
             r.pv.a.scheme.element = Format::kE4M3FN;  // the parent's P rounding, to e4m3
             r.pv.a.scheme.overflow = Overflow::kSaturate;
           },
       .problem = Case(64, 256),
       .generator = Gaussian(116, {{"q", {{"std", 2.0}}}}),
       .differs = {"o", "dq", "dk"}});
  add({.name = "e8m0-scale-off-by-one",
       .parent = "cpu/mxfp8-pvbf16",
       .parent_recipe = "mxfp8-pvbf16",
       .bug = "MX E8M0 scale exponent one too small: every block's largest elements saturate "
              "(vllm PR #43557: MXFP4 scale from exponent(amax/6) off by one)",
       .change = "hook QuantizeInput: MX E8M0 scale exponent − 1",
       .bug_class = "accuracy",
       .hooks = &MxScaleOffByOneHooks(),
       .problem = Case(64, 64),
       .generator = Gaussian(117),
       .differs = {"o", "lse", "dq", "dk", "dv"}});
}

// -- Determinism, stores --
void AddDeterminismAndStoreMutants(const MutantList& add) {
  add({.name = "nondeterministic-dq",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "claims determinism while dQ's accumulation order over key tiles varies from run "
              "to run (flash-attention #2244: FA3 deterministic mode still varied dq; #414)",
       .change = "hook DqFirstKeyTile = the backward call count (dQ's walk starts there)",
       .bug_class = "determinism",
       .vary_dq_order = true,
       .problem = Case(128, 640),
       .generator = Gaussian(118),
       .differs = {"dq"},
       .worse_than_parent = false});
  add({.name = "store-permutation",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "o stored with two d-columns swapped: every row keeps its norm (flash-attention "
              "PR #2553: norm-only comparisons missed a permutation)",
       .change = "wrapper: o stored with d-columns 0 and 1 swapped",
       .bug_class = "accuracy",
       .edit_forward = SwapOColumns01,
       .problem = Case(64, 64),
       .generator = Gaussian(119),
       .differs = {"o", "dq", "dk"}});
  add({.name = "last-tile-unwritten",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "the last partial query tile is never written: its rows keep the output "
              "buffer's (NaN-poisoned) content (tile-count rounding; pytorch #153799 class: "
              "seq 1025)",
       .change = "wrapper: rows of the last partial query tile keep the poison bytes",
       .bug_class = "unwritten-outputs",
       .edit_forward = SkipLastPartialQueryTile,
       .problem = Case(200, 200),
       .generator = Gaussian(120),
       .differs = {"o", "lse", "dq", "dk", "dv"}});
  // On the bf16 parent, which passes the gate (cpu/mxfp8-cudnn leaks by design, and the
  // mutant's first failure must be its own): the NaN reaches dq, dk, dv through the dS GEMMs
  // directly, where cuDNN's recipe would spread it through a NaN block scale first.
  add({.name = "nan-ds-masked-tiles",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "NaN P and dS of empty rows in a visited tile (exp2(−inf − (−inf))) fed onward "
              "into the dS products (facebookexperimental/triton PR #3395: clear NaN dS in "
              "masked tiles before quantising, where the MX block's scale turns NaN; "
              "flash-attention #1947: zero P at masked positions)",
       .change = "hook RecomputeP: exp2(s − lse) without the guard",
       .bug_class = "special-values",
       .hooks = &MaskedDsNanHooks(),
       .problem = Case(Case(80, 48), [](Problem& p) { p.causal = true; }),
       .generator = Gaussian(121),
       .differs = {"dq", "dk", "dv"}});
  add({.name = "zero-scale-nan",
       .parent = "cpu/mxfp8-cudnn",
       .parent_recipe = "mxfp8-cudnn",
       .bug = "a block of amax 0 (a zero V channel) gives scale 0 and 0/0 = NaN on "
              "dequantisation (ROCm/aiter #4289: per-channel V scale of 0)",
       .change = "hook QuantizeInput: zero-amax blocks dequantised to NaN",
       .bug_class = "special-values",
       .hooks = &ZeroAmaxBlockNanHooks(),
       .problem = Case(64, 64),
       .generator = Gaussian(122, {{"v", {{"std", 0.0}}}}),
       .differs = {"o", "dq", "dk"}});
}

// -- Layouts --
void AddLayoutMutants(const MutantList& add) {
  add({.name = "strides-ignored",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "inputs read as if contiguous: a slice of a fused qkv projection or a transposed "
              "[B, H, S, D] tensor is read in row-major order from its first element "
              "(flash-attention #2665: strides ignored)",
       .change = "wrapper: q, k, v, dO and o read through contiguous strides",
       .bug_class = "layouts",
       .edit_inputs = ReadAsContiguous,
       .heads_major_inputs = true,
       .problem = Case(64, 64),
       .generator = Gaussian(135),
       .differs = {"o", "lse", "dq", "dk", "dv"}});
}

// -- Directed rounding (each error within an ulp, all of them in one direction) --
// Elementwise bounds pass these: a truncation moves every value by less than one ulp of its
// format. Their mean error is what the bias check (verify/checks/bias.h) judges.
void AddDirectedRoundingMutants(const MutantList& add) {
  add({.name = "o-rounded-toward-zero",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "o converted to bf16 by truncation (__float2bfloat16_rz, or keeping the high 16 "
              "bits of the fp32 word) instead of round-to-nearest: every output shrinks by up "
              "to one ulp (the class stochastic rounding and TransformerEngine's recipes "
              "guard against: Gupta et al., arXiv 1502.02551)",
       .change = "recipe: o rounded toward zero",
       .bug_class = "bias",
       .edit_recipe = [](Recipe& r) { r.output_rounding = Rounding::kTowardZero; },
       .problem = Case(128, 128),
       .generator = Gaussian(136),
       .differs = {"o", "dq", "dk"}});
  add({.name = "grads-rounded-toward-zero",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "dq, dk and dv converted to bf16 by truncation: every gradient shrinks by up to "
              "one ulp, which biases the optimiser's steps (arXiv 1502.02551)",
       .change = "recipe: dq, dk, dv rounded toward zero",
       .bug_class = "bias",
       .edit_recipe = [](Recipe& r) { r.gradient_rounding = Rounding::kTowardZero; },
       .problem = Case(128, 128),
       .generator = Gaussian(137),
       .differs = {"dq", "dk", "dv"}});
  add({.name = "p-rounded-toward-zero",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "P converted to bf16 by truncation before P·V while the row sum keeps the fp32 P: "
              "every row loses up to 2^-8 of its mass (the rowsum/cast ordering of ROCm/FlyDSL "
              "PR #1020, with a truncating conversion instead of an underflowing one)",
       .change = "recipe: P before P·V rounded toward zero",
       .bug_class = "bias",
       .edit_recipe = [](Recipe& r) { r.pv.a.scheme.rounding = Rounding::kTowardZero; },
       .problem = Case(128, 128),
       .generator = Gaussian(138),
       .differs = {"o", "dq", "dk"}});
  add({.name = "bwd-accumulator-truncated",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "the backward's dK, dV accumulators kept in a narrow buffer between query tiles "
              "(9 significant bits) and written by truncation: each tile's store drops up to "
              "half a bf16 ulp toward zero, and the drops add up over the tiles",
       .change = "hook StoreBackwardAccumulator: dK, dV accumulators truncated to 9 bits",
       .bug_class = "bias",
       .hooks = &TruncatedBackwardAccumulatorHooks(),
       .problem = Case(128, 128),
       .generator = Gaussian(139),
       .differs = {"dk", "dv"}});
}

// -- A tiled kernel with shape limits (cpu/tile64-bf16: Sq = Sk, multiples of 64, MHA) --
// The bugs a one-loop tiled kernel of the Triton tutorial's shape has in its loop bounds,
// its mask stages, its online softmax and its arguments; each case is inside the parent's
// shape limits (64-row tiles, equal lengths).
void AddTiledKernelMutants(const MutantList& add) {
  const std::string_view kTile = Tile64Model::kName;
  add({.name = "tile-fwd-diag-unmasked",
       .parent = kTile,
       .parent_recipe = "bf16",
       .bug = "the causal mask applied only to the tiles strictly off the diagonal: the diagonal "
              "tile runs the unmasked stage and its queries see later keys "
              "(triton-lang/triton python/tutorials/06-fused-attention.py splits the key "
              "loop into an off-band stage without a mask and an on-band stage with one)",
       .change = "hook ForwardTileMask: a partially masked tile computed fully visible",
       .bug_class = "non-interference",
       .hooks = &ForwardDiagTileUnmaskedHooks(),
       .problem = Case(Case(128, 128), [](Problem& p) { p.causal = true; }),
       .generator = Gaussian(131),
       .differs = {"o", "lse", "dq", "dk", "dv"}});
  add({.name = "tile-acc-not-rescaled",
       .parent = kTile,
       .parent_recipe = "bf16",
       .bug = "the online softmax rescales the row sum but not the O accumulator when the row "
              "max grows (FlashAttention-2 Algorithm 1 line 10, arXiv 2307.08691; Milakov & "
              "Gimelshein, arXiv 1805.02867): earlier tiles keep too much weight",
       .change = "hook RescaleAcc: acc_o left as it is",
       .bug_class = "accuracy",
       .hooks = &AccNotRescaledHooks(),
       .problem = Case(128, 128),
       .generator = Gaussian(132, {{"q", {{"std", 2.0}}}}),
       // lse comes from the row sum, which is rescaled; dv from P recomputed from lse.
       .differs = {"o", "dq", "dk"}});
  add({.name = "tile-bwd-last-key-tile-skipped",
       .parent = kTile,
       .parent_recipe = "bf16",
       .bug = "the backward's key-tile loop stops one tile early (a bound of N − BLOCK_N "
              "where N was meant): the last tile's dk, dv stay 0 and its terms are missing "
              "from dq",
       .change = "hook BackwardKeyTiles: key_tiles − 1",
       // The gradients then belong to no forward: consistency names it before accuracy.
       .bug_class = "consistency",
       .hooks = &LastKeyTileSkippedHooks(),
       .problem = Case(128, 128),
       .generator = Gaussian(133),
       .differs = {"dq", "dk", "dv"}});
  add({.name = "scale-ignored",
       .parent = kTile,
       .parent_recipe = "bf16",
       .bug = "the softmax scale argument ignored: the kernel always uses 1/sqrt(D), which "
              "every default-scale test passes (MLA's 1/sqrt(192) on D = 128 differs)",
       .change = "problem fault kScaleIgnored",
       .bug_class = "accuracy",
       .problem_fault = ProblemFault::kScaleIgnored,
       .problem = Case(Case(64, 64), [](Problem& p) { p.scale = 0.5; }),
       .generator = Gaussian(134),
       .differs = {"o", "lse", "dq", "dk", "dv"}});
}

std::vector<MutantSpec> BuildCatalogue() {
  std::vector<MutantSpec> rows;
  const MutantList add{rows};
  AddLeakageMutants(add);
  AddForwardBackwardMismatchMutants(add);
  AddMaskMutants(add);
  AddScoreModifierMutants(add);
  AddSoftmaxStatisticsMutants(add);
  AddFp8ScaleMutants(add);
  AddDeterminismAndStoreMutants(add);
  AddLayoutMutants(add);
  AddTiledKernelMutants(add);
  AddDirectedRoundingMutants(add);
  AddSinkMutants(rows);
  AddRelBiasMutants(rows);
  AddSplitKvMutants(rows);
  AddPagedMutants(rows);
  return rows;
}

struct Catalogue {
  std::vector<MutantSpec> specs;
  std::vector<Recipe> parents, mutants;  // per spec
};

const Catalogue& TheCatalogue() {
  static const Catalogue c = [] {
    Catalogue out;
    out.specs = BuildCatalogue();
    for (const MutantSpec& s : out.specs) {
      out.parents.push_back(ParentRecipeRow(s.parent_recipe));
      out.mutants.push_back(out.parents.back());
      if (s.edit_recipe) s.edit_recipe(out.mutants.back());
    }
    return out;
  }();
  return c;
}

size_t IndexOf(const MutantSpec& spec) {
  const Catalogue& c = TheCatalogue();
  return static_cast<size_t>(&spec - c.specs.data());
}

DType ParentDType(const MutantSpec& spec) {
  const Recipe& r = ParentRecipe(spec);
  return r.input_dtypes.empty() ? DType::kBF16 : r.input_dtypes.front();
}

}  // namespace

std::span<const MutantSpec> MutantCatalogue() { return TheCatalogue().specs; }

const MutantSpec* FindMutant(std::string_view name) {
  if (name.starts_with("mutant/")) name.remove_prefix(7);
  for (const MutantSpec& s : MutantCatalogue()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::vector<const MutantSpec*> MutantsByClass(std::string_view check) {
  std::vector<const MutantSpec*> out;
  for (const MutantSpec& s : MutantCatalogue()) {
    if (s.bug_class == check) out.push_back(&s);
  }
  return out;
}

const Recipe& ParentRecipe(const MutantSpec& spec) { return TheCatalogue().parents[IndexOf(spec)]; }
const Recipe& MutantRecipe(const MutantSpec& spec) { return TheCatalogue().mutants[IndexOf(spec)]; }

std::unique_ptr<Kernel> MakeParent(const MutantSpec& spec) {
  if (spec.parent == Tile64Model::kName) return std::make_unique<Tile64Model>();
  if (spec.parent == kSplitKvModelName) return MakeSplitKvModel();
  for (const LowpModelSpec& row : LowpModelSpecs()) {
    if (row.name == spec.parent) return std::make_unique<LowpModel>(row);
  }
  return std::make_unique<Flash2Model>(std::string(spec.parent), ParentRecipe(spec),
                                       ParentDType(spec));
}

Problem ApplyProblemFault(const Problem& p, ProblemFault fault) {
  Problem out = p;
  switch (fault) {
    case ProblemFault::kNone:
      break;
    case ProblemFault::kWindowRightClamped:
      // flash_api.cpp (flash-attention #895): window_size_right < 0 or >= max_seqlen_k becomes
      // max_seqlen_k once a window is set.
      if ((out.window_left >= 0 || out.window_right >= 0) &&
          (out.window_right < 0 || out.window_right >= out.seqlen_k)) {
        out.window_right = out.seqlen_k;
      }
      break;
    case ProblemFault::kCausalTopLeft:
      if (out.causal) out.causal_align = CausalAlign::kTopLeft;
      break;
    case ProblemFault::kCausalBottomRight:
      if (out.causal) out.causal_align = CausalAlign::kBottomRight;
      break;
    case ProblemFault::kScaleIgnored:
      out.scale.reset();
      break;
  }
  return out;
}

MutantKernel::MutantKernel(const MutantSpec& spec) : MutantKernel(spec, MakeParent(spec)) {}

MutantKernel::MutantKernel(const MutantSpec& spec, std::unique_ptr<Kernel> parent)
    : spec_(&spec), parent_(std::move(parent)), caps_(parent_->capabilities()) {
  if (spec.claims_causal_top_left_only) caps_.causal_top_left_only = true;
  // Only a sink deviation runs the parent's learnable sink (sink_mutants.cc): the others claim
  // the parent's capabilities without it.
  if (spec.sink_fault == SinkFault::kNone) caps_.sink = false;
  if (spec.rel_bias_fault == RelBiasFault::kNone) caps_.rel_bias = false;  // likewise the bias
  // The parent's tiles (the engine's defaults for a parent that is no engine model).
  if (const auto* flash = dynamic_cast<const Flash2Model*>(parent_.get())) {
    options_ = flash->options();
  } else if (const auto* lowp = dynamic_cast<const LowpModel*>(parent_.get())) {
    options_ = lowp->options();
  }
  options_.hooks = nullptr;
}

bool MutantKernel::RunsEngine() const {
  return spec_->edit_recipe != nullptr || spec_->hooks != nullptr || spec_->vary_dq_order;
}

KernelAnswer<ForwardResult> MutantKernel::Forward(const Problem& p, const Tensor& q,
                                                  const Tensor& k, const Tensor& v) {
  route_ = "mutant forward";
  std::string why;
  if (!caps_.Covers(p, &why)) return Unsupported{name() + ": " + why};
  const Problem read = ApplyProblemFault(p, spec_->problem_fault);
  auto in = [&](const Tensor& t) { return spec_->edit_inputs ? spec_->edit_inputs(t) : t; };
  KernelAnswer<ForwardResult> out;
  if (RunsEngine()) {
    EngineOptions options = options_;
    options.hooks = spec_->hooks;
    out = FlashForward(read, MutantRecipe(*spec_), in(q), in(k), in(v), options);
  } else {
    out = parent_->Forward(read, in(q), in(k), in(v));
  }
  if (auto* result = std::get_if<ForwardResult>(&out); result && spec_->edit_forward) {
    spec_->edit_forward(p, options_, *result);
  }
  return out;
}

KernelAnswer<BackwardResult> MutantKernel::Backward(const Problem& p, const Tensor& q,
                                                    const Tensor& k, const Tensor& v,
                                                    const Tensor& o, const Tensor& lse,
                                                    const Tensor& dout) {
  route_ = "mutant backward";
  std::string why;
  if (!caps_.Covers(p, &why)) return Unsupported{name() + ": " + why};
  ++backward_calls_;
  const Problem read = ApplyProblemFault(p, spec_->problem_fault);
  auto in = [&](const Tensor& t) { return spec_->edit_inputs ? spec_->edit_inputs(t) : t; };
  const Tensor o_read = spec_->edit_backward_o ? spec_->edit_backward_o(in(o)) : in(o);
  if (!RunsEngine()) return parent_->Backward(read, in(q), in(k), in(v), o_read, lse, in(dout));
  EngineOptions options = options_;
  options.hooks = spec_->hooks;
  // Run-to-run state: every call starts dQ's walk at another key tile.
  const DqRotationHooks rotation(backward_calls_);
  if (spec_->vary_dq_order) options.hooks = &rotation;
  return FlashBackward(read, MutantRecipe(*spec_), in(q), in(k), in(v), o_read, lse, in(dout),
                       options);
}

void RegisterMutants(KernelRegistry& registry) {
  for (const MutantSpec& spec : MutantCatalogue()) {
    registry.Register(
        "mutant/" + std::string(spec.name),
        "seeded bug (parent " + std::string(spec.parent) + "): " + std::string(spec.bug),
        [&spec](std::string_view) -> Expected<std::unique_ptr<Kernel>> {
          return std::unique_ptr<Kernel>(std::make_unique<MutantKernel>(spec));
        });
  }
}

}  // namespace attest
