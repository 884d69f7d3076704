// The exec protocol's client (docs/design.md "External kernels"; docs/protocol.md): a Kernel
// whose calls are requests to a worker process, used by `exec:` kernels and by forked
// (isolated) in-process kernels alike. Every way a worker can fail becomes an Error answer
// naming what happened; the worker is restarted on the next call.
#include "kernels/exec/exec_kernel.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <mutex>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/exec/children.h"
#include "kernels/exec/process.h"
#include "kernels/exec/reply.h"
#include "reference/formats/format.h"
#include "reference/io/files.h"
#include "reference/io/json.h"
#include "reference/io/safetensors.h"

namespace attest {
namespace {

using Clock = WorkerProcess::Clock;

// Consecutive failed starts (spawn or describe) after which calls fail at once instead of
// paying a worker's start-up (seconds for a PyTorch import) again for every case.
constexpr int kMaxConsecutiveStartFailures = 3;

// A call that times out restarts the worker for the next call; this many consecutive
// timeouts mark the kernel hung, and every later call fails at once without a worker, so
// that a kernel that hangs costs two timeouts per run instead of one per call.
constexpr int kTimeoutsUntilHung = 2;

// The longest call timeout accepted (a week): deadlines are steady_clock time points, which a
// larger (or infinite) limit would overflow.
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;

// Room for a safetensors header beyond the outputs' data (names, dtypes, shapes, padding).
constexpr uint64_t kOutputHeaderAllowance = uint64_t{1} << 20;

// The most bytes the outputs file of a call can hold: the outputs' elements in f64 (the
// widest dtype a worker may answer in) plus a header.
uint64_t MaxOutputBytes(std::initializer_list<Shape> shapes) {
  uint64_t bytes = kOutputHeaderAllowance;
  for (const Shape& s : shapes) {
    bytes += static_cast<uint64_t>(Tensor::NumElements(s)) * sizeof(double);
  }
  return bytes;
}

// A private directory (mkdtemp: mode 0700, unique) removed with everything in it.
class TempDir {
 public:
  static Expected<std::shared_ptr<TempDir>> Make(const std::string& root_option) {
    std::string root = root_option;
    if (root.empty()) {
      const char* env = std::getenv("TMPDIR");
      root = env != nullptr && *env != '\0' ? env : "/tmp";
    }
    std::string templ = root + "/attest-exec-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) {
      return Error{fmt::format("cannot create a temporary directory under {}: {}", root,
                               std::strerror(errno))};
    }
    // Registered, so that attest stopped by a signal removes it too (files.h).
    RegisterTempPath(templ);
    return std::shared_ptr<TempDir>(new TempDir(templ));
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    UnregisterTempPath(path_);
  }
  const std::string& path() const { return path_; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// Removes the per-call tensor files however the call ends.
struct FileCleanup {
  std::vector<std::string> paths;
  ~FileCleanup() {
    std::error_code ec;
    for (const auto& p : paths) std::filesystem::remove(p, ec);
  }
};

std::string ShapeText(const Shape& s) {
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + "]";
}

// An output tensor the reply promised: present, a float dtype, the problem's shape.
Status CheckOutput(const NamedTensors& file, std::string_view name, const Shape& shape,
                   Tensor* out) {
  const Tensor* t = file.Find(name);
  if (t == nullptr) {
    std::string have;
    for (const auto& [n, tensor] : file.tensors) have += (have.empty() ? "" : ", ") + n;
    return Error{fmt::format("output '{}' missing from the outputs file (it holds: {})", name,
                             have.empty() ? "nothing" : have)};
  }
  switch (t->dtype()) {
    case DType::kF64:
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kE4M3FN:
    case DType::kE5M2:
      break;
    default:
      return Error{fmt::format("output '{}' has dtype {}, not a float format", name,
                               Name(t->dtype()))};
  }
  if (t->shape() != shape) {
    return Error{fmt::format("output '{}' has shape {}, expected {}", name, ShapeText(t->shape()),
                             ShapeText(shape))};
  }
  *out = *t;
  return {};
}

class ProtocolKernel final : public Kernel {
 public:
  using Launch = std::function<Expected<WorkerProcess>()>;

  // `label` names the kernel in messages until describe has answered; afterwards name() is
  // options.name, else the label, else (name_from_worker) the worker's describe name.
  ProtocolKernel(std::string label, bool name_from_worker, Launch launch, ExecOptions options,
                 std::shared_ptr<TempDir> dir)
      : label_(std::move(label)),
        name_from_worker_(name_from_worker),
        launch_(std::move(launch)),
        options_(std::move(options)),
        dir_(std::move(dir)) {}

  // Starts the worker and records its describe reply (the kernel's identity from then on).
  Status Start() {
    const auto deadline = Clock::now() + Timeout();
    if (Status s = EnsureRunning(deadline); !s) return s;
    return {};
  }

  std::string name() const override {
    if (!options_.name.empty()) return options_.name;
    if (name_from_worker_ && !worker_name_.empty()) return worker_name_;
    return label_;
  }
  Capabilities capabilities() const override { return caps_; }
  std::string last_route() const override { return route_; }

  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    NamedTensors in;
    nlohmann::json views = nlohmann::json::object();
    for (auto [n, t] : {std::pair{"q", &q}, std::pair{"k", &k}, std::pair{"v", &v}}) {
      auto c = InInputDType(*t, p.dtype, n);
      if (!c) return Fail("forward", c.error().message);
      AddInput(in, views, n, *c);
    }
    auto reply = Call("forward", p, in, MaxOutputBytes({p.OShape(), p.LseShape()}), views);
    if (auto* e = std::get_if<Error>(&reply)) return *e;
    if (auto* u = std::get_if<Unsupported>(&reply)) return *u;
    const NamedTensors& out = std::get<NamedTensors>(reply);
    ForwardResult r;
    if (Status s = CheckOutput(out, "o", p.OShape(), &r.o); !s) {
      return Fail("forward", s.error().message);
    }
    // A worker that declares "lse": false is not asked for lse; one it writes anyway is
    // ignored (r.lse stays undefined, as the capability promises the checks).
    if (caps_.lse) {
      if (Status s = CheckOutput(out, "lse", p.LseShape(), &r.lse); !s) {
        return Fail("forward", s.error().message);
      }
    }
    return r;
  }

  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    NamedTensors in;
    // q, k, v and dO in the input dtype; o and lse as this kernel's forward returned them.
    nlohmann::json views = nlohmann::json::object();
    for (auto [n, t] : {std::pair{"q", &q}, std::pair{"k", &k}, std::pair{"v", &v},
                        std::pair{"do", &dout}}) {
      auto c = InInputDType(*t, p.dtype, n);
      if (!c) return Fail("backward", c.error().message);
      AddInput(in, views, n, *c);
    }
    AddInput(in, views, "o", o);
    if (caps_.lse) AddInput(in, views, "lse", lse);  // a worker without lse gets none
    auto reply = Call("backward", p, in, MaxOutputBytes({p.QShape(), p.KShape(), p.VShape()}),
                      views);
    if (auto* e = std::get_if<Error>(&reply)) return *e;
    if (auto* u = std::get_if<Unsupported>(&reply)) return *u;
    const NamedTensors& out = std::get<NamedTensors>(reply);
    BackwardResult r;
    for (auto [n, shape, dst] :
         {std::tuple{"dq", p.QShape(), &r.dq}, std::tuple{"dk", p.KShape(), &r.dk},
          std::tuple{"dv", p.VShape(), &r.dv}}) {
      if (Status s = CheckOutput(out, n, shape, dst); !s) {
        return Fail("backward", s.error().message);
      }
    }
    return r;
  }

