#!/usr/bin/env python3
"""attest's soak test (docs/reliability.md): the merge gate against the NumPy worker in
tools/workers/faulty_worker.py --mode chaos, which crashes (SIGSEGV), hangs or answers
garbage on a seeded 10 % of its forward/backward calls. Asserts that the run
  - ends within a bound (hangs cost the call timeout, set short here),
  - records its verdicts (the JSON report) and every failing verdict is one of the faults
    injected (a crash, a timeout, a protocol violation, or a call not run), never a wrong
    number from a call that did not fault,
  - injected each kind of fault at least once (the worker's log),
  - leaves no process (the marker every descendant inherits) and no temporary folder,
and that the quick suite under the same faults gives the same report twice (same seed,
same verdicts). Prints the numbers docs/reliability.md quotes. Exit 77 without NumPy.

Usage: soak.py --attest PATH [--python PY] [--seed 2] [--suite gate] [--timeout 2]
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MARKER = "ATTEST_ADVERSARIAL_RUN"
# What a verdict says when the call behind it faulted (kernels/exec/exec_kernel.cc,
# process.cc): the only failures a correct worker with injected faults may produce.
FAULT_WORDS = ("killed by signal SIGSEGV", "timed out", "protocol violation", "not run:",
               "backward not run")


def leftover(token):
    needle = f"{MARKER}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def run_gate(opts, suite, seed, tmp, log, report, timeout):
    kernel = (f"exec:{opts.python} {ROOT}/tools/workers/faulty_worker.py --mode chaos "
              f"--seed {seed} --rate {opts.rate} --log {log}")
    token = uuid.uuid4().hex
    env = dict(os.environ, TMPDIR=tmp, ATTEST_EXEC_TIMEOUT_S=str(timeout), **{MARKER: token})
    t0 = time.time()
    p = subprocess.run([opts.attest, "check", "--kernel", kernel, "--suite", suite,
                        "--json", report, "--out", os.path.join(tmp, "..", "failures")],
                       env=env, capture_output=True, text=True, timeout=opts.bound)
    return p, time.time() - t0, token


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attest", required=True)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--suite", default="gate")
    parser.add_argument("--timeout", type=float, default=2, help="per call (ATTEST_EXEC_TIMEOUT_S)")
    parser.add_argument("--bound", type=float, default=240, help="wall-time bound of the run")
    opts = parser.parse_args()
    opts.attest = os.path.abspath(opts.attest)
    if os.sep in opts.python:
        opts.python = os.path.abspath(opts.python)
    if subprocess.run([opts.python, "-c", "import numpy"], capture_output=True).returncode != 0:
        print("soak: skipped (no numpy)")
        return 77
    problems = []
    base = tempfile.mkdtemp(prefix="attest-soak-")
    try:
        # 1. The gate under faults.
        tmp = os.path.join(base, "tmp")
        os.makedirs(tmp)
        log, report = os.path.join(base, "faults.log"), os.path.join(base, "report.json")
        p, seconds, token = run_gate(opts, opts.suite, opts.seed, tmp, log, report, opts.timeout)
        if p.returncode != 1:
            problems.append(f"exit code {p.returncode}, expected 1 (findings): {p.stderr[-400:]}")
        calls = [line.split() for line in open(log)] if os.path.exists(log) else []
        faults = [c for c in calls if c[2] != "none"]
        kinds = {f[2] for f in faults}
        for kind in ("crash", "hang", "garbage"):
            if kind not in kinds:
                problems.append(f"no {kind} was injected (seed {opts.seed})")
        verdicts = json.load(open(report))["verdicts"] if os.path.exists(report) else []
        if not verdicts:
            problems.append("no report was written")
        unexplained = [v for v in verdicts if not v["pass"]
                       and not any(w in v["message"] for w in FAULT_WORDS)]
        for v in unexplained[:5]:
            problems.append(f"a failure no fault explains: {v['check']} {v['tensor']}: "
                            f"{v['message'][:300]}")
        hung = "marked hung" in p.stdout
        time.sleep(0.2)
        left = leftover(token)
        if left:
            problems.append(f"processes left: {left}")
            for pid in left:
                os.kill(pid, signal.SIGKILL)
        if os.listdir(tmp):
            problems.append(f"temporaries left: {os.listdir(tmp)}")
        failing = sum(not v["pass"] for v in verdicts)
        print(f"soak: suite {opts.suite}, seed {opts.seed}, rate {opts.rate}, call timeout "
              f"{opts.timeout} s: {len(calls)} calls, {len(faults)} faults injected "
              f"({', '.join(f'{k} {sum(f[2] == k for f in faults)}' for k in ('crash', 'hang', 'garbage'))})"
              f", last faulted call #{max((int(f[0]) for f in faults), default=0)}; "
              f"{len(verdicts)} verdicts, {failing} failing (all from faults: "
              f"{'yes' if not unexplained else 'no'}); kernel marked hung: {'yes' if hung else 'no'}; "
              f"{seconds:.1f} s wall")
        # 2. Same seed, same verdicts (the quick suite, twice).
        # The same paths both times: the kernel spec (with its --log) and the failure folder
        # are part of every message and repro line.
        reports = []
        for i in range(2):
            t, r, qlog = (os.path.join(base, "qtmp"), os.path.join(base, "quick.json"),
                          os.path.join(base, "quick.log"))
            for stale in (os.path.join(base, "failures"), t):
                shutil.rmtree(stale, ignore_errors=True)
            os.makedirs(t)
            if os.path.exists(qlog):
                os.remove(qlog)
            # A longer call timeout: a correct call that a loaded machine slows past it would
            # differ between the two runs (the comparison is about faults, not the machine).
            run_gate(opts, "quick", opts.seed, t, qlog, r, 2 * opts.timeout)
            reports.append(json.load(open(r))["verdicts"] if os.path.exists(r) else None)
        if reports[0] is None or reports[0] != reports[1]:
            problems.append("the quick suite under the same faults gave two different reports")
        else:
            print(f"soak: quick suite twice under seed {opts.seed}: identical reports "
                  f"({len(reports[0])} verdicts)")
    except subprocess.TimeoutExpired:
        problems.append(f"the run did not end within {opts.bound} s")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for problem in problems:
        print("soak: FAIL " + problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
