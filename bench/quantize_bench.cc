// Block quantization throughput: values per second
// of Quantize() (reference/formats/quantize.h) for MXFP8, MXFP4, NVFP4 and FP8 schemes on a
// large [2048, 4096] fp32-valued tensor, single thread. One Google Benchmark table; the
// `items_per_second` column is values/s. Run: build/<dir>/bench/quantize_bench
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "reference/formats/quantize.h"

namespace attest {
namespace {

const Tensor& Input() {
  static const Tensor t = [] {
    std::mt19937 rng(1);
    std::normal_distribution<double> normal;
    std::vector<double> v(size_t{2048} * 4096);
    for (auto& e : v) e = static_cast<float>(normal(rng));
    return Tensor::FromF64({2048, 4096}, std::move(v));
  }();
  return t;
}

void BM_Quantize(benchmark::State& state, std::string scheme, std::optional<ScaleMode> mode,
                 Nvfp4Variant variant) {
  const Tensor& t = Input();
  SchemeOptions o;
  o.scheme = std::move(scheme);
  o.scale_mode = mode;
  o.nvfp4_variant = variant;
  for (auto _ : state) {
    auto q = Quantize(t, o);
    if (!q.ok()) state.SkipWithError(q.error().message.c_str());
    benchmark::DoNotOptimize(q);
  }
  state.SetItemsProcessed(state.iterations() * t.numel());
}

constexpr auto kTE = Nvfp4Variant::kTransformerEngine;
BENCHMARK_CAPTURE(BM_Quantize, mxfp8_e4m3_floor, "mxfp8-e4m3", ScaleMode::kFloor, kTE)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Quantize, mxfp8_e4m3_rceil, "mxfp8-e4m3", ScaleMode::kRceil, kTE)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Quantize, mxfp4_floor, "mxfp4", ScaleMode::kFloor, kTE)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Quantize, nvfp4_te, "nvfp4", std::nullopt, kTE)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Quantize, nvfp4_torchao, "nvfp4", std::nullopt, Nvfp4Variant::kTorchao)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Quantize, fp8_tensor_e4m3, "fp8-tensor-e4m3", std::nullopt, kTE)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Quantize, fp8_block_e4m3, "fp8-block-e4m3", std::nullopt, kTE)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace attest

BENCHMARK_MAIN();
