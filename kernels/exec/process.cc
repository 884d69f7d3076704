// Worker processes for the exec protocol (see process.h): spawning, forking, line exchange
// under a deadline, and descriptions of how a worker ended.
#include "kernels/exec/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <optional>

#include <fmt/format.h>

#include "kernels/exec/children.h"

extern char** environ;

namespace attest {
namespace {

constexpr size_t kMaxStderrLineBytes = 300;
constexpr size_t kReadChunk = 1 << 16;

std::string Errno(int err) { return std::string(strerrordesc_np(err) ? strerrordesc_np(err) : "?"); }

// A pipe whose ends are close-on-exec (so that no other child inherits them) and not among
// fds 0-2 (so that dup2 onto 0-2 in the child never hits an end it still needs).
struct Pipe {
  int read = -1;
  int write = -1;
};

int AboveStdio(int fd) {
  if (fd > 2) return fd;
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  close(fd);
  return moved;
}

Expected<Pipe> MakePipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Error{"pipe: " + Errno(errno)};
  Pipe p{AboveStdio(fds[0]), AboveStdio(fds[1])};
  if (p.read < 0 || p.write < 0) return Error{"pipe: " + Errno(errno)};
  return p;
}

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Blocks SIGPIPE in this thread while writing to a worker's stdin, and consumes a SIGPIPE the
// write raised before unblocking, so that a worker that went away gives EPIPE instead of
// killing the harness, without touching the process-wide disposition that other code owns.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  ~ScopedSigpipeBlock() {
    if (!was_pending_) {
      const timespec zero{0, 0};
      while (sigtimedwait(&set_, nullptr, &zero) > 0) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t set_, old_;
  bool was_pending_ = false;
};

int MillisUntil(WorkerProcess::Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - WorkerProcess::Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT_MAX));
}

}  // namespace

Expected<CommandLine> SplitCommandLine(const std::string& text) {
  CommandLine out;
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word)), word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\\') {
      if (i + 1 < text.size()) word += text[++i];
    } else if (c == '\'') {
      const size_t end = text.find('\'', i + 1);
      if (end == std::string::npos) {
        return Error{fmt::format("command line: unterminated ' starting at offset {}", i)};
      }
      word += text.substr(i + 1, end - i - 1);
      i = end;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < text.size() && text[j] != '"'; ++j) {
        if (text[j] == '\\' && j + 1 < text.size() &&
            std::string_view("\"\\$`").find(text[j + 1]) != std::string_view::npos) {
          ++j;
        }
        word += text[j];
      }
      if (j >= text.size()) {
        return Error{fmt::format("command line: unterminated \" starting at offset {}", i)};
      }
      i = j;
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(std::move(word));
  // Leading NAME=VALUE words are environment assignments, as in a shell.
  size_t first = 0;
  for (; first < words.size(); ++first) {
    const std::string& w = words[first];
    const size_t eq = w.find('=');
    if (eq == std::string::npos || eq == 0) break;
    const bool name_ok = std::all_of(w.begin(), w.begin() + static_cast<ptrdiff_t>(eq), [](char ch) {
      return ch == '_' || (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
             (ch >= '0' && ch <= '9');
    });
    if (!name_ok || (w[0] >= '0' && w[0] <= '9')) break;
    out.env.push_back(w);
  }
  out.argv.assign(words.begin() + static_cast<ptrdiff_t>(first), words.end());
  if (out.argv.empty()) return Error{"command line: no command to run"};
  return out;
}

void StderrTail::Append(const char* data, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (data[i] == '\n') {
      PushLine(std::move(partial_));
      partial_.clear();
    } else if (data[i] != '\r' && partial_.size() < kMaxStderrLineBytes) {
      partial_ += data[i];
    }
  }
}

void StderrTail::PushLine(std::string line) {
  if (line.find_first_not_of(" \t") == std::string::npos) return;
  lines_.push_back(std::move(line));
  while (static_cast<int>(lines_.size()) > max_lines_) lines_.pop_front();
}

std::string StderrTail::Joined() const {
  std::string out;
  for (const auto& l : lines_) out += (out.empty() ? "" : " | ") + l;
  if (partial_.find_first_not_of(" \t") != std::string::npos) {
    out += (out.empty() ? "" : " | ") + partial_;
  }
  return out;
}

void StderrTail::Clear() {
  lines_.clear();
  partial_.clear();
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  if (abbrev == nullptr) return fmt::format("signal {}", sig);
  return fmt::format("SIG{} ({})", abbrev, sig);
}

