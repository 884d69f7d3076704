// `plugin:` kernels: in-process and isolated (child process) adapters over library.h (see
// plugin.h). The isolated kernel keeps one child per kernel object: the child loads the
// library itself (so no GPU runtime is ever initialised in attest's own process, which
// would not survive fork), answers a describe frame, then serves forward/backward frames
// (wire.h) until its socket closes. A child that dies, hangs past the timeout or reports an
// error is reaped and the next call starts a fresh one.
#include "kernels/plugin/plugin.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/device/device.h"
#include "kernels/exec/children.h"
#include "kernels/plugin/library.h"
#include "kernels/plugin/wire.h"
#include "reference/formats/format.h"
#include "reference/io/json.h"

namespace attest {
namespace {

// As for exec workers (kernels/exec/exec_kernel.cc): a timeout restarts the child for the
// next call, this many consecutive timeouts mark the kernel hung for the rest of the run.
constexpr int kTimeoutsUntilHung = 2;

// A kernel on a device needs that device at load time: "no CUDA runtime" / "no CUDA
// device" is an infrastructure error (exit 2), not a finding on every case.
Status CheckDevice(const PluginEntry& entry) {
  if (entry.device_type == ATTEST_DEVICE_HOST) return Status::Ok();
  auto device = OpenDevice(entry.device_type);
  if (!device.ok()) {
    return Error{"plugin " + entry.library + ":" + entry.name + ": " + device.error().message};
  }
  return Status::Ok();
}

// ---- In process (for debugging: a crash takes attest down with it) ----

class InProcessPluginKernel final : public Kernel {
 public:
  InProcessPluginKernel(std::string spec, std::shared_ptr<PluginLibrary> lib, PluginEntry entry)
      : spec_(std::move(spec)), lib_(std::move(lib)), entry_(std::move(entry)) {}
  std::string name() const override { return spec_; }
  Capabilities capabilities() const override { return entry_.capabilities; }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    return CallPluginForward(entry_, p, q, k, v);
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    return CallPluginBackward(entry_, p, q, k, v, o, lse, dout);
  }

 private:
  std::string spec_;
  std::shared_ptr<PluginLibrary> lib_;  // keeps entry_.desc alive
  PluginEntry entry_;
};

// ---- The child process ----

nlohmann::json ErrorReply(const std::string& message) {
  return {{"status", "error"}, {"message", message}};
}

void CloseOtherDescriptors(int keep) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, 3u, static_cast<unsigned>(keep) - 1u, 0u) == 0 &&
      ::syscall(SYS_close_range, static_cast<unsigned>(keep) + 1u, ~0u, 0u) == 0) {
    return;
  }
#endif
  // Without close_range (older kernels, some sandboxes): the usual descriptor range.
  for (int fd = 3; fd < 4096; ++fd) {
    if (fd != keep) ::close(fd);
  }
}

