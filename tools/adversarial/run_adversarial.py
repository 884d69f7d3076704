#!/usr/bin/env python3
"""attest's adversarial suite (docs/reliability.md): every input class that once crashed,
hung, orphaned a process, left a folder or a half-written file, reproduced from small files
generated here and tiny hostile workers and plugins (hostile_worker.py, hostile_plugin.c).

Each test runs attest with a fresh TMPDIR and working folder and a marker in its
environment, then asserts
  - the exit code (2: bad input or infrastructure; 1: a finding about the kernel; or death
    by the signal sent) within the test's deadline (a hang is a failure, never a wait),
  - a fragment of the message naming the defect,
  - no process left: none in the process table (/proc/*/environ) carries the marker, which
    every descendant inherits, setsid'd or not,
  - no temporary folder or file left in TMPDIR or beside the outputs,
  - outputs whole or absent: files that existed before are byte-for-byte unchanged when the
    run failed.

Usage: run_adversarial.py --attest PATH --plugin LIB.so [--python PY] [--only NAME] [--list]
                          [--time-scale F]
Standard library only; exit 0 when every test passes, 1 otherwise.
"""

import argparse
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MARKER = "ATTEST_ADVERSARIAL_RUN"

# ---- Small generated inputs ----

SMALL_PROBLEM = {"batch": 1, "heads_q": 1, "heads_kv": 1, "seqlen_q": 4, "seqlen_k": 4,
                 "head_dim": 8, "head_dim_v": 8, "dtype": "f32"}


def case_text(problem=None, generator=True, inputs=None):
    c = {"problem": dict(problem or SMALL_PROBLEM)}
    if inputs is not None:
        c["inputs"] = inputs
    elif generator:
        c["generator"] = {"name": "gaussian", "seed": 1}
    return json.dumps(c)


def safetensors_bytes(tensors):
    """{name: (dtype, shape, raw bytes)} as a safetensors file."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def f32(values):
    return struct.pack(f"<{len(values)}f", *values)


def write(path, data):
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return path


# ---- Running attest and checking what it left ----


class Run:
    def __init__(self, rc, out, err, seconds, timed_out):
        self.rc, self.out, self.err, self.seconds, self.timed_out = rc, out, err, seconds, timed_out

    @property
    def text(self):
        return self.out + self.err


class Context:
    """One test's folders, environment and process bookkeeping."""

    def __init__(self, opts, name):
        self.opts = opts
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"attest-adv-{name}-")
        self.work = os.path.join(self.dir, "work")
        self.tmp = os.path.join(self.dir, "tmp")
        os.makedirs(self.work)
        os.makedirs(self.tmp)
        self.token = uuid.uuid4().hex
        self.failures = []

    def path(self, name):
        return os.path.join(self.work, name)

    def env(self, extra=None):
        env = dict(os.environ)
        env.update({"TMPDIR": self.tmp, MARKER: self.token, "ATTEST_EXEC_TIMEOUT_S": "2",
                    "ATTEST_PLUGIN_TIMEOUT": "2"})
        env.update(extra or {})
        return env

    def start(self, args, extra_env=None, shell_prefix=None):
        cmd = [self.opts.attest] + args
        if shell_prefix:  # e.g. resource limits set by bash before exec
            cmd = ["bash", "-c", shell_prefix + ' exec "$@"', "bash"] + cmd
        return subprocess.Popen(cmd, cwd=self.work, env=self.env(extra_env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True)

    def kill_leftovers(self):
        for pid in self.leftover_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def finish(self, proc, timeout, t0):
        timeout *= self.opts.time_scale
        try:
            out, err = proc.communicate(timeout=max(0.1, timeout - (time.time() - t0)))
            return Run(proc.returncode, out, err, time.time() - t0, False)
        except subprocess.TimeoutExpired:
            pass
        ended = proc.poll() is not None
        if ended:
            # attest ended, but a process it left behind holds its output pipes open.
            self.failures.append("attest ended but a process it started kept its output open")
        else:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        self.kill_leftovers()  # whatever escaped the group (and may hold the pipes)
        out, err = proc.communicate()
        return Run(proc.returncode, out, err, time.time() - t0, not ended)

    def run(self, args, timeout=30, extra_env=None, shell_prefix=None):
        t0 = time.time()
        return self.finish(self.start(args, extra_env, shell_prefix), timeout, t0)

    def expect(self, run, rc=None, fragments=(), within=None, signal_death=None):
        if run.timed_out:
            self.failures.append(f"did not finish within its deadline ({run.seconds:.1f} s)")
            return
        if signal_death is not None:
            if run.rc != -signal_death:
                self.failures.append(f"expected death by signal {signal_death}, got rc {run.rc}")
        elif rc is not None and run.rc != rc:
            self.failures.append(f"exit code {run.rc}, expected {rc}")
        for fragment in fragments:
            if not re.search(fragment, run.text):
                self.failures.append(f"message lacks /{fragment}/")
        if within is not None and run.seconds > within * self.opts.time_scale:
            self.failures.append(f"took {run.seconds:.1f} s, more than "
                                 f"{within * self.opts.time_scale:g} s")
        if self.failures:
            self.failures.append("output: " + run.text[-600:].replace("\n", " | "))

    def expect_true(self, condition, what):
        if not condition:
            self.failures.append(what)

    def leftover_processes(self):
        found = []
        needle = f"{MARKER}={self.token}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                pass
        return found

    def close(self):
        """The common assertions: no process, no temporary left; then clean up."""
        deadline = time.time() + 2  # killed processes may take a moment to leave the table
        left = self.leftover_processes()
        while left and time.time() < deadline:
            time.sleep(0.05)
            left = self.leftover_processes()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if left:
            self.failures.append(f"processes left running: {left}")
        leftovers = os.listdir(self.tmp)
        for root, _, files in os.walk(self.work):
            leftovers += [os.path.join(root, f) for f in files if ".attest-tmp-" in f]
        if leftovers:
            self.failures.append(f"temporaries left: {leftovers}")
        shutil.rmtree(self.dir, ignore_errors=True)


def worker(opts, mode, *extra):
    return f"exec:{opts.python} {HERE}/hostile_worker.py --mode {mode} " + " ".join(extra)


def wait_for_file(path, seconds):
    deadline = time.time() + seconds
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.02)
    return os.path.exists(path)


