// Case inputs: generated from the seed and rounded to the problem's dtype, or read from the
// case's safetensors file and widened exactly (see inputs.h).
#include "reference/case/inputs.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "reference/data/generate.h"
#include "reference/formats/format.h"
#include "reference/golden/sha256.h"
#include "reference/io/safetensors.h"
#include "reference/problem/budget.h"

namespace attest {
namespace {

// A file's tensor must already hold values of the problem's dtype: the oracle runs on what
// the kernel saw, so a silent rounding here would judge the kernel on other data.
Status CheckRepresentable(const Tensor& f64, DType dtype, std::string_view name,
                          const std::string& file) {
  const Tensor rounded = RoundTensor(f64, dtype);
  const auto a = f64.span<const double>();
  const auto r = rounded.span<const double>();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same = std::memcmp(&a[i], &r[i], sizeof(double)) == 0 ||
                      (std::isnan(a[i]) && std::isnan(r[i]));
    if (!same) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad == 0) return {};
  return Error{fmt::format(
      "{}: tensor '{}': {} values are not representable in the problem's dtype {} (first at "
      "flat index {}: {}); convert the file first (attest convert --to {})",
      file, name, bad, Name(dtype), first, a[static_cast<size_t>(first)], Name(dtype))};
}

// The file's "sink" tensor: F32, [Hq], each value finite or -inf; present iff problem.sink.
Status ReadSink(const Case& c, const NamedTensors& file, CaseInputs& in) {
  const std::string& path = *c.inputs;
  const Tensor* t = file.Find("sink");
  if (t == nullptr) {
    if (!c.problem.sink) return {};
    return Error{fmt::format("{}: no tensor named 'sink' (problem.sink is true: sink [{}] F32)",
                             path, c.problem.heads_q)};
  }
  if (!c.problem.sink) {
    return Error{fmt::format(
        "{}: tensor 'sink' is present but problem.sink is false (set it, or drop the tensor)",
        path)};
  }
  if (t->dtype() != DType::kF32) {
    return Error{fmt::format("{}: tensor 'sink' has dtype {}, expected f32 (float32)", path,
                             Name(t->dtype()))};
  }
  if (t->shape() != c.problem.SinkShape()) {
    return Error{fmt::format("{}: tensor 'sink': shape [{}] does not match the problem's [{}] "
                             "(one logit per query head)",
                             path, fmt::join(t->shape(), ", "), c.problem.heads_q)};
  }
  in.sink = ToF64(*t);
  const auto x = in.sink.span<const double>();
  for (size_t h = 0; h < x.size(); ++h) {
    if (std::isnan(x[h]) || x[h] == std::numeric_limits<double>::infinity()) {
      return Error{fmt::format("{}: tensor 'sink': sink[{}] = {} (a sink is finite or -inf)",
                               path, h, x[h])};
    }
  }
  return {};
}

// The file's "rel_bias" tensor: F32, [Hq, seqlen_q + seqlen_k - 1], finite; present iff
// problem.rel_bias.
Status ReadRelBias(const Case& c, const NamedTensors& file, CaseInputs& in) {
  const std::string& path = *c.inputs;
  const Tensor* t = file.Find("rel_bias");
  const Shape want = c.problem.RelBiasShape();
  if (t == nullptr) {
    if (!c.problem.rel_bias) return {};
    return Error{fmt::format(
        "{}: no tensor named 'rel_bias' (problem.rel_bias is true: rel_bias [{}] F32)", path,
        fmt::join(want, ", "))};
  }
  if (!c.problem.rel_bias) {
    return Error{fmt::format("{}: tensor 'rel_bias' is present but problem.rel_bias is false "
                             "(set it, or drop the tensor)",
                             path)};
  }
  if (t->dtype() != DType::kF32) {
    return Error{fmt::format("{}: tensor 'rel_bias' has dtype {}, expected f32 (float32)", path,
                             Name(t->dtype()))};
  }
  if (t->shape() != want) {
    return Error{fmt::format("{}: tensor 'rel_bias': shape [{}] does not match the problem's "
                             "[{}] (heads_q, seqlen_q + seqlen_k - 1)",
                             path, fmt::join(t->shape(), ", "), fmt::join(want, ", "))};
  }
  in.rel_bias = ToF64(*t);
  const auto x = in.rel_bias.span<const double>();
  for (size_t e = 0; e < x.size(); ++e) {
    if (!std::isfinite(x[e])) {
      return Error{fmt::format("{}: tensor 'rel_bias': element {} is {} (the bias is finite)",
                               path, e, x[e])};
    }
  }
  return {};
}

Expected<CaseInputs> FromFile(const Case& c) {
  const std::string& path = *c.inputs;
  auto file = ReadSafetensors(path);
  if (!file.ok()) return file.error();
  CaseInputs in;
  struct Slot {
    const char* name;
    Tensor* out;
    bool required;
  };
  const Slot slots[] = {{"q", &in.q, true}, {"k", &in.k, true}, {"v", &in.v, true},
                        {"do", &in.dout, false}};
  for (const Slot& s : slots) {
    const Tensor* t = file->Find(s.name);
    if (t == nullptr) {
      if (s.required) return Error{fmt::format("{}: no tensor named '{}'", path, s.name)};
      continue;
    }
    if (!Info(t->dtype()).is_float || t->dtype() == DType::kE8M0FNU) {
      return Error{fmt::format("{}: tensor '{}' has dtype {}, not a float input dtype", path,
                               s.name, Name(t->dtype()))};
    }
    *s.out = ToF64(*t);
    if (Status st = CheckRepresentable(*s.out, c.problem.dtype, s.name, path); !st.ok()) {
      return st.error();
    }
  }
  if (Status st = ValidateInputShapes(c.problem, in.q, in.k, in.v,
                                      in.dout.defined() ? &in.dout : nullptr);
      !st.ok()) {
    return Error{path + ": " + st.error().message};
  }
  if (Status st = ReadSink(c, *file, in); !st.ok()) return st.error();
  if (Status st = ReadRelBias(c, *file, in); !st.ok()) return st.error();
  return in;
}

}  // namespace

Expected<CaseInputs> MakeCaseInputs(const Case& c) {
  // Before anything of the problem's size is allocated or read.
  if (Status s = CheckProblemBudget(c.problem); !s) return s.error();
  if (c.inputs) return FromFile(c);
  if (!c.generator) return Error{"case: neither 'inputs' nor 'generator' is set"};
  auto gen = GenerateInputs(c.problem, *c.generator);
  if (!gen.ok()) return gen.error();
  // docs/design.md: generated in float64, rounded to the kernel's input dtype (in place: the
  // generated tensors are this function's own).
  const DType dtype = c.problem.dtype;
  for (Tensor* t : {&gen->q, &gen->k, &gen->v, &gen->dout}) RoundTensorInPlace(*t, dtype);
  // The sink is float32 whatever the dtype (Problem::sink).
  if (gen->sink.defined()) RoundTensorInPlace(gen->sink, DType::kF32);
  if (gen->rel_bias.defined()) RoundTensorInPlace(gen->rel_bias, DType::kF32);  // likewise
  return CaseInputs{std::move(gen->q),    std::move(gen->k),    std::move(gen->v),
                    std::move(gen->dout), std::move(gen->sink), std::move(gen->rel_bias)};
}

uint64_t CaseSeed(const Case& c) {
  return c.generator ? c.generator->seed : ContentHash64(CaseToText(c));
}

}  // namespace attest
