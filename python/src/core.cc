// attest._core: the C++ library under the Python package (python/attest/). It runs suites on
// a kernel named by spec, exactly as `attest check` does (tools/attest/cmd_check.cc: RunSuite,
// then the coverage guard), and returns the reports as text; it lists a suite's rows for a
// kernel's capabilities (the pytest plugin's items); it runs the command line in-process
// (tools/attest/cli_main.h); and it registers the prefix `py:` with the kernel registry, so
// that a Python callable is a kernel like any other for every command.
//
// Tensors cross the boundary by DLPack without a copy on the way in (attest -> Python: a
// read-only view whose capsule keeps attest's storage alive) and with one copy on the way
// out (Python -> attest: the kernel's outputs are copied into attest-owned tensors, so that
// nothing the caller frees later is read). Python kernels run with the GIL held; the suite
// itself runs without it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "kernels/exec/children.h"
#include "kernels/kernel.h"
#include "reference/dtype.h"
#include "reference/oracle/cuda/oracle_cuda_host.h"
#include "reference/problem/problem.h"
#include "run/build_info.h"
#include "run/check_run.h"
#include "tools/attest/command.h"
#include "tools/attest/cli_main.h"
#include "run/coverage.h"
#include "verify/report/exit_codes.h"
#include "verify/report/report.h"
#include "run/run.h"
#include "run/suite.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace attest {
namespace {

// ---- Tensors ----

std::optional<nb::dlpack::dtype> DlpackOf(DType d) {
  using nb::dlpack::dtype_code;
  auto make = [](dtype_code c, int bits) {
    return nb::dlpack::dtype{static_cast<uint8_t>(c), static_cast<uint8_t>(bits), 1};
  };
  switch (d) {
    case DType::kF64: return make(dtype_code::Float, 64);
    case DType::kF32: return make(dtype_code::Float, 32);
    case DType::kF16: return make(dtype_code::Float, 16);
    case DType::kBF16: return make(dtype_code::Bfloat, 16);
    // FP8 and E8M0 travel as their codes (uint8); the problem's dtype names the format.
    case DType::kE4M3FN:
    case DType::kE5M2:
    case DType::kE8M0FNU:
    case DType::kU8: return make(dtype_code::UInt, 8);
    case DType::kI32: return make(dtype_code::Int, 32);
    case DType::kI64: return make(dtype_code::Int, 64);
  }
  return std::nullopt;
}

std::optional<DType> DTypeOf(nb::dlpack::dtype t) {
  using nb::dlpack::dtype_code;
  const auto code = static_cast<dtype_code>(t.code);
  if (t.lanes != 1) return std::nullopt;
  if (code == dtype_code::Float && t.bits == 64) return DType::kF64;
  if (code == dtype_code::Float && t.bits == 32) return DType::kF32;
  if (code == dtype_code::Float && t.bits == 16) return DType::kF16;
  if (code == dtype_code::Bfloat && t.bits == 16) return DType::kBF16;
  return std::nullopt;
}

// A read-only DLPack view of `t` (nanobind's ndarray object: torch.from_dlpack and
// numpy.from_dlpack take it). Its capsule holds a Tensor sharing t's storage. A view attest
// does not own (the layouts check's slices, transposes and head slices with gaps,
// verify/checks/layouts.h) keeps its strides: the bytes it spans are copied, gaps included,
// and the array views that copy as `t` views its storage, so that a Python kernel is handed
// the layout a model would hand it (declared by Capabilities::strides; a contiguous copy
// would hide a kernel that ignores strides).
nb::object ToPython(const Tensor& t) {
  if (!t.defined()) return nb::none();
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
  const auto dl = DlpackOf(t.dtype());
  if (!dl) throw std::runtime_error("tensor dtype without a DLPack code: " + t.Describe());
  int64_t last = 0;  // the largest element offset the view reaches
  bool strided = !t.owning() && !t.contiguous() && t.numel() > 0;
  for (size_t i = 0; strided && i < shape.size(); ++i) {
    if (strides[i] < 0) strided = false;  // not a layout the checks make: copied contiguous
    last += static_cast<int64_t>(shape[i] - 1) * strides[i];
  }
  Tensor* keep = nullptr;
  std::byte* data = nullptr;
  if (strided) {
    keep = new Tensor(Tensor::Zeros(t.dtype(), Shape{last + 1}));
    std::memcpy(keep->bytes(), t.bytes(), static_cast<size_t>(keep->nbytes()));
    data = keep->bytes();
  } else {
    keep = new Tensor(t.owning() ? t : t.Clone());
    data = keep->bytes();
    strides.assign(keep->strides().begin(), keep->strides().end());
  }
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  nb::ndarray<nb::ro> array(data, shape.size(), shape.data(), owner, strides.data(), *dl,
                            nb::device::cpu::value);
  return nb::cast(array, nb::rv_policy::reference);
}

// An attest-owned copy of a CPU array (any strides) in f64/f32/f16/bf16; `what` names it in
// errors ("forward: o").
Tensor FromPython(nb::handle obj, const std::string& what) {
  nb::ndarray<nb::ro, nb::device::cpu> array;
  if (!nb::try_cast(obj, array)) {
    throw std::invalid_argument(fmt::format(
        "{}: expected a CPU tensor or array (DLPack), got {}", what,
        nb::cast<std::string>(nb::str(obj.type()))));
  }
  const auto dtype = DTypeOf(array.dtype());
  if (!dtype) {
    throw std::invalid_argument(
        fmt::format("{}: dtype (DLPack code {}, {} bits) is not f64, f32, f16 or bf16", what,
                    array.dtype().code, array.dtype().bits));
  }
  Shape shape, strides;
  for (size_t i = 0; i < array.ndim(); ++i) {
    shape.push_back(static_cast<int64_t>(array.shape(i)));
    strides.push_back(array.stride(i));
  }
  Tensor out = Tensor::Zeros(*dtype, shape);
  if (out.numel() > 0) {
    out.CopyFrom(Tensor::View(*dtype, shape, strides, const_cast<void*>(array.data())));
  }
  return out;
}

// ---- Python kernels ----

// Raised through RunSuite when Python asked to stop (Ctrl-C): the run ends, and check()
// re-raises the KeyboardInterrupt.
struct StopRequested : std::runtime_error {
  StopRequested() : std::runtime_error("interrupted") {}
};

// Shared by every PyKernel: set when a Python call raised KeyboardInterrupt or SystemExit
// (never a verdict: the user asked to stop).
bool g_python_stop = false;

// A kernel whose calls go to a Python bridge object (python/attest/_kernel.py Bridge):
//   bridge.forward(problem_json, q, k, v) and
//   bridge.backward(problem_json, q, k, v, o, lse, do) return
//   ("ok", outputs...) | ("unsupported", reason) | ("error", message);
//   bridge.route() returns a note about the last call.
class PyKernel final : public Kernel {
 public:
  PyKernel(nb::object bridge, std::string name, Capabilities caps)
      : bridge_(std::move(bridge)), name_(std::move(name)), caps_(std::move(caps)) {}
  ~PyKernel() override {
    nb::gil_scoped_acquire gil;
    bridge_.reset();
  }