# ---- The tests: one function per input class ----

TESTS = []


def test(func):
    TESTS.append(func)
    return func


@test
def deep_case_file(c):
    """A case file nested 60 000 deep (SIGSEGV in the recursive dump into a message)."""
    f = write(c.path("deep.case.json"), '{"problem": ' + "[" * 60000 + "]" * 60000 + "}")
    r = c.run(["oracle", "--case", f, "--out", c.path("o.safetensors")])
    c.expect(r, rc=2, fragments=[r"deep\.case\.json: containers nested deeper than 32 levels"])
    c.expect_true(not os.path.exists(c.path("o.safetensors")), "an output file was written")


@test
def deep_describe(c):
    """A worker whose describe reply is nested 60 000 deep."""
    r = c.run(["check", "--kernel", worker(c.opts, "deep-describe"), "--suite", "quick"])
    c.expect(r, rc=2, fragments=[r"describe: reply is not a JSON object \(containers nested deeper"])


@test
def deep_reply(c):
    """A worker whose forward reply is nested 60 000 deep: a finding, the run goes on."""
    r = c.run(["check", "--kernel", worker(c.opts, "deep-reply"), "--suite", "quick",
               "--check", "accuracy"])
    c.expect(r, rc=1, fragments=[r"protocol violation: reply is not a JSON object \(containers nested"])


@test
def duplicate_case_keys(c):
    """seqlen_q given twice (the last one used to win silently)."""
    text = case_text().replace('"seqlen_q": 4', '"seqlen_q": 4, "seqlen_q": 8')
    f = write(c.path("dup.case.json"), text)
    r = c.run(["oracle", "--case", f, "--out", c.path("o.safetensors")])
    c.expect(r, rc=2, fragments=[r'duplicate key "seqlen_q" inside "problem"'])


@test
def duplicate_reply_keys(c):
    """A reply with "status" twice: error first, then ok."""
    r = c.run(["check", "--kernel", worker(c.opts, "dup-reply"), "--suite", "quick",
               "--check", "accuracy"])
    c.expect(r, rc=1, fragments=[r'duplicate key \\?"status\\?" at the top level'])


