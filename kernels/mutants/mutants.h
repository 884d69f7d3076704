// The mutant catalogue (docs/kernels.md "Mutants"; docs/design.md "Kernels": mutants are
// named `mutant/<name>`): seeded-bug kernels, each a small deviation from a correct model of
// kernels/models/ that reproduces one real bug class (the sources are the issues and PRs of
// docs/references.md "Real bugs worth modelling" and "FP8 P pitfalls"). A mutant is
// data: its parent, its deviation and a documented case (a Problem and a generator seed) on
// which it provably differs from its parent (mutants_test shows it). The deviation is a recipe
// edit, a problem fault, a wrapper around the parent kernel (deviations.h) or, for a bug that
// lives inside the tiled loop, engine hooks (flash_engine.h EngineHooks, deviations.h): never
// a flag the correct models test. A mutant lies exactly as the buggy kernel would: it claims
// its parent's capabilities, determinism included. docs/kernels.md "Mutants" has the table.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernel.h"
#include "kernels/models/flash_engine.h"
#include "kernels/mutants/deviations.h"
#include "reference/case/case_file.h"
#include "reference/problem/problem.h"
#include "reference/recipes/recipe.h"

namespace attest {

// A deviation that lives in how the kernel reads the problem's parameters (flash_api.cpp-style
// set-up code) rather than in the tiled loop.
enum class ProblemFault : uint8_t {
  kNone,
  // flash-attention #895: with a left window bound set, an unbounded (or too large) right
  // bound becomes seqlen_k; with Sq > Sk and bottom-right alignment that drops keys.
  kWindowRightClamped,
  // Causal aligned top-left (PyTorch SDPA is_causal) where bottom-right is meant.
  kCausalTopLeft,
  // The mirror: causal aligned bottom-right (FlashAttention's convention) where the API
  // documents top-left, as SDPA's flash route does on nested jagged tensors (docs/findings/
  // P3-njt-is-causal-alignment.md).
  kCausalBottomRight,
  // The problem's softmax scale ignored: the kernel always uses 1/sqrt(D) (a kernel author's
  // function that takes `scale` and never reads it; MLA's 1/sqrt(192) on D = 128 is where it
  // shows first).
  kScaleIgnored,
};

// A deviation in how the kernel applies a learnable sink (Problem::sink; docs/semantics.md
// "Learnable sink"), a wrapper around the parent's sink entry points (sink_mutants.cc). Only
// these mutants claim the parent's sink; every other mutant claims none.
enum class SinkFault : uint8_t {
  kNone,
  // The sink added after normalisation: o normalised by the keys' sum alone, lse with the sink.
  kNotInO,
  // The sink missing from lse (o right; an empty row's lse = sink kept by its own branch).
  kNotInLse,
  // dsink returned as zeros (TransformerEngine PR #3551: the sink's gradient not written).
  kDsinkZero,
  // An empty row with a finite sink gives lse = NaN (flash-attention PR #2752: log of a
  // zero sum before the sink joins it).
  kEmptyRowNanLse,
  // dsink with the wrong sign (+sum_i exp(sink - lse_i) D_i).
  kDsinkSign,
  // The sink handed to the engine with the spec's hooks, which hold the fault (the split-KV
  // combine adding it once per split: deviations.h SplitKvSinkPerSplitHooks).
  kInHooks,
};

// A deviation in how the kernel applies a learnable relative bias (Problem::rel_bias;
// docs/semantics.md "Learnable relative bias"), a wrapper around the parent's relative-bias
// entry points (relbias_mutants.cc). Only these mutants claim the parent's rel_bias.
enum class RelBiasFault : uint8_t {
  kNone,
  // drel_bias summed over the wrong diagonal: element d holds diagonal d + 1's sum.
  kDiagonalOffByOne,
  // drel_bias returned as zeros (the bias's gradient not written back).
  kDrelZero,
  // The bias indexed with packed (global) positions t_q - t_k instead of the sequence-local
  // i - j; entries past the table's edge read as 0.
  kGlobalPositions,
};

// One row of the catalogue.
struct MutantSpec {
  std::string_view name{};           // registered as "mutant/<name>"
  std::string_view parent{};         // the correct kernel it deviates from, e.g. "cpu/flash2-bf16"
  std::string_view parent_recipe{};  // the parent's recipe row ("bf16", "mxfp8-pvbf16", ...)
  std::string_view bug{};            // the real bug class and its source
  std::string_view change{};         // the deviation, in words
  // The check that names the bug (a name of verify/checks AllChecks(): "accuracy",
  // "non-interference", "consistency", "determinism", "unwritten-outputs", "special-values",
  // "gqa-mha", "permutation", "window-causal", "padding", "layouts", "honesty", "bias",
  // "splits-agree"): the
  // diagnosis, which must be the first failing check of `attest check --suite gate` on this
  // mutant (docs/checks.md; verify/checks/first_failure_test.cc keeps it true).
  std::string_view bug_class{};
  // The deviation, each part optional: a recipe edit of the parent's recipe; a problem fault;
  // engine hooks (a static object); wrappers that edit the parent's forward outputs and the o
  // the backward reads; and whether dQ's accumulation order changes from call to call
  // (DqRotationHooks with the kernel's backward call count). A mutant with no recipe edit, no
  // hooks and a fixed dQ order runs its parent kernel itself; the others run the engine on the
  // mutant's recipe with the parent's tiles.
  void (*edit_recipe)(Recipe&) = nullptr;
  ProblemFault problem_fault = ProblemFault::kNone;
  const EngineHooks* hooks = nullptr;
  ForwardEdit edit_forward = nullptr;
  BackwardOEdit edit_backward_o = nullptr;
  // How the kernel reads q, k, v, dO and the o its backward is given (ReadAsContiguous).
  InputEdit edit_inputs = nullptr;
  // The documented case hands q, k, v and dO over as a model does, through a transpose of
  // heads-major [B, H, S, D] storage (mutants_test), not as fresh contiguous tensors.
  bool heads_major_inputs = false;
  bool vary_dq_order = false;
  // Claims `causal_top_left_only` (kernels/kernel.h) beside the parent's capabilities: an API
  // whose only causal form is top-left (SDPA's is_causal on nested jagged tensors).
  bool claims_causal_top_left_only = false;
  // A learnable-sink deviation (the mutant then claims the parent's sink).
  SinkFault sink_fault = SinkFault::kNone;
  // A relative-bias deviation (the mutant then claims the parent's rel_bias).
  RelBiasFault rel_bias_fault = RelBiasFault::kNone;
  // The documented case.
  Problem problem{};
  GeneratorSpec generator{};
  // Outputs ("o", "lse", "dq", "dk", "dv"; "dsink" on a sink case) in which the mutant's answer on the case differs
  // bitwise from the parent's (exactly these; the others are bitwise equal).
  std::vector<std::string_view> differs{};
  // Whether, on the case, the mutant's max |x − oracle| over `differs` exceeds the parent's
  // for some tensor (false where the comparison means nothing, e.g. a run-to-run order).
  bool worse_than_parent = true;
};

// Every mutant, in a fixed order (built once).
std::span<const MutantSpec> MutantCatalogue();
const MutantSpec* FindMutant(std::string_view name);  // "empty-row-nan" or "mutant/empty-row-nan"
// The rows whose bug_class is `check`, in catalogue order.
std::vector<const MutantSpec*> MutantsByClass(std::string_view check);

// The parent's recipe: the row of AllRecipes() named spec.parent_recipe. The mutant's recipe is
// that recipe after spec.edit_recipe; it keeps the parent's name, because the buggy kernel
// claims the parent's recipe.
const Recipe& ParentRecipe(const MutantSpec& spec);
const Recipe& MutantRecipe(const MutantSpec& spec);

// The parent the mutant deviates from, built by the models' own constructors
// (kernels/models/): the LowpModel row named spec.parent, else a Flash2Model on
// ParentRecipe() with default options; for registered parents this is the registered kernel
// (mutants_test checks its bits).
std::unique_ptr<Kernel> MakeParent(const MutantSpec& spec);

// A mutant kernel around its parent kernel: the parent's capabilities and claims, its answers
// where the deviation is a wrapper, the engine with the parent's tiles where it is a recipe
// edit or hooks.
class MutantKernel : public Kernel {
 public:
  explicit MutantKernel(const MutantSpec& spec);  // the parent MakeParent(spec) builds
  MutantKernel(const MutantSpec& spec, std::unique_ptr<Kernel> parent);
  std::string name() const override { return "mutant/" + std::string(spec_->name); }
  Capabilities capabilities() const override { return caps_; }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override;
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override;
  // The parent's sink entry points with the spec's SinkFault (sink_mutants.cc).
  KernelAnswer<ForwardResult> ForwardSink(const Problem& p, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const Tensor& sink) override;
  KernelAnswer<BackwardResult> BackwardSink(const Problem& p, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const Tensor& o, const Tensor& lse,
                                            const Tensor& dout, const Tensor& sink) override;
  // The parent's relative-bias entry points with the spec's RelBiasFault (relbias_mutants.cc).
  KernelAnswer<ForwardResult> ForwardRelBias(const Problem& p, const Tensor& q, const Tensor& k,
                                             const Tensor& v, const Tensor& rel_bias,
                                             const Tensor& sink) override;
  KernelAnswer<BackwardResult> BackwardRelBias(const Problem& p, const Tensor& q,
                                               const Tensor& k, const Tensor& v, const Tensor& o,
                                               const Tensor& lse, const Tensor& dout,
                                               const Tensor& rel_bias, const Tensor& sink) override;
  std::string last_route() const override { return route_; }
  std::optional<Format> BackwardDpFormat(const Problem& p) const override {
    return parent_->BackwardDpFormat(p);
  }
  const MutantSpec& spec() const { return *spec_; }