// Serves one kernel of one library on `fd` until the parent closes it; never returns.
[[noreturn]] void ChildMain(int fd, const PluginSpec& spec, pid_t parent) {
  // Own process group (killed with everything it starts: kernels/exec/children.h), and
  // killed if attest dies without cleaning up.
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(0);
  // A crash must end the child with its signal (the parent reports it), whatever handlers
  // the parent installed; the kernel's own prints go to stderr, never into attest's stdout.
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTERM, SIGINT, SIGHUP, SIGPIPE}) {
    ::signal(sig, SIG_DFL);
  }
  ::dup2(STDERR_FILENO, STDOUT_FILENO);
  // Keep only stdio and this child's socket: a sibling kernel's socket inherited here would
  // keep that sibling's child from seeing its parent close it.
  CloseOtherDescriptors(fd);

  auto lib = PluginLibrary::Open(spec.path);
  Expected<PluginEntry> entry =
      lib.ok() ? (*lib)->Find(spec.name) : Expected<PluginEntry>(lib.error());
  if (entry.ok()) {
    if (Status s = CheckDevice(*entry); !s.ok()) entry = s.error();
  }
  if (!entry.ok()) {
    (void)SendWire(fd, ErrorReply(entry.error().message), {});
    ::_exit(0);
  }
  nlohmann::json describe = {{"status", "ok"},
                             {"name", entry->name},
                             {"capabilities", entry->capabilities_json},
                             {"device_type", entry->device_type}};
  if (!SendWire(fd, describe, {}).ok()) ::_exit(0);
  for (;;) {
    WireReceive in = ReceiveWire(fd, -1);
    if (in.failure != WireFailure::kNone) ::_exit(0);  // parent gone or closed: done
    const nlohmann::json& h = in.message.header;
    const std::vector<Tensor>& t = in.message.tensors;
    auto problem = h.contains("problem") ? ProblemFromJson(h["problem"])
                                         : Expected<Problem>(Error{"request without problem"});
    const std::string op = h.value("op", "");
    nlohmann::json reply;
    std::vector<Tensor> outputs;
    bool restart = false;
    auto take = [&](auto answer) {
      using T = std::decay_t<decltype(answer)>;
      if (auto* u = std::get_if<Unsupported>(&answer)) {
        reply = {{"status", "unsupported"}, {"reason", u->reason}};
      } else if (auto* e = std::get_if<Error>(&answer)) {
        // A device may be left unusable (a sticky CUDA error): start over in a new child.
        reply = ErrorReply(e->message);
        restart = true;
      } else {
        reply = {{"status", "ok"}};
        const auto& r = std::get<std::variant_alternative_t<0, T>>(answer);
        if constexpr (std::is_same_v<std::variant_alternative_t<0, T>, ForwardResult>) {
          outputs = {r.o, r.lse};
        } else {
          outputs = {r.dq, r.dk, r.dv};
        }
      }
    };
    if (!problem.ok()) {
      reply = ErrorReply("child: " + problem.error().message);
    } else if (op == "forward" && t.size() == 3) {
      take(CallPluginForward(*entry, *problem, t[0], t[1], t[2]));
    } else if (op == "backward" && t.size() == 6) {
      take(CallPluginBackward(*entry, *problem, t[0], t[1], t[2], t[3], t[4], t[5]));
    } else {
      reply = ErrorReply("child: malformed request '" + op + "' with " +
                         std::to_string(t.size()) + " tensors");
    }
    if (!SendWire(fd, reply, outputs).ok() || restart) ::_exit(0);
  }
}

// ---- The parent side ----

std::string DescribeWaitStatus(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* what = ::strsignal(sig);
    return fmt::format("the kernel process died of signal {} ({})", sig, what ? what : "?");
  }
  if (WIFEXITED(status)) {
    return fmt::format("the kernel process exited with status {}", WEXITSTATUS(status));
  }
  return "the kernel process ended";
}

class IsolatedPluginKernel final : public Kernel {
 public:
  IsolatedPluginKernel(std::string spec, PluginSpec parts, PluginOptions options)
      : spec_(std::move(spec)), parts_(std::move(parts)), options_(options) {}
  ~IsolatedPluginKernel() override { Stop(); }