  std::string name() const override { return name_; }
  Capabilities capabilities() const override { return caps_; }

  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    // q, k, v in the input dtype (kernel.h InInputDType), as the exec protocol sends them.
    auto in = Inputs(p, {&q, &k, &v}, {"q", "k", "v"});
    if (auto* e = std::get_if<Error>(&in)) return Error{"forward: " + e->message};
    const auto& t3 = std::get<0>(in);
    nb::gil_scoped_acquire gil;
    auto reply = Call("forward", [&] {
      return bridge_.attr("forward")(ProblemToJson(p).dump(), ToPython(t3[0]),
                                     ToPython(t3[1]), ToPython(t3[2]));
    });
    if (auto* other = std::get_if<1>(&reply)) return Other<ForwardResult>(*other);
    nb::tuple t = std::get<0>(reply);
    ForwardResult r;
    r.o = FromPython(t[1], "forward: o");
    if (!t[2].is_none()) r.lse = FromPython(t[2], "forward: lse");
    return r;
  }

  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    // q, k, v and dO in the input dtype; o and lse as this kernel's forward returned them.
    auto in = Inputs(p, {&q, &k, &v, &dout}, {"q", "k", "v", "do"});
    if (auto* e = std::get_if<Error>(&in)) return Error{"backward: " + e->message};
    const auto& t4 = std::get<0>(in);
    nb::gil_scoped_acquire gil;
    auto reply = Call("backward", [&] {
      return bridge_.attr("backward")(ProblemToJson(p).dump(), ToPython(t4[0]),
                                      ToPython(t4[1]), ToPython(t4[2]), ToPython(o),
                                      ToPython(lse), ToPython(t4[3]));
    });
    if (auto* other = std::get_if<1>(&reply)) return Other<BackwardResult>(*other);
    nb::tuple t = std::get<0>(reply);
    return BackwardResult{FromPython(t[1], "backward: dq"), FromPython(t[2], "backward: dk"),
                          FromPython(t[3], "backward: dv")};
  }

  std::string last_route() const override {
    nb::gil_scoped_acquire gil;
    try {
      return nb::cast<std::string>(bridge_.attr("route")());
    } catch (const nb::python_error&) {
      return {};
    }
  }

 private:
  static std::variant<std::vector<Tensor>, Error> Inputs(
      const Problem& p, std::initializer_list<const Tensor*> tensors,
      std::initializer_list<const char*> names) {
    std::vector<Tensor> out;
    auto name = names.begin();
    for (const Tensor* t : tensors) {
      auto c = InInputDType(*t, p.dtype, *name++);
      if (!c.ok()) return c.error();
      out.push_back(std::move(c).value());
    }
    return out;
  }

  // What a call answered other than outputs.
  using NotOk = std::variant<Unsupported, Error>;
  template <class R>
  static KernelAnswer<R> Other(const NotOk& n) {
    if (const auto* u = std::get_if<Unsupported>(&n)) return *u;
    return std::get<Error>(n);
  }

  // Runs one bridge call; an exception the bridge let through (it catches every Exception)
  // or a malformed reply is an error of the call. Output conversion errors are errors too.
  template <class F>
  std::variant<nb::tuple, NotOk> Call(const char* op, F&& call) {
    if (g_python_stop) return NotOk{Error{std::string(op) + ": interrupted"}};
    try {
      nb::object reply = call();
      nb::tuple t = nb::cast<nb::tuple>(reply);
      const std::string status = nb::cast<std::string>(t[0]);
      if (status == "unsupported") return NotOk{Unsupported{nb::cast<std::string>(t[1])}};
      if (status == "error") return NotOk{Error{nb::cast<std::string>(t[1])}};
      if (status != "ok") throw std::invalid_argument("unknown status " + status);
      return t;
    } catch (nb::python_error& e) {
      if (e.matches(PyExc_KeyboardInterrupt) || e.matches(PyExc_SystemExit)) {
        g_python_stop = true;
        return NotOk{Error{std::string(op) + ": interrupted"}};
      }
      return NotOk{Error{fmt::format("{}: {}", op, e.what())}};
    } catch (const std::exception& e) {
      return NotOk{Error{fmt::format("{}: {}", op, e.what())}};
    }
  }

  nb::object bridge_;
  std::string name_;
  Capabilities caps_;
};