 private:
  std::chrono::steady_clock::duration Timeout() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(options_.timeout_s));
  }

  // Adds input `name`. A view (a strided tensor, the layouts check's) goes to a worker whose
  // interface takes views (Capabilities::strides) as what it is: the storage it spans, flat,
  // and under "views" its shape and element strides (docs/protocol.md "Views"); to any other
  // worker as a contiguous copy.
  void AddInput(NamedTensors& in, nlohmann::json& views, const char* name, const Tensor& t) const {
    if (!t.defined() || t.contiguous()) {
      in.Add(name, t);
      return;
    }
    if (caps_.strides == "contiguous") {
      in.Add(name, t.Clone());
      return;
    }
    int64_t extent = 1;  // elements from the first to the last one the view reaches
    for (int64_t d = 0; d < t.rank(); ++d) {
      extent += (t.dim(d) - 1) * t.strides()[static_cast<size_t>(d)];
    }
    const Tensor flat = Tensor::View(t.dtype(), {extent}, {1}, t.bytes()).Clone();
    in.Add(name, flat);
    views[name] = {{"shape", t.shape()}, {"strides", t.strides()}, {"offset", 0}};
  }

  Error Fail(std::string_view op, const std::string& what) const {
    return Error{fmt::format("{}: {}: {}", name(), op, what)};
  }

  // Starts the worker if it is not running and checks its describe reply; on a restart
  // the reply must equal the first one (a kernel does not change what it claims mid-run).
  // `timed_out` (optional) is set when describe did not answer in time. A worker that cannot
  // be started once the run is under way (fork or spawn failing) is an infrastructure fault.
  Status EnsureRunning(Clock::time_point deadline, bool* timed_out = nullptr) {
    if (worker_ && worker_->running()) return {};
    worker_.reset();
    if (start_failures_ >= kMaxConsecutiveStartFailures) {
      return Error{fmt::format("worker failed to start {} times in a row; not retrying (last: {})",
                               start_failures_, last_start_error_)};
    }
    auto fail = [&](std::string what) -> Status {
      ++start_failures_;
      last_start_error_ = what;
      if (worker_) worker_->Kill();
      worker_.reset();
      return Error{std::move(what)};
    };
    auto w = launch_();
    if (!w) {
      if (starts_ > 0)
        throw InfrastructureError(name() + ": restarting the worker: " + w.error().message);
      return fail(w.error().message);
    }
    worker_.emplace(std::move(w).value());
    ++starts_;
    auto line = worker_->Exchange(R"({"op":"describe"})", deadline);
    if (!line) {
      if (timed_out != nullptr) *timed_out = worker_->timed_out();
      return fail("describe: worker " + line.error().message);
    }
    auto reply = ParseDescribeReply(*line);
    if (!reply) return fail("describe: " + reply.error().message);
    // The protocol does not carry the learnable sink yet (docs/protocol.md "Capabilities"):
    // a claim would send sink problems to a worker that never receives the sink.
    if (reply->capabilities.sink) {
      return fail("describe: capabilities.sink: true is not supported by the exec protocol "
                  "yet (no sink input, no dsink output)");
    }
    if (reply->capabilities.rel_bias) {
      return fail("describe: capabilities.rel_bias: true is not supported by the exec protocol "
                  "yet (no rel_bias input, no drel_bias output)");
    }
    if (starts_ == 1) {
      caps_ = reply->capabilities;
      caps_json_ = reply->capabilities_json;
      worker_name_ = reply->name;
    } else if (reply->capabilities_json != caps_json_ || reply->name != worker_name_) {
      return fail("describe: after a restart the worker describes itself differently (" +
                  JsonExcerpt(reply->capabilities_json) + ")");
    }
    start_failures_ = 0;
    return {};
  }

  // After a call timed out: what happens next, for its message.
  std::string RecordTimeout() {
    if (++consecutive_timeouts_ < kTimeoutsUntilHung)
      return "; the worker is restarted for the next call";
    hung_ = true;
    return fmt::format("; {} consecutive calls timed out: the kernel is marked hung and no further "
                       "call is made",
                       consecutive_timeouts_);
  }

  using Reply = std::variant<NamedTensors, Unsupported, Error>;

  // One forward/backward request: inputs written, request sent, reply checked, outputs read,
  // all before one deadline.
  Reply Call(std::string_view op, const Problem& p, const NamedTensors& inputs,
             uint64_t max_output_bytes, const nlohmann::json& views) {
    std::lock_guard<std::mutex> lock(mu_);
    if (StopSignal() != 0)
      return Fail(op, "not run: attest is stopping (" + StopSignalName() + ")");
    if (hung_) {
      return Fail(op, fmt::format("not run: the kernel hangs ({} consecutive calls timed out after "
                                  "{} s each; no further call is made in this run)",
                                  consecutive_timeouts_, options_.timeout_s));
    }
    const auto deadline = Clock::now() + Timeout();
    route_.clear();
    const bool restarted = starts_ > 0 && !(worker_ && worker_->running());
    bool describe_timed_out = false;
    if (Status s = EnsureRunning(deadline, &describe_timed_out); !s) {
      std::string message = s.error().message;
      if (describe_timed_out) message += RecordTimeout();
      return Fail(op, message);
    }
    if (restarted) route_ = fmt::format("worker restarted (start #{})", starts_);
    const uint64_t n = ++calls_;
    FileCleanup cleanup;
    const std::string in_path = fmt::format("{}/{}-{}-inputs.safetensors", dir_->path(), n, op);
    const std::string out_path = fmt::format("{}/{}-{}-outputs.safetensors", dir_->path(), n, op);
    cleanup.paths = {in_path, out_path};
    // A full disk or TMPDIR is attest's problem, not the kernel's: stop the run (exit 2).
    if (Status s = WriteSafetensors(in_path, inputs); !s) {
      throw InfrastructureError(fmt::format("{}: {}: cannot write the inputs file: {}", name(), op,
                                            s.error().message));
    }
    nlohmann::json request = {
        {"op", op}, {"problem", ProblemToJson(p)}, {"inputs", in_path}, {"outputs", out_path}};
    if (!views.empty()) request["views"] = views;
    auto line = worker_->Exchange(request.dump(), deadline);
    if (!line) {
      const bool timed_out = worker_->timed_out();
      worker_.reset();  // Exchange killed and reaped it; the next call starts a fresh one
      std::string message = "worker " + line.error().message;
      if (timed_out) {
        message += RecordTimeout();
      } else {
        consecutive_timeouts_ = 0;
      }
      return Fail(op, message);
    }
    consecutive_timeouts_ = 0;
    // A reply we cannot read means the worker's state is unknown: replace it.
    auto violation = [&](std::string what) {
      worker_->Kill();
      worker_.reset();
      return Fail(op, "protocol violation: " + what + " (worker killed; restarted on the next call)");
    };
    auto reply = ParseCallReply(*line);
    if (!reply) return violation(reply.error().message);
    if (reply->status == CallReply::Status::kUnsupported) return Unsupported{reply->text};
    if (reply->status == CallReply::Status::kError) {
      std::string message = "worker reported an error: " + reply->text;
      if (const std::string tail = worker_->StderrText(); !tail.empty()) {
        message += "; stderr: " + tail;
      }
      if (reply->exiting) {
        // The worker said it exits after this reply: the next request must not be written to
        // the dying process (it would fail as "exited before replying" and be charged to the
        // next case). Reap it now; the next call starts a fresh one.
        worker_->Kill();
        worker_.reset();
        message += " (the worker exits after this error; a fresh one serves the next call)";
      }
      return Fail(op, message);
    }
    if (!reply->route.empty())
      route_ = route_.empty() ? reply->route : route_ + "; " + reply->route;
    // The outputs: a regular file exactly where attest said (no FIFO, device or symlink), no
    // larger than the outputs can be, read before the call's deadline.
    ReadLimits limits;
    limits.max_bytes = max_output_bytes;
    limits.follow_symlinks = false;
    limits.deadline = deadline;
    limits.what = "outputs file";
    auto out = ReadSafetensors(out_path, limits);
    if (!out) return Fail(op, "reply \"ok\" but the outputs file is unusable: " + out.error().message);
    return std::move(out).value();
  }

  std::string label_;
  bool name_from_worker_ = false;
  Launch launch_;
  ExecOptions options_;
  std::shared_ptr<TempDir> dir_;
  std::mutex mu_;
  std::optional<WorkerProcess> worker_;
  Capabilities caps_;
  nlohmann::json caps_json_;
  std::string worker_name_;
  std::string route_;
  std::string last_start_error_;
  int starts_ = 0;
  int start_failures_ = 0;
  int consecutive_timeouts_ = 0;
  bool hung_ = false;
  uint64_t calls_ = 0;
};

