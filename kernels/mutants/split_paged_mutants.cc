// The split-KV and paged-KV rows of the mutant catalogue (docs/kernels.md "Mutants"): engine
// hooks (deviations.h) on cpu/flash2-splitkv-bf16 at the split counts it declares, and on
// cpu/flash2-bf16 reading a page pool with seqused.
#include <utility>
#include <vector>

#include "kernels/models/flash_models.h"
#include "kernels/mutants/deviations.h"
#include "kernels/mutants/mutants.h"
#include "reference/problem/paged.h"

namespace attest {
namespace {

constexpr std::string_view kBf16 = "cpu/flash2-bf16";

// bf16, batch 1, D = Dv = 64 (as mutants.cc's documented cases).
Problem MutantCase(int64_t sq, int64_t sk) {
  Problem p;
  p.batch = 1;
  p.heads_q = p.heads_kv = 2;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = p.head_dim_v = 64;
  p.dtype = DType::kBF16;
  return p;
}
template <class Fn>
Problem MutantCase(Problem p, Fn&& edit) {
  edit(p);
  return p;
}

GeneratorSpec Gaussian(uint64_t seed, nlohmann::json params = nlohmann::json::object()) {
  return GeneratorSpec{"gaussian", seed, std::move(params)};
}

// -- Paged KV and seqused (docs/semantics.md "Paged KV and seqused") --
// The documented case: two sequences in a pool of 16-key pages (the default table, backwards
// and interleaved), causal, the second sequence using 20 of its 48 keys and 9 of its queries.
Problem PagedCase() {
  Problem p = MutantCase(40, 48);
  p.batch = 2;
  p.causal = true;
  p.page_size = 16;
  p.seqused_q = std::vector<int32_t>{40, 9};
  p.seqused_k = std::vector<int32_t>{48, 20};
  FillPagedDefaults(p);
  return p;
}

}  // namespace

void AddPagedMutants(std::vector<MutantSpec>& rows) {
  const auto add = [&rows](MutantSpec m) { rows.push_back(std::move(m)); };
  add({.name = "page-index-off-by-one",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "the physical page computed one page off (table[b][j / page_size] + 1): each "
              "sequence reads the pool's next page, a neighbour's keys or a page no sequence "
              "owns (the block_table address arithmetic of vLLM's paged attention and "
              "FlashAttention's page_table)",
       .change = "hook PagedKeyRow: page index + 1",
       .bug_class = "non-interference",
       .hooks = &PageOffByOneHooks(),
       .problem = PagedCase(),
       .generator = Gaussian(140),
       .differs = {"o", "lse", "dq", "dk", "dv"}});
  add({.name = "last-page-overread",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "the key loop bounded by whole pages: a sequence whose used keys end inside a page "
              "reads the rest of that page (stale keys of an earlier request in a KV cache) as "
              "keys",
       .change = "hook UsedKeys: seqused_k rounded up to a whole page",
       .bug_class = "non-interference",
       .hooks = &LastPageOverreadHooks(),
       .problem = PagedCase(),
       .generator = Gaussian(141),
       .differs = {"o", "lse", "dq", "dk", "dv"}});
  add({.name = "seqused-k-ignored-in-backward",
       .parent = kBf16,
       .parent_recipe = "bf16",
       .bug = "seqused_k honoured by the forward only: the backward recomputes P over every key "
              "of the sequence's length, so keys past seqused_k get gradients and move dq",
       .change = "hook UsedKeys: the backward's key count is the sequence's length",
       .bug_class = "non-interference",
       .hooks = &SequsedKIgnoredInBackwardHooks(),
       .problem = PagedCase(),
       .generator = Gaussian(142),
       .differs = {"dq", "dk", "dv"}});
}

// -- Split-KV at the counts a kernel declares (cpu/flash2-splitkv-bf16: num_splits 1, 2, 3, 8) --
void AddSplitKvMutants(std::vector<MutantSpec>& rows) {
  const auto add = [&rows](MutantSpec m) { rows.push_back(std::move(m)); };
  const auto split3 = [](Problem& p) { p.num_splits = 3; };
  add({.name = "splitkv-combine-unnormalised",
       .parent = kSplitKvModelName,
       .parent_recipe = "bf16",
       .bug = "the split-KV combine weights each partial o_s by exp(lse_s − m) and never divides "
              "by Σ_s exp(lse_s − m): o is scaled up wherever two splits share the weight",
       .change = "hook CombineKvSplits: o = Σ_s exp(lse_s − m) o_s",
       .bug_class = "splits-agree",
       .hooks = &SplitKvUnnormalisedCombineHooks(),
       .problem = MutantCase(MutantCase(32, 300), split3),
       .generator = Gaussian(141),
       .differs = {"o", "dq", "dk"}});
  add({.name = "splitkv-boundary-off-by-one",
       .parent = kSplitKvModelName,
       .parent_recipe = "bf16",
       .bug = "a split's key range ends one key past its boundary, so the first key of the next "
              "split is counted by both",
       .change = "hook KvSplitEnd: end + 1",
       .bug_class = "splits-agree",
       .hooks = &SplitKvBoundaryOffByOneHooks(),
       .problem = MutantCase(MutantCase(32, 300), split3),
       .generator = Gaussian(142, {{"q", {{"std", 2.0}}}}),
       .differs = {"o", "lse", "dq", "dk", "dv"}});
  AddSplitKvSinkMutants(rows);  // sink_mutants.cc
}

}  // namespace attest