// The Python function that maps a `py:` spec's rest to a bridge (attest._kernel.lookup),
// kept for the life of the process (never released: the registry outlives the interpreter).
PyObject* g_lookup = nullptr;

Expected<std::unique_ptr<Kernel>> CreatePyKernel(std::string_view arg) {
  nb::gil_scoped_acquire gil;
  if (g_lookup == nullptr) return Error{"py: kernels need the attest Python package"};
  try {
    nb::object bridge = nb::borrow(g_lookup)(std::string(arg));
    if (bridge.is_none()) {
      return Error{fmt::format("py:{}: no Python kernel of that id in this process", arg)};
    }
    const std::string name = nb::cast<std::string>(bridge.attr("name"));
    const std::string caps_text = nb::cast<std::string>(bridge.attr("capabilities_json"));
    nlohmann::json caps_json = nlohmann::json::parse(caps_text, nullptr, false);
    if (caps_json.is_discarded()) return Error{name + ": capabilities are not JSON"};
    auto caps = CapabilitiesFromJson(caps_json);
    if (!caps.ok()) return Error{name + ": capabilities: " + caps.error().message};
    return std::unique_ptr<Kernel>(new PyKernel(std::move(bridge), name, *caps));
  } catch (const nb::python_error& e) {
    return Error{fmt::format("py:{}: {}", arg, e.what())};
  }
}