@test
def fifo_case_file(c):
    """A FIFO given as the case file (open(2) used to block forever)."""
    f = c.path("fifo.case.json")
    os.mkfifo(f)
    r = c.run(["oracle", "--case", f, "--out", c.path("o.safetensors")], timeout=10)
    c.expect(r, rc=2, fragments=[r"a FIFO, not a regular file"], within=5)


@test
def fifo_inputs_file(c):
    """A case whose inputs path is a FIFO."""
    os.mkfifo(c.path("in.safetensors"))
    f = write(c.path("a.case.json"), case_text(inputs="in.safetensors"))
    r = c.run(["oracle", "--case", f, "--out", c.path("o.safetensors")], timeout=10)
    c.expect(r, rc=2, fragments=[r"in\.safetensors: cannot open: a FIFO"], within=5)


@test
def dev_zero_case(c):
    """/dev/zero as the case file (read 2.1 GB before failing)."""
    r = c.run(["oracle", "--case", "/dev/zero", "--out", c.path("o.safetensors")], timeout=10)
    c.expect(r, rc=2, fragments=[r"/dev/zero: cannot open: a character device"], within=5)


@test
def fifo_outputs(c):
    """A worker that makes its outputs path a FIFO and replies ok."""
    r = c.run(["check", "--kernel", worker(c.opts, "fifo-out"), "--suite", "quick",
               "--check", "accuracy"], timeout=20)
    c.expect(r, rc=1, fragments=[r"outputs file is unusable: .*a FIFO, not a regular file"], within=10)


@test
def symlink_outputs(c):
    """A worker that makes its outputs path a symlink to /dev/zero."""
    r = c.run(["check", "--kernel", worker(c.opts, "symlink-out"), "--suite", "quick",
               "--check", "accuracy"], timeout=20)
    c.expect(r, rc=1, fragments=[r"is a symlink; the outputs file must be a regular file"], within=10)


@test
def huge_outputs(c):
    """A worker that leaves a 16 GiB (sparse) outputs file."""
    r = c.run(["check", "--kernel", worker(c.opts, "huge-out"), "--suite", "quick",
               "--check", "accuracy"], timeout=20)
    c.expect(r, rc=1, fragments=[r"is 17179869184 bytes, over the \d+-byte limit for this outputs file"],
             within=10)


@test
def wide_outputs(c):
    """A worker whose outputs header lists 100 000 tensors (parsed outside the deadline, in
    quadratic time, before)."""
    r = c.run(["check", "--kernel", worker(c.opts, "wide-out"), "--suite", "quick",
               "--check", "accuracy"], timeout=30)
    c.expect(r, rc=1, fragments=[r"over the \d+-byte limit for this outputs file"], within=20)


@test
def huge_batch(c):
    """batch 10^6 (64 s to 4 GB, then std::bad_alloc naming nothing)."""
    p = dict(SMALL_PROBLEM, batch=1000000, seqlen_q=1, seqlen_k=1, head_dim=64, head_dim_v=64)
    f = write(c.path("big.case.json"), case_text(p))
    r = c.run(["oracle", "--case", f, "--out", c.path("o.safetensors")], timeout=20)
    c.expect(r, rc=2, fragments=[r"batch 1000000", r"over the 8 GiB memory budget"], within=5)


@test
def huge_head_dim(c):
    """A worker claiming head dim 10^6 (5 GB allocated for the first case)."""
    r = c.run(["check", "--kernel", worker(c.opts, "huge-head-dim"), "--suite", "quick"],
              timeout=20)
    c.expect(r, rc=2, fragments=[r"head_dim 1000000", r"memory budget"], within=10)


@test
def wide_header(c):
    """A 50 000-tensor safetensors header (42 s before)."""
    tensors = {f"t{i}": ("F32", [1], f32([0.0])) for i in range(50000)}
    f = write(c.path("wide.safetensors"), safetensors_bytes(tensors))
    r = c.run(["inspect", f], timeout=20)
    c.expect(r, rc=0, fragments=[r"50000 tensors"], within=3)


