#!/usr/bin/env python3
"""The verdict comparison and summary of tools/device/wheel_gpu_proof.py on synthetic reports
(ctest wheel_gpu_proof_compare): equal reports agree; a flipped verdict, a case run by one
route only, a repeat of the same (check, tensor, case) missing, different skipped rows and a
different overall verdict are each written as a difference; the summary reads the routes'
reports, timings and exit codes into summary.json and summary.txt, and with --expect-oracle
cuda holds a kernel to oracle_device cuda in both reports and the wheel's own library."""

import copy
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wheel_gpu_proof as proof  # noqa: E402


def verdict(check, tensor, label, ok=True):
    return {"check": check, "tensor": tensor, "pass": ok, "case": {"label": label},
            "message": ""}


def report(verdicts, skipped=(), oracle="cuda"):
    return {"verdicts": verdicts, "skipped": list(skipped), "passed": all(
        v["pass"] for v in verdicts), "error": None, "oracle_device": oracle}


BASE = report([verdict("accuracy", "o", "causal B1"), verdict("accuracy", "dq", "causal B1"),
               verdict("consistency", "o", "GQA"), verdict("consistency", "o", "GQA")],
              skipped=[{"check": "softcap", "reason": "no softcap"}])


def expect(cond, what):
    if not cond:
        print(f"wheel_gpu_proof_test: FAILED: {what}")
        sys.exit(1)


def main():
    expect(proof.compare(BASE, copy.deepcopy(BASE)) == [], "equal reports differ")
    # Messages, margins and the oracle device are not verdicts.
    other = copy.deepcopy(BASE)
    other["verdicts"][0]["message"] = "another kernel name"
    expect(proof.compare(BASE, other) == [], "a message difference counted")

    flipped = copy.deepcopy(BASE)
    flipped["verdicts"][1]["pass"] = False
    flipped["passed"] = False
    d = proof.compare(BASE, flipped)
    expect(len(d) == 2 and "accuracy/dq on 'causal B1': in-process pass, exec FAIL" in d[0]
           and d[1].startswith("passed:"), f"a flipped verdict: {d}")

    extra = copy.deepcopy(BASE)
    extra["verdicts"].append(verdict("window-causal", "o", "window 8"))
    d = proof.compare(BASE, extra)
    expect(d == ["window-causal/o on 'window 8': only exec (pass)"], f"an extra case: {d}")

    # The second of two verdicts with the same check, tensor and case.
    fewer = copy.deepcopy(BASE)
    del fewer["verdicts"][3]
    d = proof.compare(BASE, fewer)
    expect(d == ["consistency/o on 'GQA' #2: only in-process (pass)"], f"a repeat: {d}")

    skips = copy.deepcopy(BASE)
    skips["skipped"] = []
    d = proof.compare(BASE, skips)
    expect(len(d) == 1 and d[0].startswith("skipped rows differ: 1 in-process, 0 exec"),
           f"skipped rows: {d}")

    with tempfile.TemporaryDirectory() as work:
        def write(name, data):
            with open(os.path.join(work, name), "w") as f:
                f.write(data if isinstance(data, str) else json.dumps(data))
        write("inproc-sdpa-math.json", BASE)
        write("inproc-sdpa-math.meta.json", {
            "seconds": 2.0, "warnings": [], "attest": "/site/attest/__init__.py",
            "cuda_oracle": {"library": "/site/attest/libattest_oracle_cuda.so", "devices": 1}})
        write("inproc-sdpa-math.rc", "0 3")
        write("exec-sdpa-math.json", flipped)
        write("exec-sdpa-math.rc", "1 8")
        write("inproc-flex.rc", "124 400")
        write("pytest-sdpa-math.rc", "1 50")
        write("pytest-sdpa-math.log", "...\n3 failed, 10 passed in 49.0s\n")
        out = os.path.join(work, "out")
        rc = proof.main(["summarize", "--work", work, "--out", out,
                         "--kernels", "sdpa-math,flex", "--expect-oracle", "cuda"])
        s = json.load(open(os.path.join(out, "summary.json")))
        math, flex = s["kernels"]
        expect(rc == 0 and math["agree"] is False and len(math["differences"]) == 2
               and math["inproc"]["seconds_per_verdict"] == 0.5
               and math["exec"]["seconds_per_verdict"] == 2.0
               and math["exec"]["failed_verdicts"] == 1
               and math["inproc"]["oracle_device"] == "cuda"
               and flex["agree"] is None and flex["exit"]["inproc"] == 124
               and math["pytest"]["exit"] == 1 and "3 failed" in math["pytest"]["tail"]
               and flex["pytest"]["exit"] is None
               and math["oracle_ok"] is True and flex["oracle_ok"] is False
               and s["agree"] is False and s["oracle_ok"] is False,
               f"summary: {json.dumps(s)[:1500]}")
        text = open(os.path.join(out, "summary.txt")).read()
        expect("sdpa-math: agree False" in text and "flex: agree None" in text
               and "in-process pass, exec FAIL" in text, f"summary.txt: {text}")
        # The oracle from elsewhere than the wheel, or the CPU's, is not the expected one.
        write("inproc-sdpa-math.meta.json", {
            "seconds": 2.0, "attest": "/site/attest/__init__.py",
            "cuda_oracle": {"library": "/build/libattest_oracle_cuda.so", "devices": 1}})
        proof.main(["summarize", "--work", work, "--out", out, "--kernels", "sdpa-math",
                    "--expect-oracle", "cuda"])
        s = json.load(open(os.path.join(out, "summary.json")))
        expect(s["kernels"][0]["oracle_ok"] is False, "a library from elsewhere passes")
        write("inproc-sdpa-math.meta.json", {
            "seconds": 2.0, "attest": "/site/attest/__init__.py",
            "cuda_oracle": {"library": "/site/attest/libattest_oracle_cuda.so", "devices": 1}})
        write("exec-sdpa-math.json", dict(flipped, oracle_device="cpu"))
        proof.main(["summarize", "--work", work, "--out", out, "--kernels", "sdpa-math",
                    "--expect-oracle", "cuda"])
        s = json.load(open(os.path.join(out, "summary.json")))
        expect(s["kernels"][0]["oracle_ok"] is False, "the exec route's CPU oracle passes")
    print("wheel_gpu_proof_test: ok (agreement, flipped verdict, extra case, repeat, skipped "
          "rows, summary, oracle_device and library expected)")


if __name__ == "__main__":
    main()
