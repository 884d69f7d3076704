// Generators of attention cases for property tests and `attest fuzz` (docs/fuzz.md):
// problems inside a kernel's Capabilities (B; Hq/Hkv with GQA ratios; Sq, Sk biased toward
// tile boundaries +-1 and tiny values; D, Dv from the kernel's lists; no mask / causal in both
// alignments / windows, some wider than Sk / packed documents with zero-length documents /
// per-token documents / prefix-LM / block-sparse lists / softcap / ALiBi) and value
// distributions (every row of reference/data/generate.h), with scalars drawn from bit
// patterns (exponent and mantissa fields) rather than from a real-valued range.
//
// The drawing code is written once against Picker, a source of bounded integers, and runs on
// two backends: PhiloxPicker (attest fuzz: the same seed gives the same case on any machine,
// independent of RapidCheck's version) and, in rc_gen.h, RapidCheck's gen::exec (property
// tests: RapidCheck records every pick and shrinks them). Every case is built valid by
// construction (no filtering); DrawCase asserts Validate and caps.Covers.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "reference/case/case_file.h"
#include "reference/data/generate.h"
#include "reference/problem/problem.h"

namespace attest {

// A source of integers: Int(lo, hi) is uniform-ish on [lo, hi] (inclusive, lo <= hi).
class Picker {
 public:
  virtual ~Picker() = default;
  virtual int64_t Int(int64_t lo, int64_t hi) = 0;

  // True with probability numerator / denominator. The lowest pick means "no", so that
  // RapidCheck, which shrinks picks toward their lower bound, shrinks features away.
  bool Chance(int numerator, int denominator) {
    return Int(0, denominator - 1) >= denominator - numerator;
  }
  // Index into `weights`, chosen with probability proportional to its weight.
  size_t Weighted(std::initializer_list<int> weights);
  template <class T>
  const T& Element(const std::vector<T>& items) {
    return items[static_cast<size_t>(Int(0, static_cast<int64_t>(items.size()) - 1))];
  }
};

// Counter-based picks: pick n reads Philox(seed, stream kFuzzStream, index n), so a case
// depends only on (seed, the sequence of bounds asked), never on the platform.
class PhiloxPicker final : public Picker {
 public:
  explicit PhiloxPicker(uint64_t seed) : seed_(seed) {}
  int64_t Int(int64_t lo, int64_t hi) override;

 private:
  uint64_t seed_;
  uint64_t count_ = 0;
};

// Bounds of the drawn shapes. The defaults keep one case of a CPU model in milliseconds.
struct DrawLimits {
  int64_t max_seqlen = 160;  // Sq, Sk (the tile-boundary picks 129 for tiles of 128 included)
  int64_t max_batch = 3;
  int64_t max_heads_kv = 2;
  int64_t max_gqa_ratio = 4;
  int64_t max_head_dim = 128;  // when the kernel lists head dims, the smallest few are used
  int64_t max_documents = 4;   // packed (varlen) sequences or per-token documents per row
  // Value distributions to draw from (names of GeneratorTable()); empty: DomainGenerators().
  std::vector<std::string> generators;
};

// Distributions inside every model's numerical domain (the tolerance profiles are calibrated
// for them): gaussian, uniform, outlier-channels, heavy-tail (dof >= 3), token-scale-spread
// (<= 3 decades), peaked-logits, constant-rows, ties, near-fp8-subnormal (scaled into the
// normal range of bf16/f16 inputs). near-max is the one left out: logits of max^2 overflow an
// fp32 score in any real kernel, which is a property of the format, not of a kernel.
std::vector<std::string> DomainGenerators();

// The tile sizes whose boundaries (one and two tiles, +-1) the sequence lengths are biased
// toward.
inline constexpr int64_t kTileSizes[] = {16, 32, 64, 128};

// One problem inside `caps`.
Problem DrawProblem(const Capabilities& caps, Picker& pick, const DrawLimits& limits = {});
// A generator spec for `p` (a row of `limits.generators` with drawn parameters and seed).
GeneratorSpec DrawGenerator(const Problem& p, Picker& pick, const DrawLimits& limits = {});
// Both, as a case (generator-backed, so the case file alone reproduces it).
Case DrawCase(const Capabilities& caps, Picker& pick, const DrawLimits& limits = {});
// Paged KV and seqused for a drawn case of the check that judges them (non-interference;
// run/fuzz.cc DrawFuzzCase), when the kernel claims them: half the time a
// page size of 1, 3 or 16 (the default table, paged.h FillPagedDefaults) and, two times in
// three, seqused lengths drawn per sequence. Drawn after everything else of the case, so that
// the rest of it is what the same picker gives without this step.
void DrawPaging(const Capabilities& caps, Picker& pick, Problem& p);
// After a shrink step changed lengths or the batch: seqused clamped (dropped when the batch
// changed) and the default page table rebuilt.
void RepageAfterResize(Problem& p);

// A double drawn from fields: sign * 2^e * (1 + m / 2^mbits) with e in [emin, emax] and m a
// mantissa of mbits bits (exact for mbits <= 52).
double DrawBitPattern(Picker& pick, int emin, int emax, int mbits, bool allow_negative);

// ---- Shrinking --------------------------------------------------------------------------

// Simpler variants of `c` that stay inside `caps`, most aggressive first: fewer batch
// entries and documents, shorter sequences (halved, then minus one), fewer heads, smaller
// head dims, no softcap / ALiBi / explicit scale / prefix-LM / block-sparse / window /
// causal, plainer documents, a plainer generator (gaussian with default parameters). The
// generator seed is kept (the data of a shrunk case is the same stream read at new shapes).
std::vector<Case> ShrinkCandidates(const Case& c, const Capabilities& caps);

// A size measure that every candidate strictly decreases (so shrinking terminates).
int64_t CaseComplexity(const Case& c);

struct ShrinkResult {
  Case c;
  int steps = 0;     // accepted simplifications
  int attempts = 0;  // candidates tried
};
// Greedy deterministic shrinking: repeatedly takes the first candidate for which `fails`
// holds, until none does or `max_attempts` candidates were tried.
ShrinkResult Shrink(const Case& c, const Capabilities& caps,
                    const std::function<bool(const Case&)>& fails, int max_attempts = 400);

}  // namespace attest
