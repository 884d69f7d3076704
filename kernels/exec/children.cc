// Child registry, process-tree kills, stray reaping and the signal cleanup (see children.h).
#include "kernels/exec/children.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "reference/io/files.h"

namespace attest {
namespace {

using Clock = std::chrono::steady_clock;

struct ProcEntry {
  pid_t pid = 0;
  pid_t ppid = 0;
  pid_t pgrp = 0;
  char state = '?';
};

// One process's line of /proc/<pid>/stat (proc(5)): "pid (comm) state ppid pgrp ...";
// comm may hold spaces and parentheses, so the fields are read after the last ')'.
bool ReadStat(pid_t pid, ProcEntry* out) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* close = std::strrchr(buf, ')');
  if (close == nullptr) return false;
  int ppid = 0, pgrp = 0;
  char state = '?';
  if (std::sscanf(close + 1, " %c %d %d", &state, &ppid, &pgrp) != 3) return false;
  *out = {pid, static_cast<pid_t>(ppid), static_cast<pid_t>(pgrp), state};
  return true;
}

std::vector<ProcEntry> ScanProcesses() {
  std::vector<ProcEntry> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid <= 0) continue;
    ProcEntry p;
    if (ReadStat(static_cast<pid_t>(pid), &p)) out.push_back(p);
  }
  ::closedir(d);
  return out;
}

// The value of kChildTokenVariable in a process's initial environment ("" if none).
std::string ReadToken(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/environ", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string env;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0 && env.size() < (1u << 20);) {
    env.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const std::string key = std::string(kChildTokenVariable) + "=";
  for (size_t at = 0; at < env.size();) {
    const size_t end = env.find('\0', at);
    const std::string_view entry(env.data() + at,
                                 (end == std::string::npos ? env.size() : end) - at);
    if (entry.starts_with(key)) return std::string(entry.substr(key.size()));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return {};
}

struct Registry {
  std::mutex mu;
  std::map<pid_t, std::string> children;  // pid -> token
  uint64_t next_token = 0;
};

Registry*& RegistryPointer() {
  // Never destroyed: the signal watcher may use it while static destructors run.
  static Registry* registry = new Registry();
  return registry;
}

Registry& Children() { return *RegistryPointer(); }

bool Killable(pid_t pid) { return pid > 1 && pid != ::getpid(); }

// Waits (briefly, without blocking on a process stuck in the kernel) for a killed child of
// this process to end, and reaps it.
void ReapKilled(pid_t pid) {
  const auto until = Clock::now() + std::chrono::seconds(2);
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return;
    if (Clock::now() >= until) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// KillProcessTree without the registry lock; `me` is getpid().
void KillTreeLocked(pid_t root, pid_t me) {
  if (!Killable(root)) return;
  std::set<pid_t> stopped;
  auto stop = [&](pid_t p) {
    if (Killable(p) && stopped.insert(p).second) ::kill(p, SIGSTOP);
  };
  stop(root);
  // Stopped processes cannot fork, so each round finds only what started before it.
  for (int round = 0; round < 64; ++round) {
    const std::vector<ProcEntry> procs = ScanProcesses();
    const size_t before = stopped.size();
    bool grew = true;
    while (grew) {
      grew = false;
      for (const ProcEntry& p : procs) {
        if (stopped.count(p.pid) != 0) continue;
        if (stopped.count(p.ppid) != 0 || p.pgrp == root) {
          stop(p.pid);
          grew = true;
        }
      }
    }
    if (stopped.size() == before) break;
  }
  ::kill(-root, SIGKILL);
  for (pid_t p : stopped) ::kill(p, SIGKILL);
  // Descendants that are (or, once their parent dies, become) our children through the
  // subreaper are reaped here; the root is its owner's to reap.
  const std::vector<ProcEntry> after = ScanProcesses();
  for (const ProcEntry& p : after) {
    if (p.ppid == me && p.pid != root && stopped.count(p.pid) != 0) ReapKilled(p.pid);
  }
}

// `spare_live`: leave alone the orphans whose token names a registered child (false when
// attest stops and every child goes).
void ReapStraysLocked(Registry& r, bool spare_live) {
  const pid_t me = ::getpid();
  std::set<std::string> live;
  if (spare_live) {
    for (const auto& [pid, token] : r.children) live.insert(token);
  }
  // A few rounds: killing a stray reparents its own children to us.
  for (int round = 0; round < 16; ++round) {
    bool any = false;
    for (const ProcEntry& p : ScanProcesses()) {
      if (p.ppid != me || r.children.count(p.pid) != 0) continue;
      if (p.state != 'Z') {
        const std::string token = ReadToken(p.pid);
        if (!token.empty() && live.count(token) != 0) continue;  // a live child's helper
        KillTreeLocked(p.pid, me);
      }
      ReapKilled(p.pid);
      any = true;
    }
    if (!any) return;
  }
}

// ---- Signal cleanup ----

std::atomic<int> g_stop_signal{0};
int g_wake_pipe[2] = {-1, -1};
std::once_flag g_install_once;
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};

void OnStopSignal(int sig) {
  const int saved = errno;
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, sig);
  const char byte = static_cast<char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_wake_pipe[1], &byte, 1);
  errno = saved;
}