Expected<std::unique_ptr<Kernel>> Build(std::string label, bool name_from_worker,
                                        ProtocolKernel::Launch launch, ExecOptions options) {
  if (!(options.timeout_s > 0) || !(options.timeout_s <= kMaxTimeoutSeconds)) {
    return Error{fmt::format("{}: timeout {} s must be in (0, {}]", label, options.timeout_s,
                             kMaxTimeoutSeconds)};
  }
  auto dir = TempDir::Make(options.tmp_root);
  if (!dir) return Error{label + ": " + dir.error().message};
  auto kernel = std::make_unique<ProtocolKernel>(label, name_from_worker, std::move(launch),
                                                 std::move(options),
                                                 std::move(dir).value());
  if (Status s = kernel->Start(); !s) return Error{label + ": " + s.error().message};
  return std::unique_ptr<Kernel>(std::move(kernel));
}

}  // namespace

Expected<std::unique_ptr<Kernel>> MakeExecKernel(std::string command_line, ExecOptions options) {
  const std::string label = "exec:" + command_line;
  auto command = SplitCommandLine(command_line);
  if (!command) return Error{label + ": " + command.error().message};
  const int tail = options.stderr_tail_lines;
  return Build(
      label, false, [command = *command, tail] { return WorkerProcess::Spawn(command, tail); },
      std::move(options));
}