Expected<WorkerProcess> WorkerProcess::Spawn(const CommandLine& command, int stderr_tail_lines) {
  auto in = MakePipe();
  if (!in) return in.error();
  auto out = MakePipe();
  if (!out) return out.error();
  auto err = MakePipe();
  if (!err) return err.error();

  // The environment: ours, with the command line's assignments replacing same-named entries.
  std::vector<std::string> env_strings;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const auto name = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(command.env.begin(), command.env.end(), [&](const auto& a) {
      return std::string_view(a).substr(0, a.find('=')) == name;
    });
    if (!replaced) env_strings.emplace_back(entry);
  }
  env_strings.insert(env_strings.end(), command.env.begin(), command.env.end());
  // The token (children.h) is added per spawn, below, so that orphans stay attributable.
  std::vector<char*> argv;
  std::vector<std::string> args = command.argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in->read, 0);
  posix_spawn_file_actions_adddup2(&actions, out->write, 1);
  posix_spawn_file_actions_adddup2(&actions, err->write, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Own process group (so a hang is killed with everything it started), an empty signal
  // mask, and default dispositions for signals the harness may ignore (SIGPIPE above all).
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none, defaults;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR1, SIGUSR2, SIGALRM,
                  SIGTTIN, SIGTTOU, SIGXFSZ}) {
    sigaddset(&defaults, sig);
  }
  posix_spawnattr_setsigdefault(&attr, &defaults);

  WorkerProcess w(stderr_tail_lines);
  int spawn_error = 0;
  auto started = StartRegisteredChild([&](const std::string& token) -> Expected<pid_t> {
    std::vector<std::string> env_with_token = env_strings;
    env_with_token.push_back(std::string(kChildTokenVariable) + "=" + token);
    std::vector<char*> envp;
    for (auto& s : env_with_token) envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_t pid = -1;
    spawn_error = posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
    if (spawn_error != 0) return Error{Errno(spawn_error)};
    return pid;
  });
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(in->read);
  close(out->write);
  close(err->write);
  if (!started) {
    close(in->write);
    close(out->read);
    close(err->read);
    return Error{fmt::format("cannot start '{}': {}", command.argv[0], started.error().message)};
  }
  const pid_t pid = *started;
  w.pid_ = pid;
  w.to_child_ = in->write;
  w.from_child_ = out->read;
  w.err_ = err->read;
  SetNonBlocking(w.to_child_);
  SetNonBlocking(w.from_child_);
  SetNonBlocking(w.err_);
  return w;
}

Expected<WorkerProcess> WorkerProcess::Fork(const std::function<int(int, int)>& serve,
                                            int stderr_tail_lines) {
  auto req = MakePipe();
  if (!req) return req.error();
  auto rep = MakePipe();
  if (!rep) return rep.error();
  auto err = MakePipe();
  if (!err) return err.error();
  const pid_t parent = getpid();
  auto forked = StartRegisteredChild([&](const std::string&) -> Expected<pid_t> {
    const pid_t pid = fork();
    if (pid != 0) {
      if (pid < 0) return Error{"fork: " + Errno(errno)};
      return pid;
    }
    // The child: only the forking thread exists here. 1. Own process group, and die with
    // the parent. 2. Descriptors: stdin /dev/null, stdout and stderr to the captured pipe
    // (a plugin that prints must not corrupt the protocol or the harness's output), the
    // protocol on 3 and 4, nothing else (other workers' pipe ends must not stay open here,
    // or those workers never see EOF). 3. Default signal state. 4. Serve, then _exit (no
    // atexit handlers or stdio flushes of the parent's state).
    ForgetChildrenAfterFork();
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    const int a = fcntl(req->read, F_DUPFD, 5);
    const int b = fcntl(rep->write, F_DUPFD, 5);
    const int e = fcntl(err->write, F_DUPFD, 5);
    const int n = null_fd >= 0 ? fcntl(null_fd, F_DUPFD, 5) : -1;
    if (a < 0 || b < 0 || e < 0) _exit(1);
    if (n >= 0) dup2(n, 0);
    dup2(e, 1);
    dup2(e, 2);
    dup2(a, 3);
    dup2(b, 4);
    if (close_range(5, ~0U, 0) != 0) {
      for (int fd = 5; fd < 1024; ++fd) close(fd);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_DFL);
    int rc = 3;
    try {
      rc = serve(3, 4);
    } catch (...) {
      rc = 3;
    }
    _exit(rc);
  });
  if (!forked) {
    for (int fd : {req->read, req->write, rep->read, rep->write, err->read, err->write}) close(fd);
    return forked.error();
  }
  const pid_t pid = *forked;
  // Also set the group from the parent so that a kill right after fork cannot miss it.
  setpgid(pid, pid);
  close(req->read);
  close(rep->write);
  close(err->write);
  WorkerProcess w(stderr_tail_lines);
  w.pid_ = pid;
  w.to_child_ = req->write;
  w.from_child_ = rep->read;
  w.err_ = err->read;
  SetNonBlocking(w.to_child_);
  SetNonBlocking(w.from_child_);
  SetNonBlocking(w.err_);
  return w;
}

