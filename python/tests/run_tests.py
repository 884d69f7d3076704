"""Tests of the Python package (ctest python_package; PYTHONPATH holds the built package,
ATTEST_CLI the attest executable): the in-process API, the pytest plugin and `attest check`
give the same verdicts on the same kernel and seed; a seeded bug fails with a repro line that
reproduces it from a shell; a raising kernel is one kernel-error verdict per case; isolate=True
runs the function in a child process with the verdicts of the in-process run. Exit 77 (skipped)
where torch or pytest is not importable."""

import json
import os
import shlex
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import pytest  # noqa: F401
    import torch  # noqa: F401
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

import attest  # noqa: E402
import kernels_for_tests as kt  # noqa: E402

CLI = os.environ["ATTEST_CLI"]
failures = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def cli_report(spec, suite, tmp, name):
    path = os.path.join(tmp, name + ".json")
    r = subprocess.run([CLI, "check", "--kernel", spec, "--suite", suite, "--quiet",
                        "--json", path, "--out", os.path.join(tmp, name)],
                       capture_output=True, text=True)
    with open(path) as f:
        return r.returncode, json.load(f)


def keys(verdicts):
    """What must agree between runs: each verdict's check, tensor, outcome, margin, observed,
    allowed, worst location and case (not file names or wall times)."""
    out = []
    for v in verdicts:
        case = v.get("case") or {}
        out.append((v["check"], v["tensor"], v["pass"], v["margin"], v["observed"],
                    v["allowed"], json.dumps(v["worst"], sort_keys=True), case.get("label")))
    return out


