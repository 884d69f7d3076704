// tolerance_sweep: the evidence table of docs/tolerances.md (profiles
// whose numbers cite their evidence). For every cpu/ low-precision model and each of its
// tensors it measures the ratio r = max|kernel - oracle| / max|recipe reference - oracle| (the
// quantity the recipe profiles bound by k; verify/tolerance/baseline.h RecipeReference*) and the profile
// margin (observed / allowed, the accuracy verdict), over the gate suite's accuracy cases
// (seed 0) and over N random cases (shapes, masks, GQA, softcap, ALiBi drawn from a fixed
// seed), and prints max and p99 of each as Markdown rows.
//
//   tolerance_sweep [--random N] [--seed S] [--kernel K]   (defaults: 300, 1, every model)
//
// Run: cmake --build build --target tolerance_sweep && build/run/tolerance_sweep
// (about a minute per model on two cores for N = 300).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/builtin.h"
#include "kernels/kernel.h"
#include "kernels/models/lowp_models.h"
#include "reference/case/inputs.h"
#include "reference/oracle/oracle.h"
#include "verify/tolerance/baseline.h"
#include "verify/metrics/metrics.h"
#include "run/suite.h"
#include "verify/tolerance/tolerance.h"

namespace attest {
namespace {

struct Samples {
  std::vector<double> ratio, margin;
};

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto n = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
  return v[std::min(n, v.size() - 1)];
}

// One case: kernel, oracle and recipe reference; appends one sample per tensor.
bool Measure(Kernel& kernel, const Profile& profile, const Case& c,
             std::map<std::string, Samples>& out) {
  auto in = MakeCaseInputs(c);
  if (!in.ok()) return false;
  const Problem& p = c.problem;
  const bool bwd = kernel.capabilities().backward;
  auto f = kernel.Forward(p, in->q, in->k, in->v);
  if (!std::holds_alternative<ForwardResult>(f)) return false;
  const ForwardResult& fr = std::get<ForwardResult>(f);
  std::vector<std::pair<std::string, Tensor>> obs = {{"o", fr.o}, {"lse", fr.lse}};
  if (bwd) {
    auto b = kernel.Backward(p, in->q, in->k, in->v, fr.o, fr.lse, in->dout);
    if (!std::holds_alternative<BackwardResult>(b)) return false;
    const BackwardResult& br = std::get<BackwardResult>(b);
    obs.push_back({"dq", br.dq});
    obs.push_back({"dk", br.dk});
    obs.push_back({"dv", br.dv});
  }
  const BackwardOut oracle = Backward<double>(p, in->q, in->k, in->v, in->dout);
  auto base = ProfileBaseline(profile, p, in->q, in->k, in->v, bwd ? &in->dout : nullptr);
  if (!base.ok()) {
    std::fprintf(stderr, "%s\n", base.error().message.c_str());
    return false;
  }
  const std::map<std::string, std::pair<const Tensor*, const Tensor*>> refs = {
      {"o", {&oracle.o, &base->o}},    {"lse", {&oracle.lse, &base->lse}},
      {"dq", {&oracle.dq, &base->dq}}, {"dk", {&oracle.dk, &base->dk}},
      {"dv", {&oracle.dv, &base->dv}}};
  for (const auto& [name, t] : obs) {
    const auto& [ref, bt] = refs.at(name);
    const Format fmt = FormatOf(t.dtype()).value_or(Format::kF64);
    auto m = Compare(name, t, *ref, fmt, LayoutOf(p, name));
    auto bm = Compare(name, *bt, *ref, fmt, LayoutOf(p, name));
    if (!m.ok() || !bm.ok()) continue;
    if (bm->max_abs_error == 0) continue;  // nothing to divide by (e.g. every row empty)
    double margin = 0;
    for (const Verdict& v : EvaluateProfile(profile, *m, &*bm)) margin = std::max(margin, v.margin);
    out[name].ratio.push_back(m->max_abs_error / bm->max_abs_error);
    out[name].margin.push_back(margin);
  }
  return true;
}

// A random problem inside the model's capabilities (bf16, D from its head dims up to 128).
Case RandomCase(std::mt19937_64& rng, const Capabilities& caps, uint64_t seed) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Case c;
  Problem& p = c.problem;
  p.dtype = DType::kBF16;
  std::vector<int64_t> dims;
  for (int64_t d : caps.head_dims) {
    if (d <= 128) dims.push_back(d);
  }
  p.head_dim = dims[static_cast<size_t>(pick(0, static_cast<int64_t>(dims.size()) - 1))];
  p.head_dim_v = pick(0, 3) == 0
                     ? dims[static_cast<size_t>(pick(0, static_cast<int64_t>(dims.size()) - 1))]
                     : p.head_dim;
  p.batch = pick(1, 2);
  p.heads_kv = pick(1, 2);
  p.heads_q = p.heads_kv * (caps.gqa && pick(0, 1) ? pick(1, 4) : 1);
  p.seqlen_q = pick(1, 200);
  p.seqlen_k = pick(1, 200);
  switch (pick(0, 4)) {
    case 0: break;
    case 1: p.causal = true; break;
    case 2:
      p.window_left = pick(0, 64);
      p.window_right = pick(0, 1) ? pick(0, 64) : 0;
      break;
    case 3: p.softcap = std::vector<double>{5, 20, 30}[static_cast<size_t>(pick(0, 2))]; break;
    case 4: {
      std::vector<double> slopes;
      for (int64_t h = 0; h < p.heads_q; ++h) slopes.push_back(std::exp2(-1.0 - static_cast<double>(h)));
      p.alibi_slopes = slopes;
      p.causal = pick(0, 1) == 1;
      break;
    }
  }
  c.generator = GeneratorSpec{"gaussian", seed, nlohmann::json::object()};
  return c;
}