WorkerProcess::WorkerProcess(WorkerProcess&& other) noexcept
    : pid_(other.pid_),
      to_child_(other.to_child_),
      from_child_(other.from_child_),
      err_(other.err_),
      buffer_(std::move(other.buffer_)),
      timed_out_(other.timed_out_),
      tail_(std::move(other.tail_)) {
  other.pid_ = -1;
  other.to_child_ = other.from_child_ = other.err_ = -1;
}

WorkerProcess& WorkerProcess::operator=(WorkerProcess&& other) noexcept {
  if (this != &other) {
    if (running()) Kill();
    CloseFds();
    pid_ = other.pid_;
    to_child_ = other.to_child_;
    from_child_ = other.from_child_;
    err_ = other.err_;
    buffer_ = std::move(other.buffer_);
    timed_out_ = other.timed_out_;
    tail_ = std::move(other.tail_);
    other.pid_ = -1;
    other.to_child_ = other.from_child_ = other.err_ = -1;
  }
  return *this;
}

WorkerProcess::~WorkerProcess() {
  if (running()) {
    // EOF on stdin is the protocol's "exit now"; a well-behaved worker is gone at once.
    CloseFd(to_child_);
    if (WaitUntil(Clock::now() + std::chrono::seconds(2)).empty()) Kill();
  }
  CloseFds();
}

void WorkerProcess::CloseFds() {
  CloseFd(to_child_);
  CloseFd(from_child_);
  CloseFd(err_);
}

void WorkerProcess::DrainStderr() {
  if (err_ < 0) return;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(err_, buf, sizeof buf);
    if (n > 0) {
      tail_.Append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) CloseFd(err_);
    return;  // EOF, EAGAIN or an error: nothing more to read now
  }
}

std::string WorkerProcess::Describe(int status) const {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("killed by signal {}{}", SignalName(WTERMSIG(status)),
                       WCOREDUMP(status) ? ", core dumped" : "");
  }
  return fmt::format("ended with wait status {}", status);
}

std::string WorkerProcess::WaitUntil(Clock::time_point deadline) {
  if (pid_ <= 0) return "not running";
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      const pid_t group = pid_;
      pid_ = -1;
      UnregisterChild(group);
      // Helpers the worker left behind: in its group, or orphans that reached attest.
      kill(-group, SIGKILL);
      ReapStrays();
      DrainStderr();
      return r > 0 ? Describe(status) : std::string("ended (exit status unavailable)");
    }
    const int ms = std::min(MillisUntil(deadline), 20);
    if (ms <= 0) return "";
    // Sleep on the worker's pipes: its exit closes them, which wakes us at once.
    pollfd fds[2];
    nfds_t nfds = 0;
    if (err_ >= 0) fds[nfds++] = {err_, POLLIN, 0};
    if (from_child_ >= 0) fds[nfds++] = {from_child_, POLLIN, 0};
    if (nfds == 0) {
      usleep(static_cast<useconds_t>(std::min(ms, 2)) * 1000);
      continue;
    }
    if (poll(fds, nfds, ms) > 0) {
      for (nfds_t k = 0; k < nfds; ++k) {
        if (fds[k].revents == 0) continue;
        if (fds[k].fd == err_) {
          DrainStderr();
        } else {
          char buf[4096];
          const ssize_t n = read(from_child_, buf, sizeof buf);
          if (n > 0) buffer_.append(buf, static_cast<size_t>(n));
          if (n == 0) CloseFd(from_child_);
        }
      }
    }
  }
}

std::string WorkerProcess::Kill() {
  if (pid_ <= 0) return "not running";
  // The worker, its group and every descendant (children.h), then the worker is reaped.
  KillProcessTree(pid_);
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  UnregisterChild(pid_);
  pid_ = -1;
  ReapStrays();
  DrainStderr();
  CloseFds();
  return r < 0 ? "killed" : Describe(status);
}

Expected<std::string> WorkerProcess::ReadToEnd(Clock::time_point deadline, size_t max_bytes) {
  CloseFd(to_child_);
  while (from_child_ >= 0) {
    const int ms = MillisUntil(deadline);
    if (ms <= 0) return Failure("timed out (killed: " + Kill() + ")");
    pollfd fds[2];
    nfds_t nfds = 0;
    fds[nfds++] = {from_child_, POLLIN, 0};
    if (err_ >= 0) fds[nfds++] = {err_, POLLIN, 0};
    if (poll(fds, nfds, ms) <= 0) continue;
    if (err_ >= 0) DrainStderr();
    char buf[4096];
    const ssize_t n = read(from_child_, buf, sizeof buf);
    if (n > 0) {
      buffer_.append(buf, static_cast<size_t>(n));
      if (buffer_.size() > max_bytes) {
        return Failure(fmt::format("wrote more than {} bytes (killed: {})", max_bytes, Kill()));
      }
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      CloseFd(from_child_);
    }
  }
  std::string how = WaitUntil(deadline);
  if (how.empty()) return Failure("timed out after closing its output (killed: " + Kill() + ")");
  if (how != "exited with code 0") return Failure(how);
  return std::move(buffer_);
}