def main():
    # Absolute, so that the child processes (workers, pytest) run from other folders find it.
    paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([HERE] + paths)
    with tempfile.TemporaryDirectory() as tmp:
        # 1. A built-in kernel: the API's JSON report is the CLI's, byte for byte.
        api = attest.check("cpu/flash2-bf16", suite="quick", failure_dir=tmp)
        code, cli = cli_report("cpu/flash2-bf16", "quick", tmp, "builtin")
        expect(api.passed and code == 0, "cpu/flash2-bf16 passes the quick suite (API, CLI)")
        expect(json.loads(api.to_json()) == cli, "cpu/flash2-bf16: API and CLI JSON reports "
               "are identical")

        # 2. A Python function: in process, isolated (the exec protocol) and through the CLI.
        fn_kw = dict(api="sdpa", dtype="bf16", device="cpu")
        inproc = attest.check(kt.eager_sdpa, suite="quick", **fn_kw)
        isolated = attest.check(kt.eager_sdpa, suite="quick", isolate=True, **fn_kw)
        spec = attest.Kernel(kt.eager_sdpa, isolate=True, **fn_kw).spec
        code, cli = cli_report(spec, "quick", tmp, "eager")
        ref = keys(cli["verdicts"])
        expect(len(ref) > 20 and code == 0, f"eager_sdpa passes the quick suite through the CLI "
               f"({len(ref)} verdicts)")
        expect(keys(json.loads(inproc.to_json())["verdicts"]) == ref,
               "eager_sdpa: in-process verdicts equal the CLI's")
        expect(keys(json.loads(isolated.to_json())["verdicts"]) == ref,
               "eager_sdpa: isolate=True verdicts equal the CLI's")
        expect(inproc.kernel == spec, "the report names the kernel by its exec: spec")

        # 3. The pytest plugin: one item per row; an item fails exactly where a verdict of its
        # row fails, is skipped where the row has none.
        junit = os.path.join(tmp, "plugin.xml")
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "attest.pytest_plugin",
                            os.path.join(HERE, "test_plugin_suite.py"), "--junitxml", junit,
                            "-o", "junit_family=xunit1"],
                           capture_output=True, text=True, cwd=HERE)
        expect(r.returncode == 0, "pytest on the quick suite passes: " + r.stdout[-300:] +
               r.stderr[-600:])
        cases = ET.parse(junit).getroot().iter("testcase")
        items = {c.get("name"): ("skipped" if c.find("skipped") is not None else
                                 "failed" if c.find("failure") is not None else "passed")
                 for c in cases}
        rows = attest.suite_rows(kt.eager_sdpa, suite="quick", **fn_kw)
        expect(len(items) == len(rows) + 1, f"one item per row and the coverage item "
               f"({len(items)} items, {len(rows)} rows)")
        judged = {(v["check"], (v.get("case") or {}).get("label")) for v in cli["verdicts"]}
        want = {f"{row['check']}[{row['label']}]":
                "passed" if (row["check"], row["label"]) in judged else "skipped"
                for row in rows}
        got = {k: v for k, v in items.items() if k != "coverage"}
        expect(got == want, "each item passes where the CLI judged its row, skips elsewhere")
        sel = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "attest.pytest_plugin",
                              os.path.join(HERE, "test_plugin_suite.py"), "-k", "accuracy",
                              "--co"], capture_output=True, text=True, cwd=HERE)
        expect(sel.returncode == 0 and "accuracy[" in sel.stdout and "honesty[" not in sel.stdout,
               "-k accuracy selects the accuracy rows alone")

        # 3b. PyTorch's own SDPA on the CPU: the gate passes in f32; the bf16 flash backward's
        # finding reproduces and the math backend passes its case (test_torch_sdpa_cpu.py).
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "attest.pytest_plugin",
                            os.path.join(HERE, "test_torch_sdpa_cpu.py")],
                           capture_output=True, text=True, cwd=HERE)
        expect(r.returncode == 0, "test_torch_sdpa_cpu.py passes: " + r.stdout[-600:] +
               r.stderr[-600:])

        # 4. A seeded bug fails; its repro line reproduces the failure from a shell.
        bug = attest.check(kt.sdpa_scale_bug, suite="quick", **fn_kw)
        first = bug.failures[0] if bug.failures else None
        expect(first is not None and first.check == "accuracy",
               f"sdpa_scale_bug fails accuracy first ({first})")
        if first is not None:
            expect(first.repro.startswith("attest repro --kernel ") and first.case_file and
                   os.path.exists(first.case_file), "the failure has a repro line and a case file")
            words = shlex.split(first.repro)
            rr = subprocess.run([CLI] + words[1:], capture_output=True, text=True)
            expect(rr.returncode == 1, f"its repro line fails again from a shell (exit "
                   f"{rr.returncode})")
            expect("observed" in first.describe() and "repro:" in first.describe(),
                   "describe() shows observed/allowed and the repro line")

        # 5. A kernel that raises: one kernel-error verdict per case, naming the exception.
        err = attest.check(kt.raises, suite="quick", **fn_kw)
        errors = [v for v in err.failures if v.check == "kernel-error"]
        labels = [v.case_label for v in errors]
        expect(errors and len(labels) == len(set(labels)) and
               "RuntimeError: deliberate failure" in errors[0].message,
               f"a raising kernel: one kernel-error per case ({len(errors)}), naming the error")

        # 6. FlashAttention's calling convention (an eager stand-in of flash_attn_func): its
        # claim read from the signature, lse from return_attn_probs.
        fa = attest.check(kt.fake_flash_attn_func, api="flash_attn", suite="quick",
                          dtype="bf16", device="cpu")
        caps = json.loads(attest.Kernel(kt.fake_flash_attn_func, api="flash_attn",
                                        device="cpu").capabilities())
        expect(fa.passed and caps["causal_bottom_right_only"] and caps["gqa"] and
               not caps["window"], f"api=flash_attn: a FlashAttention-2-style function passes "
               f"the quick suite ({len(fa.verdicts)} verdicts), claims what its signature has")

        # 6b. Layouts in process: attest's views reach the function with their strides
        # (python/src/core.cc ToPython, Bridge._in); api="sdpa" claims "inner" strides.
        lay = {n: attest.check(getattr(kt, n), suite="gate", only_check="layouts", **fn_kw)
               for n in ("eager_sdpa", "strides_ignored")}
        expect(lay["eager_sdpa"].passed and len(lay["eager_sdpa"].verdicts) > 10,
               f"layouts in process: eager_sdpa passes ({len(lay['eager_sdpa'].verdicts)} "
               f"verdicts)")
        bad = lay["strides_ignored"].failures
        expect(bad and all(v.check == "layouts" for v in bad),
               f"layouts in process: a function that ignores strides fails ({len(bad)} verdicts)")

        # 7. The command line in process: fuzz, oracle, list.
        expect(attest.fuzz("mutant/causal-top-left", cases=30, out=os.path.join(tmp, "fz"),
                           quiet=True) == 1, "attest.fuzz finds the mutant (exit 1)")
        expect(attest.fuzz(kt.eager_sdpa, cases=3, out=os.path.join(tmp, "fz2"), quiet=True,
                           **fn_kw) == 0, "attest.fuzz on a Python function passes (exit 0)")
        case = os.path.join(os.path.dirname(os.path.dirname(HERE)), "golden", "cases")
        case = os.path.join(case, sorted(f for f in os.listdir(case)
                                         if f.endswith(".case.json"))[0])
        ref = os.path.join(tmp, "ref.safetensors")
        expect(attest.oracle(case, ref) == 0 and os.path.getsize(ref) > 0,
               "attest.oracle writes the reference outputs")
        expect(attest.cli("list", "suites") == 0, "attest.cli runs a subcommand")
        r = subprocess.run([sys.executable, "-m", "attest", "--version"], capture_output=True,
                           text=True)
        expect(r.returncode == 0 and r.stdout.startswith("attest "), "python -m attest --version")

        # 8. Bad arguments are errors, not verdicts.
        for bad, what in ((dict(api="nope"), "api"), (dict(dtype="e4m3"), "dtype"),
                          (dict(suite="nightly"), "suite"),
                          (dict(oracle_device="gpu"), "oracle_device")):
            try:
                attest.check(kt.eager_sdpa, **{**fn_kw, **bad})
                expect(False, f"a bad {what} raises ValueError")
            except ValueError as e:
                expect(what in str(e), f"a bad {what} raises ValueError naming it: {e}")

    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