[[noreturn]] void EndBySignal(int sig) {
  RemoveRegisteredTempPaths();
  ::signal(sig, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(sig);
  ::_exit(128 + sig);
}

void Watch(std::chrono::milliseconds grace) {
  char byte = 0;
  while (::read(g_wake_pipe[0], &byte, 1) != 1) {
    if (errno != EINTR) return;
  }
  // 1. Children first: a call blocked on a hung child returns now.
  KillAllChildren();
  // 2. The run gets `grace` to notice StopSignal() and write its reports; a second signal
  //    cuts it short.
  pollfd pfd{g_wake_pipe[0], POLLIN, 0};
  ::poll(&pfd, 1, static_cast<int>(grace.count()));
  // 3. Still here: main did not reach FinishIfStopped in time.
  KillAllChildren();
  EndBySignal(g_stop_signal.load());
}

}  // namespace

void ForgetChildrenAfterFork() {
  // This copy of the parent's registry is locked (by the parent's StartRegisteredChild) and
  // lists the parent's children: replace it, leaking the copy (a fork child's memory).
  RegistryPointer() = new Registry();
}

bool BecomeSubreaper() { return ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0; }

Expected<pid_t> StartRegisteredChild(
    const std::function<Expected<pid_t>(const std::string&)>& start) {
  Registry& r = Children();
  std::lock_guard<std::mutex> lock(r.mu);
  if (const int sig = g_stop_signal.load(); sig != 0) {
    return Error{fmt::format(
        "attest is stopping ({}): no new process is started",
        sigabbrev_np(sig) ? std::string("SIG") + sigabbrev_np(sig) : std::to_string(sig))};
  }
  const std::string token = fmt::format("{}-{}", ::getpid(), r.next_token++);
  auto pid = start(token);
  if (pid.ok()) r.children[*pid] = token;
  return pid;
}

void UnregisterChild(pid_t pid) {
  Registry& r = Children();
  std::lock_guard<std::mutex> lock(r.mu);
  r.children.erase(pid);
}

void KillProcessTree(pid_t pid) {
  Registry& r = Children();
  std::lock_guard<std::mutex> lock(r.mu);
  KillTreeLocked(pid, ::getpid());
}

void ReapStrays() {
  Registry& r = Children();
  std::lock_guard<std::mutex> lock(r.mu);
  ReapStraysLocked(r, /*spare_live=*/true);
}

void KillAllChildren() {
  Registry& r = Children();
  std::lock_guard<std::mutex> lock(r.mu);
  const pid_t me = ::getpid();
  for (const auto& [pid, token] : r.children) KillTreeLocked(pid, me);
  ReapStraysLocked(r, /*spare_live=*/false);
}

std::vector<pid_t> Descendants(pid_t pid) {
  const std::vector<ProcEntry> procs = ScanProcesses();
  std::set<pid_t> found = {pid};
  bool grew = true;
  while (grew) {
    grew = false;
    for (const ProcEntry& p : procs) {
      if (found.count(p.pid) == 0 && found.count(p.ppid) != 0) {
        found.insert(p.pid);
        grew = true;
      }
    }
  }
  found.erase(pid);
  return {found.begin(), found.end()};
}

void InstallSignalCleanup(std::chrono::milliseconds grace) {
  std::call_once(g_install_once, [grace] {
    if (::pipe2(g_wake_pipe, O_CLOEXEC) != 0) return;
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : kStopSignals) {
      // A signal ignored at start-up (nohup's SIGHUP) stays ignored.
      struct sigaction old {};
      ::sigaction(sig, nullptr, &old);
      if (old.sa_handler == SIG_IGN) continue;
      ::sigaction(sig, &sa, nullptr);
    }
    std::thread(Watch, grace).detach();
  });
}

int StopSignal() { return g_stop_signal.load(); }

std::string StopSignalName() {
  const int sig = StopSignal();
  if (sig == 0) return {};
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : fmt::format("signal {}", sig);
}

void FinishIfStopped() {
  const int sig = StopSignal();
  if (sig == 0) return;
  KillAllChildren();
  EndBySignal(sig);
}

}  // namespace attest
