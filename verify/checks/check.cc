// The check context (lazy oracle and kernel answers shared by the checks of one case) and
// the helpers every check uses to turn kernel answers into verdicts (see check.h; docs/design.md
// "Checks": a call may answer Unsupported but must never be silently wrong).
#include "verify/checks/check.h"

#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "reference/formats/format.h"

namespace attest {

OracleOptions CheckContext::SampledOptions() const {
  OracleOptions o = oracle_options;
  if (sample) {
    o.query_rows = &sample->query_rows;
    o.key_rows = &sample->key_rows;
  }
  if (inputs.sink.defined()) o.sink = &inputs.sink;  // the case's learnable sink
  if (inputs.rel_bias.defined()) o.rel_bias = &inputs.rel_bias;  // and relative bias
  return o;
}

const ForwardOut& CheckContext::OracleForward() {
  // A backward run already holds the forward it differentiated: reuse it.
  if (bwd_) {
    if (!fwd_) fwd_ = ForwardOut{bwd_->o, bwd_->lse, bwd_->stats};
    return *fwd_;
  }
  if (!fwd_) {
    try {
      fwd_ = OracleForwardOn(cuda_oracle ? &*cuda_oracle : nullptr, case_.problem, inputs.q,
                             inputs.k, inputs.v, SampledOptions());
    } catch (const std::exception& e) {
      throw HarnessError(std::string(cuda_oracle ? "GPU " : "") + "oracle forward: " + e.what());
    }
  }
  return *fwd_;
}

const BackwardOut& CheckContext::OracleBackward() {
  if (!bwd_) {
    try {
      bwd_ = OracleBackwardOn(cuda_oracle ? &*cuda_oracle : nullptr, case_.problem, inputs.q,
                              inputs.k, inputs.v, inputs.dout, SampledOptions());
    } catch (const std::exception& e) {
      throw HarnessError(std::string(cuda_oracle ? "GPU " : "") + "oracle backward: " + e.what());
    }
  }
  return *bwd_;
}

const KernelAnswer<ForwardResult>& CheckContext::KernelForward() {
  if (!kfwd_) {
    // A learnable sink goes to the kernel through its sink entry point, a relative bias
    // (with or without a sink) through its relative-bias one (kernels/kernel.h).
    kfwd_ = case_.problem.rel_bias
                ? kernel->ForwardRelBias(case_.problem, inputs.q, inputs.k, inputs.v,
                                         inputs.rel_bias, inputs.sink)
            : case_.problem.sink
                ? kernel->ForwardSink(case_.problem, inputs.q, inputs.k, inputs.v, inputs.sink)
                : kernel->Forward(case_.problem, inputs.q, inputs.k, inputs.v);
  }
  return *kfwd_;
}

const KernelAnswer<BackwardResult>& CheckContext::KernelBackward() {
  if (!kbwd_) {
    const auto& f = KernelForward();
    const auto* out = std::get_if<ForwardResult>(&f);
    if (out == nullptr) {
      kbwd_ = Error{"backward not run: the forward returned no outputs"};
    } else {
      kbwd_ = case_.problem.rel_bias
                  ? kernel->BackwardRelBias(case_.problem, inputs.q, inputs.k, inputs.v, out->o,
                                            out->lse, inputs.dout, inputs.rel_bias, inputs.sink)
              : case_.problem.sink
                  ? kernel->BackwardSink(case_.problem, inputs.q, inputs.k, inputs.v, out->o,
                                         out->lse, inputs.dout, inputs.sink)
                  : kernel->Backward(case_.problem, inputs.q, inputs.k, inputs.v, out->o,
                                     out->lse, inputs.dout);
    }
  }
  return *kbwd_;
}

bool CheckContext::WantsBackward() const {
  return kernel != nullptr && kernel->capabilities().backward && inputs.dout.defined() &&
         !sample.has_value();
}

bool JudgesLse(const Kernel& kernel) { return kernel.capabilities().lse; }

Verdict Failure(std::string_view check, std::string_view tensor, std::string policy,
                std::string message) {
  Verdict v;
  v.check = std::string(check);
  v.tensor = std::string(tensor);
  v.policy = std::move(policy);
  v.pass = false;
  v.observed = 1;
  v.allowed = 0;
  v.margin = std::numeric_limits<double>::infinity();
  v.message = std::move(message);
  return v;
}

std::string ErrorSummary(std::string_view kernel_name, std::string_view error) {
  // 1. The adapter's own text, and the stderr lines it quoted.
  constexpr std::string_view kStderr = "; stderr: ";
  const size_t cut = error.find(kStderr);
  std::string head(error.substr(0, cut));
  std::string last_line;
  if (cut != std::string_view::npos) {
    const std::string_view tail = error.substr(cut + kStderr.size());
    const size_t bar = tail.rfind(" | ");
    last_line = std::string(bar == std::string_view::npos ? tail : tail.substr(bar + 3));
  }
  // 2. The kernel's name is the report's; an operation named twice ("forward: forward: ")
  // by nested callers once.
  const std::string prefix = std::string(kernel_name) + ": ";
  if (!kernel_name.empty()) {
    if (const size_t at = head.find(prefix); at != std::string::npos) head.erase(at, prefix.size());
  }
  for (const char* op : {"forward: ", "backward: "}) {
    const std::string twice = std::string(op) + op;
    for (size_t at; (at = head.find(twice)) != std::string::npos;) head.erase(at, std::strlen(op));
  }
  // 3. A worker that relayed its kernel's message said it already; one that died did not,
  // and its last stderr line (the exception line of a Python traceback) does.
  if (!last_line.empty() && head.find("reported an error") == std::string::npos) {
    head += "; last stderr line: " + last_line;
  }
  // 4. One line, of a length a report row holds.
  if (const size_t nl = head.find('\n'); nl != std::string::npos) head.resize(nl);
  constexpr size_t kMax = 400;
  if (head.size() > kMax) head = head.substr(0, kMax) + "...";
  return head;
}

Verdict KernelError(const Kernel& kernel, std::string_view what, std::string_view error) {
  // "forward: forward: ..." when the adapter names the call too.
  std::string summary = ErrorSummary(kernel.name(), error);
  const std::string call = std::string(what) + ": ";
  if (summary.rfind(call, 0) == 0) summary.erase(0, call.size());
  Verdict v = Failure(kKernelErrorCheck, "", "every kernel call answers without error",
                      call + summary);
  // The whole text, its stderr tail one line per line (kernels/exec/process.h joins them
  // with " | ").
  constexpr std::string_view kStderr = "; stderr: ", kBar = " | ";
  const size_t cut = error.find(kStderr);
  std::string detail(error.substr(0, cut));
  if (cut != std::string_view::npos) {
    detail += "\nstderr (last lines):";
    std::string_view tail = error.substr(cut + kStderr.size());
    for (size_t bar = 0; bar != std::string_view::npos; tail.remove_prefix(bar + kBar.size())) {
      bar = tail.find(kBar);
      detail += '\n';
      detail.append(tail.substr(0, bar));
      if (bar == std::string_view::npos) break;
    }
  }
  v.detail = std::move(detail);
  return v;
}

Verdict Passing(std::string_view check, std::string_view tensor, std::string policy,
                std::string message) {
  Verdict v;
  v.check = std::string(check);
  v.tensor = std::string(tensor);
  v.policy = std::move(policy);
  v.pass = true;
  v.message = std::move(message);
  return v;
}

template <class T>
std::optional<std::vector<Verdict>> NonOutputVerdicts(std::string_view check, const Kernel& kernel,
                                                      const Problem& p,
                                                      const KernelAnswer<T>& answer,
                                                      std::string_view what) {
  if (std::holds_alternative<T>(answer)) return std::nullopt;
  std::vector<Verdict> out;
  if (const auto* e = std::get_if<Error>(&answer)) {
    out.push_back(KernelError(kernel, what, e->message));
    return out;
  }
  const auto& u = std::get<Unsupported>(answer);
  std::string why;
  const Capabilities caps = kernel.capabilities();
  const bool claimed = caps.Covers(p, &why) && (what != "backward" || caps.backward);
  if (claimed) {
    out.push_back(Failure(check, "", "a claimed feature is never refused",
                          fmt::format("{} answered Unsupported ({}) to a {} its capabilities "
                                      "cover",
                                      kernel.name(), u.reason, what)));
  }
  return out;  // empty: an honest refusal; the check does not apply
}

template std::optional<std::vector<Verdict>> NonOutputVerdicts<ForwardResult>(
    std::string_view, const Kernel&, const Problem&, const KernelAnswer<ForwardResult>&,
    std::string_view);
template std::optional<std::vector<Verdict>> NonOutputVerdicts<BackwardResult>(
    std::string_view, const Kernel&, const Problem&, const KernelAnswer<BackwardResult>&,
    std::string_view);

std::string ShapeString(const Shape& s) {
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + "]";
}

Status CheckOutputTensor(const Tensor& t, std::string_view name, const Shape& shape) {
  if (!t.defined()) return Error{fmt::format("{}: not returned", name)};
  const DType dt = t.dtype();
  if (!Info(dt).is_float || dt == DType::kE8M0FNU) {
    return Error{fmt::format("{}: dtype {} is not a float output dtype", name, Name(dt))};
  }
  if (t.shape() != shape) {
    return Error{fmt::format("{}: shape {}, the problem needs {}", name, ShapeString(t.shape()),
                             ShapeString(shape))};
  }
  return {};
}

void Finish(std::vector<Verdict>& verdicts, const CheckContext& ctx) {
  for (Verdict& v : verdicts) {
    // Checks that name the case themselves are left as they are.
    const std::string tag = "[" + ctx.label + "]";
    if (!ctx.label.empty() && v.message.find(tag) == std::string::npos) {
      v.message = tag + " " + v.message;
    }
    if (!v.pass && v.repro.empty()) v.repro = ctx.repro;
  }
}

}  // namespace attest

namespace attest {

Location LocateElement(const Problem& p, std::string_view tensor, const Shape& shape,
                       int64_t flat) {
  std::vector<int64_t> index(shape.size());
  int64_t rest = flat;
  for (int64_t a = static_cast<int64_t>(shape.size()) - 1; a >= 0; --a) {
    const auto ua = static_cast<size_t>(a);
    index[ua] = shape[ua] > 0 ? rest % shape[ua] : 0;
    rest = shape[ua] > 0 ? rest / shape[ua] : 0;
  }
  Location loc = Locate(LayoutOf(p, tensor), index);
  loc.flat = flat;
  return loc;
}

BitwiseDiff DiffBitwise(const Tensor& a, const Tensor& b) {
  BitwiseDiff d;
  const Tensor wa = ToF64(a), wb = ToF64(b);
  const auto sa = wa.span<const double>();
  const auto sb = wb.span<const double>();
  for (size_t e = 0; e < sa.size() && e < sb.size(); ++e) {
    if (std::memcmp(&sa[e], &sb[e], sizeof(double)) == 0) continue;
    if (d.differing++ == 0) {
      d.first = static_cast<int64_t>(e);
      d.a = sa[e];
      d.b = sb[e];
    }
  }
  return d;
}

}  // namespace attest