 private:
  // Whether the deviation needs the engine (a recipe edit, hooks, a varying dQ order) rather
  // than the parent kernel itself.
  bool RunsEngine() const;

  const MutantSpec* spec_;
  std::unique_ptr<Kernel> parent_;
  Capabilities caps_;
  EngineOptions options_;  // the parent's engine options (tiles), without hooks
  uint64_t backward_calls_ = 0;  // per kernel object: the "run-to-run" state of vary_dq_order
  std::string route_;
};

// The problem as a kernel with `fault` reads it.
Problem ApplyProblemFault(const Problem& p, ProblemFault fault);

// The learnable-sink rows of the catalogue (sink_mutants.cc), appended to `rows`.
void AddSinkMutants(std::vector<MutantSpec>& rows);
// The split-KV and paged-KV rows (split_paged_mutants.cc), appended to `rows`.
void AddSplitKvMutants(std::vector<MutantSpec>& rows);
void AddPagedMutants(std::vector<MutantSpec>& rows);
// The split-KV row with a learnable sink (sink_mutants.cc), after the other split-KV rows.
void AddSplitKvSinkMutants(std::vector<MutantSpec>& rows);
// The learnable relative-bias rows of the catalogue (relbias_mutants.cc), appended to `rows`.
void AddRelBiasMutants(std::vector<MutantSpec>& rows);

// Registers mutant/<name> for every row (each kernel built around MakeParent()).
void RegisterMutants(KernelRegistry& registry);

}  // namespace attest