@test
def sigterm_worker_escapee(c):
    """SIGTERM while a worker hangs, its grandchild having left its session (setsid)."""
    pid_file = c.path("escapee.pid")
    p = c.start(["check", "--kernel", worker(c.opts, "hang-escape", "--pid-file", pid_file),
                 "--suite", "quick"], extra_env={"ATTEST_EXEC_TIMEOUT_S": "60"})
    c.expect_true(wait_for_file(pid_file, 10 * c.opts.time_scale),
                  "the worker never started its escapee")
    time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    r = c.finish(p, 10, time.time())
    c.expect(r, signal_death=signal.SIGTERM, fragments=[r"interrupted by SIGTERM"], within=5)


@test
def sigterm_plugin_escapee(c):
    """SIGTERM while a plugin hangs, its grandchild having left its session (setsid)."""
    pid_file = c.path("escapee.pid")
    p = c.start(["check", "--kernel", f"plugin:{c.opts.plugin}:fork-escape", "--suite", "quick"],
                extra_env={"ATTEST_PLUGIN_TIMEOUT": "60", "ATTEST_ADVERSARIAL_PID_FILE": pid_file})
    c.expect_true(wait_for_file(pid_file, 10 * c.opts.time_scale),
                  "the plugin never started its escapee")
    time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    r = c.finish(p, 10, time.time())
    c.expect(r, signal_death=signal.SIGTERM, fragments=[r"interrupted by SIGTERM"], within=5)


@test
def hung_kernel_gate(c):
    """The gate against a worker that never answers: two timeouts, not one per call. (Both
    may fall in the gate's first case, whose report keeps the first call's message; every
    later case says why it was not run.)"""
    r = c.run(["check", "--kernel", worker(c.opts, "hang"), "--suite", "gate"], timeout=60,
              extra_env={"ATTEST_EXEC_TIMEOUT_S": "1"})
    c.expect(r, rc=1, fragments=[r"worker timed out: no reply within 1\.0 s",
                                 r"not run: the kernel hangs \(2 consecutive calls timed out "
                                 r"after 1 s each; no further call is made"], within=15)


@test
def suite_time_budget(c):
    """A suite-level budget: rows not started in time fail as not run."""
    r = c.run(["check", "--kernel", "cpu/flash2-bf16", "--suite", "gate", "--time-budget", "0.5"],
              timeout=60)
    c.expect(r, rc=1, fragments=[r"not run: the suite's time budget of 0.5 s ran out"], within=20)


@test
def plugin_stops_reading(c):
    """A plugin child that stops reading its socket (send(2) blocked forever)."""
    p = dict(SMALL_PROBLEM, seqlen_q=1024, seqlen_k=1024, heads_q=8, heads_kv=8, head_dim=64,
             head_dim_v=64)
    f = write(c.path("big.case.json"), case_text(p))
    r = c.run(["repro", "--kernel", f"plugin:{c.opts.plugin}:stop-reading", "--case", f,
               "--check", "determinism"], timeout=30, extra_env={"ATTEST_PLUGIN_TIMEOUT": "1"})
    c.expect(r, rc=1, fragments=[r"it stopped reading its socket"], within=15)


@test
def full_tmpdir(c):
    """Writing a call's inputs fails (here: RLIMIT_FSIZE, as ENOSPC does): exit 2, not a
    finding against the kernel."""
    r = c.run(["check", "--kernel", worker(c.opts, "hang"), "--suite", "quick"], timeout=20,
              shell_prefix="trap '' XFSZ; ulimit -f 32;")
    c.expect(r, rc=2, fragments=[r"cannot write the inputs file: .*File too large"], within=10)


@test
def oracle_out_is_atomic(c):
    """`attest oracle --out` on a full disk keeps the previous file whole."""
    small = write(c.path("small.case.json"), case_text())
    out = c.path("o.safetensors")
    r = c.run(["oracle", "--case", small, "--out", out, "--quiet"])
    c.expect(r, rc=0)
    before = open(out, "rb").read()
    p = dict(SMALL_PROBLEM, seqlen_q=64, seqlen_k=64, head_dim=32, head_dim_v=32)
    big = write(c.path("big.case.json"), case_text(p))
    r = c.run(["oracle", "--case", big, "--out", out, "--quiet"], shell_prefix="trap '' XFSZ; ulimit -f 16;")
    c.expect(r, rc=2, fragments=[r"o\.safetensors: write failed: File too large"])
    c.expect_true(open(out, "rb").read() == before, "the previous output was changed")


