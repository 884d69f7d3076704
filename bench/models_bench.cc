// Forward + backward wall time of the CPU numerics models (kernels/models/flash_models.h,
// lowp_models.h) at the benchmark shape B=1, H=8, S=2048, D=128,
// non-causal and causal, on every hardware thread. Prints a markdown table (docs/kernels.md
// quotes it).
// Usage: models_bench [S] [repeats] [name filter]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "kernels/builtin.h"
#include "reference/formats/format.h"

namespace attest {
namespace {

Tensor RandomInput(const Shape& shape, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> values(static_cast<size_t>(Tensor::NumElements(shape)));
  for (double& x : values) x = dist(rng);
  return RoundTensor(Tensor::FromF64(shape, std::move(values)), dtype);
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

int Run(int64_t s, int repeats, const std::string& filter) {
  std::printf("B=1 H=8 S=%lld D=128, %u threads, best of %d\n\n", static_cast<long long>(s),
              std::thread::hardware_concurrency(), repeats);
  std::printf("| kernel | causal | forward s | backward s | fwd+bwd s | route |\n");
  std::printf("|---|---|---|---|---|---|\n");
  // Optional third argument: run only kernels whose name contains it (e.g. "mxfp8").
  for (const char* name :
       {"cpu/flash2-bf16", "cpu/flash2-fp16", "cpu/feather-fp16", "cpu/mxfp8-cudnn",
        "cpu/mxfp8-pvbf16", "cpu/nvfp4-mixed", "cpu/fp8-e4m3-tensor"}) {
    if (!filter.empty() && std::string(name).find(filter) == std::string::npos) continue;
    for (bool causal : {false, true}) {
      Problem p;
      p.batch = 1;
      p.heads_q = p.heads_kv = 8;
      p.seqlen_q = p.seqlen_k = s;
      p.head_dim = p.head_dim_v = 128;
      p.causal = causal;
      auto kernel = Kernels().Create(name);
      if (!kernel.ok()) {
        std::fprintf(stderr, "%s\n", kernel.error().message.c_str());
        return 2;
      }
      p.dtype = (*kernel)->capabilities().dtypes.at(0);
      const Tensor q = RandomInput(p.QShape(), p.dtype, 1), k = RandomInput(p.KShape(), p.dtype, 2),
                   v = RandomInput(p.VShape(), p.dtype, 3), d = RandomInput(p.OShape(), p.dtype, 4);
      double best_f = 1e30, best_b = 1e30;
      bool forward_only = false;
      for (int r = 0; r < repeats; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        auto fwd = (*kernel)->Forward(p, q, k, v);
        best_f = std::min(best_f, Seconds(t0));
        if (!std::holds_alternative<ForwardResult>(fwd)) return 2;
        const auto& f = std::get<ForwardResult>(fwd);
        t0 = std::chrono::steady_clock::now();
        auto bwd = (*kernel)->Backward(p, q, k, v, f.o, f.lse, d);
        best_b = std::min(best_b, Seconds(t0));
        // A forward-only kernel (cpu/fp8-e4m3-tensor) answers Unsupported: no backward time.
        if (std::holds_alternative<Unsupported>(bwd)) {
          forward_only = true;
          continue;
        }
        if (!std::holds_alternative<BackwardResult>(bwd)) return 2;
      }
      if (forward_only) {
        std::printf("| %s | %s | %.2f | (unsupported) | %.2f | %s |\n", name,
                    causal ? "yes" : "no", best_f, best_f, (*kernel)->last_route().c_str());
      } else {
        std::printf("| %s | %s | %.2f | %.2f | %.2f | %s |\n", name, causal ? "yes" : "no",
                    best_f, best_b, best_f + best_b, (*kernel)->last_route().c_str());
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace attest

int main(int argc, char** argv) {
  const int64_t s = argc > 1 ? std::atoll(argv[1]) : 2048;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 1;
  return attest::Run(s, repeats, argc > 3 ? argv[3] : "");
}