// ---- Suites ----

struct CheckRun {
  int exit_code = kExitUsage;
  std::string error;
  std::string json, junit, console, markdown;
  std::vector<std::string> failure_cases;
  std::string note;  // why a CUDA kernel's oracle ran on the CPU (empty: nothing to say)
};

// `attest check` (tools/attest/cmd_check.cc RunCheck) as values: the same request, validation
// and run (run/check_run.h), the same report writers; `display_spec` is the kernel as
// reports and repro lines name it.
CheckRun Check(const std::string& spec, const std::string& display_spec,
               const std::string& suite_name, uint64_t seed, const std::string& only_check,
               const std::optional<std::string>& failure_dir, int threads,
               std::optional<double> time_budget_s, double max_skipped, bool allow_skips,
               bool verbose, const std::string& oracle_device) {
  CheckRun out;
  auto usage = [&](std::string why) {
    out.exit_code = kExitUsage;
    out.error = std::move(why);
    return out;
  };
  CheckRequest request;
  request.kernel_spec = display_spec;
  request.suite = suite_name;
  request.seed = seed;
  request.only_check = only_check;
  if (failure_dir) request.failure_dir = *failure_dir;
  request.threads = threads;
  request.oracle_device = oracle_device;
  request.time_budget_s = time_budget_s;
  request.max_skipped = max_skipped;
  request.allow_skips = allow_skips;
  request.progress = [](const RunOptions::Progress&) {
    nb::gil_scoped_acquire gil;
    if (g_python_stop || PyErr_CheckSignals() != 0) throw StopRequested();
  };
  const CheckFieldNames fields{"suite", "check", "max_skipped", "oracle_device"};
  try {
    ValidateCheckNames(request, fields);
  } catch (const UsageError& e) {
    return usage(e.what());
  }
  std::unique_ptr<Kernel> kernel;
  {
    nb::gil_scoped_release release;
    auto made = Kernels().Create(spec);
    if (!made.ok()) return usage(made.error().message);
    kernel = std::move(made).value();
  }
  PreparedCheck prepared;
  try {
    prepared = PrepareCheck(request, *kernel, fields);
  } catch (const UsageError& e) {
    return usage(e.what());
  }
  out.note = prepared.oracle_note;
  g_python_stop = false;
  std::optional<Expected<RunResult>> result;
  try {
    nb::gil_scoped_release release;
    result.emplace(RunCheckSuite(*kernel, *prepared.suite, prepared.options, prepared.policy));
    kernel.reset();
  } catch (const StopRequested&) {
    { nb::gil_scoped_release release; kernel.reset(); }
    if (!PyErr_Occurred()) PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw nb::python_error();
  }
  if (!result->ok()) return usage(result->error().message);
  const Report& report = (*result)->report;
  out.exit_code = report.passed() ? kExitPass : kExitFinding;
  out.json = ToJsonText(report);
  out.junit = ToJUnitXml(report);
  out.markdown = ToMarkdown(report);
  out.console = ToConsole(report, verbose ? Verbosity::kVerbose : Verbosity::kDefault);
  for (const auto& path : (*result)->failure_cases) out.failure_cases.push_back(path.string());
  return out;
}