Expected<std::unique_ptr<Kernel>> MakeForkedKernel(KernelFactory factory, ExecOptions options) {
  const int tail = options.stderr_tail_lines;
  auto serve = [factory = std::move(factory)](int in_fd, int out_fd) -> int {
    auto kernel = factory();
    if (!kernel) {
      // Say why on stderr (the parent quotes it) and leave: describe then fails with it.
      const std::string msg = "kernel factory failed: " + kernel.error().message + "\n";
      [[maybe_unused]] ssize_t n = write(2, msg.data(), msg.size());
      return 3;
    }
    return ServeProtocol(**kernel, in_fd, out_fd);
  };
  // The kernel keeps its own name (the describe reply's), as if it ran in process.
  return Build(
      "forked kernel", true, [serve, tail] { return WorkerProcess::Fork(serve, tail); },
      std::move(options));
}

void RegisterExecKernels(KernelRegistry& registry) {
  registry.RegisterPrefix("exec:", [](std::string_view arg) -> Expected<std::unique_ptr<Kernel>> {
    ExecOptions options;
    // ATTEST_EXEC_TIMEOUT_S overrides the per-call limit (e.g. for a first torch.compile).
    if (const char* t = std::getenv("ATTEST_EXEC_TIMEOUT_S"); t != nullptr && *t != '\0') {
      char* end = nullptr;
      const double v = std::strtod(t, &end);
      // At most a week: a larger (or infinite) limit would overflow the deadline's clock.
      if (end == t || *end != '\0' || !(v > 0) || !(v <= kMaxTimeoutSeconds)) {
        return Error{fmt::format("ATTEST_EXEC_TIMEOUT_S: '{}' is not a number of seconds in "
                                 "(0, {}]",
                                 t, kMaxTimeoutSeconds)};
      }
      options.timeout_s = v;
    }
    return MakeExecKernel(std::string(arg), std::move(options));
  });
}

}  // namespace attest