int Main(int argc, char** argv) {
  int random = 300;
  uint64_t seed = 1;
  std::string only;
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string k = argv[a];
    if (k == "--random") random = std::atoi(argv[a + 1]);
    if (k == "--seed") seed = std::strtoull(argv[a + 1], nullptr, 10);
    if (k == "--kernel") only = argv[a + 1];
  }
  std::printf("| model | tensor | cases | ratio max | ratio p99 | k | margin max | margin p99 |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const LowpModelSpec& spec : LowpModelSpecs()) {
    if (!only.empty() && only != spec.name) continue;
    auto kernel = Kernels().Create(spec.name);
    if (!kernel.ok()) return 2;
    const Capabilities caps = (*kernel)->capabilities();
    auto profile = ProfileFor(caps);
    if (!profile.ok()) return 2;
    const Profile& prof = **profile;
    for (const bool gate : {true, false}) {
      std::map<std::string, Samples> samples;
      int cases = 0;
      if (gate) {
        std::vector<std::string> seen;
        for (const SuiteRow& row : FindSuite("gate")->rows) {
          if (row.check != "accuracy") continue;
          InstantiatedCase inst = Instantiate(row, caps, 0);
          if (!inst.c) continue;
          const std::string text = inst.label;
          if (std::find(seen.begin(), seen.end(), text) != seen.end()) continue;
          seen.push_back(text);
          cases += Measure(**kernel, prof, *inst.c, samples);
        }
      } else {
        std::mt19937_64 rng(seed);
        for (int n = 0; n < random; ++n) {
          Case c = RandomCase(rng, caps, seed * 1000003 + static_cast<uint64_t>(n));
          if (!caps.Covers(c.problem)) continue;
          cases += Measure(**kernel, prof, c, samples);
        }
      }
      for (const char* t : {"o", "lse", "dq", "dk", "dv"}) {
        auto it = samples.find(t);
        if (it == samples.end()) continue;
        const std::vector<Policy>* pol = prof.For(t);
        const double k = pol != nullptr && !pol->empty() ? pol->front().ratio : 0;
        std::printf("| `%s` %s | %s | %zu | %.3g | %.3g | %g | %.3g | %.3g |\n",
                    std::string(spec.name).c_str(), gate ? "gate" : "random", t,
                    it->second.ratio.size(), Quantile(it->second.ratio, 1.0),
                    Quantile(it->second.ratio, 0.99), k, Quantile(it->second.margin, 1.0),
                    Quantile(it->second.margin, 0.99));
      }
      std::fflush(stdout);
      (void)cases;
    }
  }
  return 0;
}

}  // namespace
}  // namespace attest

int main(int argc, char** argv) { return attest::Main(argc, argv); }