  // Starts a child and reads its describe frame; errors are load errors. A child that
  // cannot be created once the run is under way (a restart) is an infrastructure fault.
  Status Start() {
    auto infrastructure = [&](std::string what) -> Status {
      const std::string message = "plugin " + parts_.path + ": " + what;
      if (described_) throw InfrastructureError(message);
      return Error{message};
    };
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      return infrastructure(std::string("socketpair: ") + std::strerror(errno));
    }
    // Output buffered in this process must not be written again by the child.
    std::fflush(nullptr);
    std::cout.flush();
    const pid_t parent = ::getpid();
    auto forked = StartRegisteredChild([&](const std::string&) -> Expected<pid_t> {
      const pid_t pid = ::fork();
      if (pid < 0) return Error{std::string("fork: ") + std::strerror(errno)};
      if (pid == 0) {
        ForgetChildrenAfterFork();
        ::close(fds[0]);
        ChildMain(fds[1], parts_, parent);
      }
      return pid;
    });
    ::close(fds[1]);
    if (!forked.ok()) {
      ::close(fds[0]);
      return infrastructure(forked.error().message);
    }
    pid_ = *forked;
    // Also from the parent, so that a kill right after fork reaches the group.
    ::setpgid(pid_, pid_);
    fd_ = fds[0];
    WireReceive in = ReceiveWire(fd_, options_.timeout_s);
    if (in.failure != WireFailure::kNone) {
      return Error{"plugin " + parts_.path + ": loading: " + Reap(in, "loading")};
    }
    const nlohmann::json& h = in.message.header;
    if (h.value("status", "") != "ok") {
      Stop();
      return Error{h.value("message", "plugin " + parts_.path + ": child failed to load")};
    }
    if (!described_) {
      const nlohmann::json& text =
          h.contains("capabilities") ? h["capabilities"] : nlohmann::json();
      auto parsed = ParseJson(text.is_string() ? text.get_ref<const std::string&>() : "{}",
                              "plugin " + parts_.path + ": capabilities");
      if (!parsed.ok()) return parsed.error();
      auto caps = CapabilitiesFromJson(*parsed);
      if (!caps.ok()) return caps.error();
      caps_ = *caps;
      described_ = true;
    }
    return Status::Ok();
  }

  std::string name() const override { return spec_; }
  Capabilities capabilities() const override { return caps_; }

  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    auto out = Call("forward", p, {q, k, v}, 2);
    if (auto* t = std::get_if<std::vector<Tensor>>(&out)) {
      return ForwardResult{(*t)[0], (*t)[1]};
    }
    return Forward_(out);
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    auto out = Call("backward", p, {q, k, v, o, lse, dout}, 3);
    if (auto* t = std::get_if<std::vector<Tensor>>(&out)) {
      return BackwardResult{(*t)[0], (*t)[1], (*t)[2]};
    }
    return Backward_(out);
  }

 private:
  using CallOut = std::variant<std::vector<Tensor>, Unsupported, Error>;
  static KernelAnswer<ForwardResult> Forward_(const CallOut& out) {
    if (auto* u = std::get_if<Unsupported>(&out)) return *u;
    return std::get<Error>(out);
  }
  static KernelAnswer<BackwardResult> Backward_(const CallOut& out) {
    if (auto* u = std::get_if<Unsupported>(&out)) return *u;
    return std::get<Error>(out);
  }

  CallOut Call(const char* op, const Problem& p, std::vector<Tensor> inputs, size_t n_out) {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::string who = "plugin " + parts_.path + (parts_.name.empty() ? "" : ":") +
                            parts_.name + " " + op;
    if (StopSignal() != 0)
      return Error{who + ": not run: attest is stopping (" + StopSignalName() + ")"};
    if (hung_) {
      return Error{fmt::format("{}: not run: the kernel hangs ({} consecutive calls timed out "
                               "after {} s each; no further call is made in this run)",
                               who, consecutive_timeouts_, options_.timeout_s)};
    }
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(options_.timeout_s));
    auto left = [&] {
      return std::max(0.0, std::chrono::duration<double>(deadline -
                                                         std::chrono::steady_clock::now())
                               .count());
    };
    if (pid_ < 0) {
      if (Status s = Start(); !s.ok()) return Error{who + ": restarting: " + s.error().message};
    }
    // Inputs travel as the problem's dtype (or f32 for lse): the exact values the kernel
    // sees, at a quarter of the f64 size.
    for (size_t i = 0; i < inputs.size(); ++i) {
      const DType to = (std::string_view(op) == "backward" && i == 4) ? DType::kF32 : p.dtype;
      if (inputs[i].dtype() != to && inputs[i].dtype() == DType::kF64 && FormatOf(to)) {
        auto coded = FromF64(inputs[i], to);
        if (coded.ok()) inputs[i] = *coded;
      }
    }
    nlohmann::json request = {{"op", op}, {"problem", ProblemToJson(p)}};
    // Send and receive share the call's deadline: a child that stops reading its socket is
    // a hang like one that stops answering.
    if (Status sent = SendWire(fd_, request, inputs, left()); !sent.ok()) {
      WireReceive failed;
      const bool timeout = sent.error().message.rfind("timed out", 0) == 0;
      failed.failure = timeout ? WireFailure::kTimeout : WireFailure::kEof;
      std::string message = who + ": " + Reap(failed, op);
      if (timeout) message += " (it stopped reading its socket)" + RecordTimeout();
      return Error{message};
    }
    WireReceive in = ReceiveWire(fd_, left());
    if (in.failure != WireFailure::kNone) {
      std::string message = who + ": " + Reap(in, op);
      if (in.failure == WireFailure::kTimeout) message += RecordTimeout();
      return Error{message};
    }
    consecutive_timeouts_ = 0;
    const nlohmann::json& h = in.message.header;
    const std::string status = h.value("status", "");
    if (status == "unsupported") return Unsupported{h.value("reason", "")};
    if (status == "error") {
      Reap(in, op);  // the child exits after an error; collect it
      return Error{h.value("message", who + ": error")};
    }
    if (status != "ok" || in.message.tensors.size() != n_out) {
      Stop();
      return Error{who + ": malformed reply from the kernel process: " + JsonExcerpt(h)};
    }
    return std::move(in.message.tensors);
  }

  // After a call timed out: what happens next, for its message.
  std::string RecordTimeout() {
    if (++consecutive_timeouts_ < kTimeoutsUntilHung) return "; restarted for the next call";
    hung_ = true;
    return fmt::format("; {} consecutive calls timed out: the kernel is marked hung and no "
                       "further call is made",
                       consecutive_timeouts_);
  }

  // Ends the child after a failed exchange and says why it failed.
  std::string Reap(const WireReceive& in, const char* op) {
    std::string why;
    if (in.failure == WireFailure::kTimeout) {
      KillProcessTree(pid_);
      why = fmt::format("no answer to {} within {} s; the kernel process was killed (a hang; "
                        "ATTEST_PLUGIN_TIMEOUT sets the limit)",
                        op, options_.timeout_s);
    } else if (in.failure == WireFailure::kMalformed || in.failure == WireFailure::kIo) {
      KillProcessTree(pid_);
      why = "broken exchange with the kernel process (" + in.detail + ")";
    }
    const int status = WaitChild(/*grace_s=*/5.0);
    if (why.empty()) why = fmt::format("{} during {}", DescribeWaitStatus(status), op);
    return why;
  }

  // Waits up to grace_s for the child to end, then kills it with its descendants; reaps it,
  // then whatever it left behind (its group, orphans that reached attest); returns its wait
  // status.
  int WaitChild(double grace_s) {
    int status = 0;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (pid_ < 0) return status;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    for (;;) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno != EINTR)) break;
      if (std::chrono::steady_clock::now() >= until) {
        KillProcessTree(pid_);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    UnregisterChild(pid_);
    ::kill(-pid_, SIGKILL);
    pid_ = -1;
    ReapStrays();
    return status;
  }

  void Stop() { (void)WaitChild(/*grace_s=*/2.0); }

  std::string spec_;
  PluginSpec parts_;
  PluginOptions options_;
  std::mutex mutex_;
  pid_t pid_ = -1;
  int fd_ = -1;
  bool described_ = false;
  Capabilities caps_;
  int consecutive_timeouts_ = 0;
  bool hung_ = false;
};

}  // namespace

