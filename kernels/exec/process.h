// A worker process for the exec protocol (docs/protocol.md): started by posix_spawn (a
// command) or fork (a function), registered (children.h), in its own process group, with
// the protocol on two pipes and stderr captured; requests are exchanged one line at a time under a
// deadline, and a dead, hung or babbling worker is described in words (exit code, signal
// name, the last lines of its stderr) so that the caller can report it as a finding.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "reference/status.h"

namespace attest {

// Splits a command line into words the way a POSIX shell would for a simple command, without
// expansions: blanks separate words; '...' quotes literally; "..." quotes with \" \\ \$ \`
// escapes; a backslash outside quotes escapes the next character. Fails on an unterminated
// quote. Leading NAME=VALUE words are returned separately as environment assignments.
struct CommandLine {
  std::vector<std::string> env;   // "NAME=VALUE"
  std::vector<std::string> argv;  // argv[0] is looked up in PATH when it has no '/'
};
Expected<CommandLine> SplitCommandLine(const std::string& text);

// The last lines a worker wrote to stderr (each cut to a few hundred bytes).
class StderrTail {
 public:
  explicit StderrTail(int max_lines) : max_lines_(max_lines) {}
  void Append(const char* data, size_t n);
  // " | "-joined lines (the partial last line included), or "" when nothing was written.
  std::string Joined() const;
  void Clear();

 private:
  void PushLine(std::string line);
  int max_lines_;
  std::deque<std::string> lines_;
  std::string partial_;
};

// Runs `argv` (argv[0] looked up in PATH; no shell, so no word of it is ever interpreted)
// with stdin closed and returns its stdout, or an Error (cannot start, non-zero exit, not
// done within `timeout_s`, then killed with its descendants).
Expected<std::string> CaptureOutput(const std::vector<std::string>& argv, double timeout_s);

// "SIGSEGV (11)", "signal 77" for unnamed numbers.
std::string SignalName(int sig);

class WorkerProcess {
 public:
  using Clock = std::chrono::steady_clock;

  // Spawns the command with stdin/stdout as the protocol pipes and stderr captured.
  static Expected<WorkerProcess> Spawn(const CommandLine& command, int stderr_tail_lines);
  // Forks a child that runs `serve(in_fd, out_fd)` (its stdout and stderr both go to the
  // captured stderr pipe, stdin is /dev/null, every other descriptor is closed) and ends
  // with _exit(serve's return value).
  static Expected<WorkerProcess> Fork(const std::function<int(int, int)>& serve,
                                      int stderr_tail_lines);

  WorkerProcess(WorkerProcess&& other) noexcept;
  WorkerProcess& operator=(WorkerProcess&& other) noexcept;
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;
  // Closes stdin, gives the worker a moment to exit on EOF, then kills its process group.
  ~WorkerProcess();

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  // Sends `request` (one line, the '\n' is appended) and returns the next non-empty reply
  // line. On a timeout, EOF, a reply line over `max_reply_bytes` or a write failure the
  // worker is killed (whole process group) and reaped, and the Error says what happened:
  // "timed out after 2.0 s", "exited with code 3", "killed by signal SIGSEGV (11)", with
  // its last stderr lines.
  Expected<std::string> Exchange(const std::string& request, Clock::time_point deadline,
                                 size_t max_reply_bytes = size_t{64} << 20);

  // Closes the worker's stdin, reads its stdout until EOF and waits for it to exit, all
  // before `deadline`; the output, or an Error saying how it failed (non-zero exit, signal,
  // timeout: then it is killed). For helper commands run without a shell (CaptureOutput).
  Expected<std::string> ReadToEnd(Clock::time_point deadline, size_t max_bytes = size_t{1} << 20);

  // Kills the worker with its process group and every descendant (children.h
  // KillProcessTree), reaps it and returns how it ended.
  std::string Kill();
  // Whether the last Exchange failed because its deadline passed (a hang, as opposed to a
  // crash or a protocol violation).
  bool timed_out() const { return timed_out_; }
  // The worker's last stderr lines, " | "-joined ("" if none).
  std::string StderrText() const { return tail_.Joined(); }

 private:
  WorkerProcess(int stderr_tail_lines) : tail_(stderr_tail_lines) {}
  void CloseFds();
  // Waits until `deadline` for the worker to exit (draining stderr meanwhile); returns its
  // wait status description, or "" if it is still running.
  std::string WaitUntil(Clock::time_point deadline);
  std::string Describe(int wait_status) const;
  void DrainStderr();
  // Formats "<what>; stderr: <tail>" after the worker has been reaped.
  Error Failure(const std::string& what) const;

  pid_t pid_ = -1;
  int to_child_ = -1;    // the worker's stdin
  int from_child_ = -1;  // the worker's stdout (protocol replies)
  int err_ = -1;         // the worker's stderr
  std::string buffer_;   // reply bytes read but not yet returned
  bool timed_out_ = false;
  StderrTail tail_;
};

}  // namespace attest