Expected<std::string> CaptureOutput(const std::vector<std::string>& argv, double timeout_s) {
  if (argv.empty()) return Error{"no command to run"};
  const auto deadline = WorkerProcess::Clock::now() +
                        std::chrono::duration_cast<WorkerProcess::Clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  auto w = WorkerProcess::Spawn(CommandLine{{}, argv}, 4);
  if (!w) return w.error();
  auto out = w->ReadToEnd(deadline);
  if (!out) return Error{argv[0] + ": " + out.error().message};
  return out;
}

Error WorkerProcess::Failure(const std::string& what) const {
  const std::string tail = tail_.Joined();
  if (tail.empty()) return Error{what + " (no stderr output)"};
  return Error{what + "; stderr: " + tail};
}

Expected<std::string> WorkerProcess::Exchange(const std::string& request,
                                              Clock::time_point deadline, size_t max_reply_bytes) {
  timed_out_ = false;
  if (!running()) return Error{"worker is not running"};
  const auto start = Clock::now();
  const std::string line = request + "\n";
  size_t written = 0;
  for (;;) {
    // 1. A complete reply line already buffered?
    for (size_t nl; (nl = buffer_.find('\n')) != std::string::npos;) {
      std::string reply = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      if (reply.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
      DrainStderr();
      return reply;
    }
    if (buffer_.size() > max_reply_bytes) {
      const std::string how = Kill();
      return Failure(fmt::format("wrote more than {} bytes without a newline (worker killed: {})",
                                 max_reply_bytes, how));
    }
    // 2. Out of time?
    const int ms = MillisUntil(deadline);
    if (ms <= 0) {
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      timed_out_ = true;
      const std::string how = Kill();
      return Failure(fmt::format("timed out: no reply within {:.1f} s (process group killed; {})",
                                 waited, how));
    }
    // 3. Wait for the pipes.
    pollfd fds[3];
    nfds_t nfds = 0;
    const bool writing = written < line.size() && to_child_ >= 0;
    if (writing) fds[nfds++] = {to_child_, POLLOUT, 0};
    if (from_child_ >= 0) fds[nfds++] = {from_child_, POLLIN, 0};
    if (err_ >= 0) fds[nfds++] = {err_, POLLIN, 0};
    const int pr = poll(fds, nfds, ms);
    if (pr < 0 && errno != EINTR) {
      const std::string how = Kill();
      return Failure(fmt::format("poll failed: {} (worker killed: {})", Errno(errno), how));
    }
    for (nfds_t k = 0; pr > 0 && k < nfds; ++k) {
      if (fds[k].revents == 0) continue;
      const int fd = fds[k].fd;
      if (fd == err_) {
        DrainStderr();
      } else if (fd == to_child_) {
        ssize_t n;
        {
          ScopedSigpipeBlock block;
          n = write(to_child_, line.data() + written, line.size() - written);
        }
        if (n > 0) {
          written += static_cast<size_t>(n);
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          // EPIPE: it stopped reading (usually because it is dying); say how it ended.
          const int saved = errno;
          CloseFd(to_child_);
          std::string how = WaitUntil(std::min(deadline, Clock::now() + std::chrono::seconds(2)));
          if (how.empty()) how = "still running, killed: " + Kill();
          return Failure(fmt::format("stopped reading requests ({}; {})", Errno(saved), how));
        }
      } else if (fd == from_child_) {
        char buf[kReadChunk];
        const ssize_t n = read(from_child_, buf, sizeof buf);
        if (n > 0) {
          buffer_.append(buf, static_cast<size_t>(n));
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          // EOF on stdout: it died or closed the protocol; give it a moment to exit.
          CloseFd(from_child_);
          std::string how = WaitUntil(std::min(deadline, Clock::now() + std::chrono::seconds(2)));
          if (how.empty()) how = "closed its stdout but kept running, killed: " + Kill();
          CloseFds();
          const std::string partial =
              buffer_.empty() ? "" : fmt::format(" after a partial reply '{}'", buffer_.substr(0, 120));
          return Failure(fmt::format("{} before replying{}", how, partial));
        }
      }
    }
  }
}

}  // namespace attest