Expected<PluginOptions> PluginOptionsFromEnv() {
  PluginOptions o;
  if (const char* v = std::getenv("ATTEST_PLUGIN_ISOLATE"); v != nullptr && *v != '\0') {
    const std::string s(v);
    if (s == "0" || s == "false" || s == "no") {
      o.isolate = false;
    } else if (s == "1" || s == "true" || s == "yes") {
      o.isolate = true;
    } else {
      return Error{"ATTEST_PLUGIN_ISOLATE='" + s + "': expected 0 or 1"};
    }
  }
  if (const char* v = std::getenv("ATTEST_PLUGIN_TIMEOUT"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const double t = std::strtod(v, &end);
    // At most a week: a larger (or infinite) limit would overflow the deadline's clock.
    if (end == v || *end != '\0' || !(t > 0) || !(t <= 7 * 24 * 3600)) {
      return Error{"ATTEST_PLUGIN_TIMEOUT='" + std::string(v) +
                   "': expected seconds in (0, 604800]"};
    }
    o.timeout_s = t;
  }
  return o;
}

Expected<std::unique_ptr<Kernel>> LoadPluginKernel(std::string_view spec,
                                                   const PluginOptions& options) {
  const PluginSpec parts = ParsePluginSpec(spec);
  const std::string full = "plugin:" + std::string(spec);
  if (!options.isolate) {
    auto lib = PluginLibrary::Open(parts.path);
    if (!lib.ok()) return lib.error();
    auto entry = (*lib)->Find(parts.name);
    if (!entry.ok()) return entry.error();
    if (Status s = CheckDevice(*entry); !s.ok()) return s.error();
    return std::unique_ptr<Kernel>(
        std::make_unique<InProcessPluginKernel>(full, *lib, std::move(*entry)));
  }
  auto kernel = std::make_unique<IsolatedPluginKernel>(full, parts, options);
  if (Status s = kernel->Start(); !s.ok()) return s.error();
  return std::unique_ptr<Kernel>(std::move(kernel));
}

void RegisterPluginPrefix(KernelRegistry& registry) {
  registry.RegisterPrefix("plugin:", [](std::string_view arg) -> Expected<std::unique_ptr<Kernel>> {
    auto options = PluginOptionsFromEnv();
    if (!options.ok()) return options.error();
    return LoadPluginKernel(arg, *options);
  });
}

}  // namespace attest