// The rows `suite` runs for a kernel with `caps_json` under `seed` (suite.h RowsFor), each
// as {check, label, skipped}: what the pytest plugin makes its items of.
std::vector<nb::dict> SuiteRows(const std::string& suite_name, const std::string& caps_json,
                                uint64_t seed) {
  const Suite* suite = nullptr;
  try {
    suite = &SuiteNamed(suite_name, "suite");
  } catch (const UsageError& e) {
    throw std::invalid_argument(e.what());
  }
  nlohmann::json j = nlohmann::json::parse(caps_json, nullptr, false);
  if (j.is_discarded()) throw std::invalid_argument("capabilities are not JSON");
  auto caps = CapabilitiesFromJson(j);
  if (!caps.ok()) throw std::invalid_argument("capabilities: " + caps.error().message);
  std::vector<nb::dict> rows;
  for (const SuiteRow& row : RowsFor(*suite, *caps, seed)) {
    InstantiatedCase inst = Instantiate(row, *caps, seed);
    nb::dict d;
    d["check"] = row.check;
    d["label"] = inst.label;
    d["skipped"] = inst.skipped;
    rows.push_back(std::move(d));
  }
  return rows;
}

int RunCli(const std::vector<std::string>& args, bool own_process) {
  if (own_process) {  // `python -m attest`: the process is the command line's (main.cc)
    BecomeSubreaper();
    InstallSignalCleanup();
  }
  std::vector<std::string> words{"attest"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  nb::gil_scoped_release release;
  return cli::Main(static_cast<int>(argv.size()), argv.data(), own_process);
}

}  // namespace
}  // namespace attest

NB_MODULE(_core, m) {
  using namespace attest;
  m.doc() = "attest's C++ library: suites, reports, the command line (python/src/core.cc)";
  m.attr("version") = std::string(AttestVersion());
  m.attr("commit") = std::string(AttestCommit());

  nb::class_<CheckRun>(m, "CheckRun")
      .def_ro("exit_code", &CheckRun::exit_code)
      .def_ro("error", &CheckRun::error)
      .def_ro("json", &CheckRun::json)
      .def_ro("junit", &CheckRun::junit)
      .def_ro("console", &CheckRun::console)
      .def_ro("markdown", &CheckRun::markdown)
      .def_ro("failure_cases", &CheckRun::failure_cases)
      .def_ro("note", &CheckRun::note);

  m.def("set_lookup", [](nb::object lookup) {
    Kernels();  // the built-ins first
    if (g_lookup == nullptr) {
      KernelRegistry::Global().RegisterPrefix("py:", CreatePyKernel);
    } else {
      Py_DECREF(g_lookup);
    }
    g_lookup = lookup.release().ptr();
  });
  // nb::arg().none(): nanobind 2 refuses None for an argument unless it is marked so.
  m.def("check", &Check, "spec"_a, "display_spec"_a, "suite"_a, "seed"_a, "only_check"_a,
        "failure_dir"_a.none(), "threads"_a, "time_budget_s"_a.none(), "max_skipped"_a,
        "allow_skips"_a, "verbose"_a, "oracle_device"_a);
  m.def("suite_rows", &SuiteRows, "suite"_a, "capabilities_json"_a, "seed"_a);
  m.def("cli", &RunCli, "args"_a, "own_process"_a = false);
  // Where the CUDA oracle's library is loaded from (the search of oracle_cuda_host.h) and
  // whether it finds a GPU: {"library": path or "", "devices": n, "why": the reason for none}.
  m.def("cuda_oracle", []() {
    nb::dict out;
    std::string library, why;
    int devices = 0;
    {
      nb::gil_scoped_release release;
      try {
        library = CudaOracleLibrary();
        devices = CudaDeviceCount(&why);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    out["library"] = library;
    out["devices"] = devices;
    out["why"] = why;
    return out;
  });
  m.def("kernel_capabilities", [](const std::string& spec) {
    std::unique_ptr<Kernel> kernel;
    {
      nb::gil_scoped_release release;
      auto made = Kernels().Create(spec);
      if (!made.ok()) throw std::invalid_argument(made.error().message);
      kernel = std::move(made).value();
    }
    std::string text = CapabilitiesToJson(kernel->capabilities()).dump();
    nb::gil_scoped_release release;
    kernel.reset();
    return text;
  });
}