@test
def json_report_is_atomic(c):
    """`--json` on a full disk keeps the previous report whole."""
    report = write(c.path("r.json"), '{"previous": "report"}\n')
    r = c.run(["check", "--kernel", "cpu/flash2-bf16", "--suite", "quick", "--check", "accuracy",
               "--json", report], timeout=60, shell_prefix="trap '' XFSZ; ulimit -f 4;")
    c.expect(r, rc=2, fragments=[r"r\.json: write failed: File too large"])
    c.expect_true(open(report).read() == '{"previous": "report"}\n', "the previous report was changed")


@test
def golden_dir_with_a_quote(c):
    """A --dir with an apostrophe used to reach a shell: the name ran a command."""
    d = c.path("g'; touch PWNED; '")
    os.makedirs(d)
    r = c.run(["golden", "regen", "--dir", d, "--only", "nothing"], timeout=30)
    c.expect(r, rc=2, fragments=[r"'nothing' is not in the catalogue"])
    c.expect_true(not os.path.exists(c.path("PWNED")), "the folder name ran a shell command")


@test
def strict_numbers(c):
    """Numbers on the command line: no wrap-around, no empty value, no internal error."""
    cases = [
        (["check", "--kernel", "cpu/flash2-bf16", "--seed", "-1"], r"--seed: '-1' is not a non-negative integer"),
        (["check", "--kernel", "cpu/flash2-bf16", "--seed", "18446744073709551616"], r"--seed: .*out of range"),
        (["check", "--kernel", "cpu/flash2-bf16", "--seed", ""], r"--seed: expected a number"),
        (["fuzz", "--kernel", "cpu/flash2-bf16", "--cases", "1", "--shard", "0/99999999999999999999"],
         r"--shard: the count N: .*out of range"),
        (["fuzz", "--kernel", "cpu/flash2-bf16", "--time", "-5"], r"--time: '-5' is not a number of seconds > 0"),
        (["check", "--kernel", "cpu/flash2-bf16", "--threads", "2x"], r"--threads: '2x' is not an integer"),
    ]
    for args, fragment in cases:
        r = c.run(args, timeout=20)
        c.expect(r, rc=2, fragments=[fragment], within=5)


@test
def fuzz_sigint_keeps_the_report(c):
    """SIGINT to `attest fuzz --out D`: D/fuzz-report.json says what ran, and merges."""
    out = c.path("shard0")
    p = c.start(["fuzz", "--kernel", "cpu/flash2-bf16", "--time", "120", "--out", out, "--quiet"])
    time.sleep(2 * c.opts.time_scale)  # long enough for a few cases
    p.send_signal(signal.SIGINT)
    r = c.finish(p, 15, time.time())
    c.expect(r, signal_death=signal.SIGINT, fragments=[r"interrupted by SIGINT"], within=10)
    report = os.path.join(out, "fuzz-report.json")
    ok = os.path.exists(report)
    c.expect_true(ok, "no fuzz-report.json after SIGINT")
    if ok:
        j = json.load(open(report))
        c.expect_true(j.get("interrupted") == "SIGINT" and j.get("cases_run", 0) > 0,
                      f"report does not say it was interrupted after some cases: {str(j)[:200]}")
    c.expect_true(not os.path.exists(os.path.join(out, ".attest.lock")), "the lock file was left")
    m = c.run(["fuzz", "--merge", out], timeout=20)
    c.expect(m, rc=0, fragments=[r"merged 1 shard report"])


@test
def fuzz_out_is_a_file(c):
    """--out naming a file: refused before the first case, not after a failure was shrunk."""
    f = write(c.path("not-a-dir"), "x")
    r = c.run(["fuzz", "--kernel", "mutant/causal-top-left", "--cases", "50", "--out", f],
              timeout=60)
    c.expect(r, rc=2, fragments=[r"--out .*not-a-dir: exists and is not a directory"], within=3)


@test
def check_out_is_a_file(c):
    """`attest check --out` naming a file: refused before the suite runs."""
    f = write(c.path("not-a-dir"), "x")
    r = c.run(["check", "--kernel", "mutant/causal-top-left", "--suite", "quick", "--out", f],
              timeout=60)
    c.expect(r, rc=2, fragments=[r"--out .*not-a-dir: exists and is not a directory"], within=3)


