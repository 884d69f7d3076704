// Deterministic input generators: the same (problem, generator name, seed, params) gives
// bit-identical float64 q, k, v, do on any machine, compiler, thread count and libm
// (docs/design.md "Case files": "the same case file gives bit-identical inputs on any machine").
//
// How: every element draws from its own counter-based stream (Philox-4x32-10, Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3", SC'11), keyed by the seed and addressed by
// (tensor id, flat element index, block), and every distribution is built from IEEE-754
// correctly rounded operations only (+ - * / sqrt, and a log written here in those), never
// from std::log/exp/cos, whose last bit differs between libm implementations.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "reference/data/generator_spec.h"
#include "reference/problem/problem.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

// --- The counter-based bit source -------------------------------------------------------

// Philox-4x32 with 10 rounds: a bijection of the 128-bit counter under a 64-bit key.
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Stream ids of the four input tensors (the third counter word). Generators that need
// auxiliary randomness (e.g. which channels are outliers) use ids >= kFirstAuxStream.
enum TensorStream : uint32_t {
  kStreamQ = 0,
  kStreamK = 1,
  kStreamV = 2,
  kStreamDO = 3,
  kStreamSink = 4,    // the learnable sink [Hq] (Problem::sink)
  kStreamRelBias = 5  // the relative bias [Hq, Sq + Sk - 1] (Problem::rel_bias)
};
inline constexpr uint32_t kFirstAuxStream = 16;

// The random words of one element: counter (index lo, index hi, stream, block), two 64-bit
// words per block. Cheap to construct; elements are independent of evaluation order.
class ElementStream {
 public:
  ElementStream(uint64_t seed, uint32_t stream, uint64_t index)
      : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
        index_(index),
        stream_(stream) {}

  uint64_t NextU64();
  // Uniform on [0, 1): the top 53 bits of a word times 2^-53 (exact).
  double NextUniform();
  // Standard normal by Marsaglia's polar method, with DeterministicLog.
  double NextNormal();

 private:
  std::array<uint32_t, 2> key_;
  uint64_t index_;
  uint32_t stream_;
  uint32_t block_ = 0;
  std::array<uint32_t, 4> buffer_{};
  int used_ = 4;  // 32-bit words of buffer_ consumed
};

// Natural log from + - * / only (frexp-style exponent split done on the bit pattern, then
// 2*atanh series as in fdlibm e_log.c): identical on every IEEE-754 machine; within 1 ulp of
// glibc log over 10^6 random doubles (generate_test) for
// finite x > 0. Returns -inf for 0 and NaN for x < 0 or NaN.
double DeterministicLog(double x);

// --- Generators ---------------------------------------------------------------------------

// What a generator row fills: one tensor of the problem, with its parameters resolved (the
// tensor's override object merged over the top-level params and the row's defaults).
struct FillContext {
  const Problem* problem = nullptr;
  std::string_view tensor;  // "q", "k", "v" or "do"
  uint32_t stream = 0;
  uint64_t seed = 0;
  Shape shape;
  nlohmann::json params;  // resolved: every parameter of the row is present
  // Tensors generated before this one (q, then k, v, do), for generators that correlate them.
  const std::vector<const Tensor*>* earlier = nullptr;
};

struct GeneratorParam {
  std::string_view name;
  double default_value;
  std::string_view help;
  // Non-empty: a text parameter (a format name) with this default; default_value is unused.
  // Text parameters travel as JSON strings, every other parameter as a finite number.
  std::string_view text_default = {};
  bool is_text() const { return !text_default.empty(); }
};

// One row of the generator table. Adding a distribution is adding a row (in generate.cc, or in
// another file compiled with -ffp-contract=off, see reference/data/CMakeLists.txt), using only
// ElementStream draws and + - * / sqrt DeterministicLog on them.
struct GeneratorRow {
  std::string_view name;
  std::string_view description;
  std::vector<GeneratorParam> params;  // parameters, overridable per tensor
  // Checks one tensor's resolved params (e.g. low < high); `where` prefixes messages.
  Status (*check)(const nlohmann::json& params, const std::string& where) = nullptr;
  // Fills `out` (the tensor's elements, row-major) from ctx.
  void (*fill)(const FillContext& ctx, std::span<double> out) = nullptr;
};

std::span<const GeneratorRow> GeneratorTable();
std::vector<std::string> GeneratorNames();

struct GeneratedInputs {
  Tensor q, k, v, dout;  // f64, the problem's shapes, NOT rounded to the problem's dtype
  Tensor sink;           // [Hq] f64 when Problem::sink (NOT rounded to float32), else undefined
  Tensor rel_bias;       // [Hq, Sq + Sk - 1] f64 when Problem::rel_bias (likewise)
};

// A paged or seqused problem's inputs (GenerateInputs calls it; generate_paged.cc): the rows
// the same problem without pages and seqused gets, with every key of sequence b at
// KeyRow(b, j) of the pool (reference/problem/paged.h), and hostile rows (NaN, +-30000,
// another sequence's rows, in turn) on queries past seqused_q, keys past seqused_k, pool
// slots past a sequence's keys and pages no sequence reads (docs/semantics.md "Paged KV and
// seqused").
Expected<GeneratedInputs> PlaceLogicalInputs(const Problem& p, const GeneratorSpec& spec);

// The sink logits of a problem with Problem::sink, whatever the generator row: the params'
// "sink" object, either {"mean": m, "std": s} (defaults 0 and 1: sink_h = m + s * the first
// normal of ElementStream(seed, kStreamSink, h)) or {"values": [x, ...]} (head h takes
// values[h mod n]; a number whose float32 rounding is finite, or the string "-inf", which
// removes the sink: docs/semantics.md). Huge sinks are values such as 1e30.
// The relative bias of a problem with Problem::rel_bias likewise from the "rel_bias" object,
// element e of the row-major [Hq, Sq + Sk - 1] table from ElementStream(seed, kStreamRelBias,
// e) or values[e mod n] (numbers only: the bias is finite).

// Checks the spec against the table: known name, known parameter names (top level and in
// per-tensor overrides {"q": {...}, "k": ..., "v": ..., "do": ...}), numeric and valid values,
// and the "sink" / "rel_bias" objects (only for a problem with that input).
Status ValidateGeneratorSpec(const Problem& p, const GeneratorSpec& spec);
Expected<GeneratedInputs> GenerateInputs(const Problem& p, const GeneratorSpec& spec);

}  // namespace attest
