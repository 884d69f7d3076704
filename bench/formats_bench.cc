// Element conversion throughput (fp32 -> e4m3fn and the other narrow formats): values per
// second of EncodeF32 (reference/formats/format.h) on a large fp32 tensor, per format and
// rounding mode, plus the tensor-level Convert (f64 -> codes).
// Run: build/<dir>/bench/formats_bench [--benchmark_filter=E4M3]
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "reference/formats/format.h"
#include "reference/formats/fp32_table_encoder.h"

namespace attest {
namespace {

constexpr int64_t kElements = int64_t{1} << 24;  // 16 M values, 64 MiB of fp32

// Gaussian values spread over many binades (scale 2^-12 .. 2^12) so that the subnormal,
// normal and overflow paths are all taken, as in activations before scaling.
const std::vector<float>& Inputs() {
  static const std::vector<float> inputs = [] {
    std::mt19937_64 rng(20261202);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> binade(-12, 12);
    std::vector<float> v(static_cast<size_t>(kElements));
    for (auto& x : v) x = std::ldexp(normal(rng), binade(rng));
    return v;
  }();
  return inputs;
}

void EncodeF32Loop(benchmark::State& state, Format f, EncodeOptions options) {
  const auto& in = Inputs();
  std::vector<uint8_t> out(in.size());
  for (auto _ : state) {
    for (size_t i = 0; i < in.size(); ++i) {
      out[i] = static_cast<uint8_t>(EncodeF32(in[i], f, options).code);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kElements);
}

void BM_EncodeF32_E4M3_RNE(benchmark::State& s) { EncodeF32Loop(s, Format::kE4M3FN, {}); }
void BM_EncodeF32_E4M3_RNE_Sat(benchmark::State& s) {
  EncodeF32Loop(s, Format::kE4M3FN, {.overflow = Overflow::kSaturate});
}
void BM_EncodeF32_E4M3_SR(benchmark::State& s) {
  EncodeF32Loop(s, Format::kE4M3FN,
                {.rounding = Rounding::kStochastic, .random_bits = 0x9E3779B9u});
}
void BM_EncodeF32_E2M1_RNE(benchmark::State& s) { EncodeF32Loop(s, Format::kE2M1FN, {}); }
void BM_EncodeF32_E8M0_RU(benchmark::State& s) {
  EncodeF32Loop(s, Format::kE8M0FNU, {.rounding = Rounding::kUp});
}
void BM_EncodeF32_BF16_RNE(benchmark::State& s) { EncodeF32Loop(s, Format::kBF16, {}); }

// The bulk path: Fp32TableEncoder (segment table + branchless binary search).
void TableLoop(benchmark::State& state, Format f, EncodeOptions options) {
  const auto& in = Inputs();
  std::vector<uint8_t> out(in.size());
  const auto table = Fp32TableEncoder::Make(f, options);
  if (!table.ok()) {
    state.SkipWithError(table.error().message.c_str());
    return;
  }
  for (auto _ : state) {
    table->Encode(in, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kElements);
}
void BM_Table_E4M3_RNE(benchmark::State& s) { TableLoop(s, Format::kE4M3FN, {}); }
void BM_Table_E4M3_RNE_Sat(benchmark::State& s) {
  TableLoop(s, Format::kE4M3FN, {.overflow = Overflow::kSaturate});
}
void BM_Table_E2M1_RNE(benchmark::State& s) { TableLoop(s, Format::kE2M1FN, {}); }

// Tensor path: f64 tensor -> e4m3fn codes through Convert (includes allocation and flags).
void BM_ConvertTensor_E4M3(benchmark::State& state) {
  const auto& in = Inputs();
  Tensor t = Tensor::Zeros(DType::kF64, {kElements});
  auto span = t.span<double>();
  for (int64_t i = 0; i < kElements; ++i) span[static_cast<size_t>(i)] = in[static_cast<size_t>(i)];
  for (auto _ : state) {
    auto codes = Convert(t, Format::kE4M3FN);
    benchmark::DoNotOptimize(codes);
  }
  state.SetItemsProcessed(state.iterations() * kElements);
}

// Decode: every e4m3fn code widened (Decode is exact, table-free).
void BM_Decode_E4M3(benchmark::State& state) {
  std::vector<double> out(kElements);
  for (auto _ : state) {
    for (int64_t i = 0; i < kElements; ++i) {
      out[static_cast<size_t>(i)] = Decode(static_cast<uint64_t>(i & 0xFF), Format::kE4M3FN);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * kElements);
}

BENCHMARK(BM_EncodeF32_E4M3_RNE)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeF32_E4M3_RNE_Sat)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeF32_E4M3_SR)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeF32_E2M1_RNE)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeF32_E8M0_RU)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeF32_BF16_RNE)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Table_E4M3_RNE)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Table_E4M3_RNE_Sat)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Table_E2M1_RNE)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvertTensor_E4M3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode_E4M3)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace attest

BENCHMARK_MAIN();