@test
def fuzz_shared_out(c):
    """Two runs given one --out: the second is refused instead of overwriting the first."""
    out = c.path("shared")
    first = c.start(["fuzz", "--kernel", "cpu/flash2-bf16", "--time", "60", "--out", out, "--quiet"])
    c.expect_true(wait_for_file(os.path.join(out, ".attest.lock"), 10 * c.opts.time_scale),
                  "the first run took no lock")
    r = c.run(["fuzz", "--kernel", "cpu/flash2-bf16", "--cases", "3", "--out", out], timeout=20)
    c.expect(r, rc=2, fragments=[r"in use by another attest run \(pid \d+\)"], within=5)
    first.send_signal(signal.SIGINT)
    c.finish(first, 15, time.time())


@test
def quantize_zero_size(c):
    """A zero-size tensor [0, 2^63 - 1]: its scale must be a valid zero-size tensor too."""
    f = write(c.path("z.safetensors"),
              safetensors_bytes({"x": ("F32", [0, 9223372036854775807], b"")}))
    out = c.path("q.safetensors")
    r = c.run(["quantize", "--scheme", "mxfp8-e4m3", "--in", f, "--out", out])
    c.expect(r, rc=0)
    r = c.run(["inspect", out])
    c.expect(r, rc=0, fragments=[r"x\.scale .*\[0, 288230376151711744\]"])


@test
def nan_inputs(c):
    """NaN in q: refused by the oracle, naming the element (was an 'empty row')."""
    n = 4 * 8
    q = [0.5] * n
    q[5] = float("nan")
    tensors = {name: ("F32", [1, 4, 1, 8], f32(q if name == "q" else [0.25] * n))
               for name in ("q", "k", "v")}
    write(c.path("in.safetensors"), safetensors_bytes(tensors))
    f = write(c.path("nan.case.json"), case_text(inputs="in.safetensors"))
    r = c.run(["oracle", "--case", f, "--out", c.path("o.safetensors")])
    c.expect(r, rc=2, fragments=[r"input q\[0, 0, 0, 5\] is NaN: the oracle refuses non-finite inputs"])
    c.expect_true(not os.path.exists(c.path("o.safetensors")), "an output file was written")


@test
def widened_f64_worker(c):
    """A float32 worker answering in float64 containers: ULPs follow its declared f32, so a
    correct worker passes (gqa-mha failed with margin 4e8)."""
    if subprocess.run([c.opts.python, "-c", "import numpy"], capture_output=True).returncode != 0:
        return "skipped: no numpy"
    k = f"exec:{c.opts.python} {ROOT}/tools/workers/faulty_worker.py --mode widen"
    r = c.run(["check", "--kernel", k, "--suite", "quick"], timeout=120)
    c.expect(r, rc=0, fragments=[r"101 verdicts"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attest", required=True)
    parser.add_argument("--plugin", required=True, help="libattest_hostile_plugin.so")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiplies every deadline (a sanitizer build runs slower)")
    opts = parser.parse_args()
    # Each test runs in its own folder: paths given relative to here must stay valid.
    opts.attest, opts.plugin = os.path.abspath(opts.attest), os.path.abspath(opts.plugin)
    if os.sep in opts.python:
        opts.python = os.path.abspath(opts.python)
    if opts.list:
        for t in TESTS:
            print(f"{t.__name__:28} {t.__doc__.splitlines()[0]}")
        return 0
    failed = 0
    start = time.time()
    for t in TESTS:
        if opts.only and t.__name__ not in opts.only:
            continue
        c = Context(opts, t.__name__)
        t0 = time.time()
        note = None
        try:
            note = t(c)
        except Exception as e:  # a broken test is a failed test
            c.failures.append(f"test raised {type(e).__name__}: {e}")
        c.close()
        status = "FAIL" if c.failures else ("SKIP" if note else "ok  ")
        print(f"{status} {t.__name__:28} {time.time() - t0:6.2f} s" + (f"  ({note})" if note else ""),
              flush=True)
        for f in c.failures:
            print(f"     - {f}", flush=True)
        failed += bool(c.failures)
    print(f"{failed} of {len(TESTS) if not opts.only else len(opts.only)} failed, "
          f"{time.time() - start:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
