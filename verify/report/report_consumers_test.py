#!/usr/bin/env python3
"""attest's reports as their consumers read them: JUnit with junitparser (PyPI; the reader
behind many CI test-report plugins) and xmllint against verify/report/testdata/junit.xsd, JSON with
jsonschema against docs/report.schema.json (verify/report/validate_report.py).

Runs `attest check --junit --json` on
  1. a failing mutant       every failing verdict is one <failure> under a distinct name that
                            names its check, tensor and case; the same seed gives the same names
  2. a skipping worker      the minimal worker of docs/protocol.md, its text taken from the
                            page: skipped rows are <skipped> with their reason, the coverage
                            guard fails the run (exit 1, diagnosis coverage) unless --allow-skips
  3. crashing workers       tools/workers/faulty_worker.py crash / exception: one <error> per
                            case, none a <failure>, naming the signal or the exception line
                            and not the whole traceback
  4. a worker that cannot start   exit 2, and still a report: one <error>, JSON "error"
and checks that the JSON of each validates and that the schema rejects what it must.

  report_consumers_test.py ATTEST [XMLLINT]   (from the repository root; 77 = skipped)
"""

import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "verify"))

try:
    import junitparser
    from junitparser import Error, Failure, JUnitXml, Skipped
except ImportError:
    print("skip: junitparser is not installed (tools/bootstrap puts it in build/venv)")
    sys.exit(77)
import validate_report  # noqa: E402

ATTEST = sys.argv[1]
XMLLINT = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None
PYTHON = sys.executable
FAILED = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        FAILED.append(what)


def run(work, name, kernel, *extra):
    """attest check with --junit and --json into `work`; returns (rc, stdout, junit, json)."""
    xml = os.path.join(work, name + ".xml")
    js = os.path.join(work, name + ".json")
    cmd = [ATTEST, "check", "--kernel", kernel, "--junit", xml, "--json", js,
           "--out", os.path.join(work, name + "-cases"), *extra]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if XMLLINT:
        lint = subprocess.run([XMLLINT, "--noout", "--schema",
                               os.path.join(ROOT, "verify/report/testdata/junit.xsd"), xml],
                              capture_output=True, text=True)
        check(lint.returncode == 0, f"{name}: JUnit validates against junit.xsd" +
              ("" if lint.returncode == 0 else ": " + lint.stderr[-300:]))
    with open(js, encoding="utf-8") as f:
        report = json.load(f, parse_constant=validate_report._not_json)
    problems = validate_report.errors(SCHEMA, report)
    check(not problems, f"{name}: JSON validates against docs/report.schema.json {problems[:3]}")
    return p.returncode, p.stdout, JUnitXml.fromfile(xml), report


def cases(junit):
    return [c for suite in junit for c in suite]


def results(case, kind):
    return [r for r in case.result if isinstance(r, kind)]


def minimal_worker(work):
    """The minimal worker of docs/protocol.md, verbatim, beside the helper it imports."""
    with open(os.path.join(ROOT, "docs/protocol.md"), encoding="utf-8") as f:
        page = f.read()
    section = page[page.index("## A minimal worker"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    path = os.path.join(work, "minimal_worker.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(code)
    with open(os.path.join(ROOT, "tools/workers/attest_worker.py"), encoding="utf-8") as src, \
            open(os.path.join(work, "attest_worker.py"), "w", encoding="utf-8") as dst:
        dst.write(src.read())
    return path


def test_failing_mutant(work):
    rc, out, junit, report = run(work, "mutant", "mutant/store-permutation", "--suite", "quick")
    check(rc == 1, f"mutant: exit {rc}, want 1")
    failing = [v for v in report["verdicts"] if not v["pass"]]
    check(len(failing) >= 2, f"mutant: {len(failing)} failing verdicts, want several")
    all_cases = cases(junit)
    failures = [c for c in all_cases if results(c, Failure)]
    check(len(failures) == len(failing),
          f"mutant: {len(failures)} <failure> testcases for {len(failing)} failing verdicts")
    names = [c.name for c in all_cases]
    check(len(set(names)) == len(names), f"mutant: {len(names)} testcase names, all distinct")
    def named(v, c):
        want = f"{v['check']}/{v['tensor']}" if v["tensor"] else v["check"]
        return (c.name.startswith(want + " [") and v["case"] is not None and
                v["case"]["label"] in c.name and c.classname == v["check"] and
                bool(results(c, Failure)[0].message))
    unnamed = [c.name for v, c in zip(failing, failures) if not named(v, c)]
    check(not unnamed, f"mutant: every failure names its check, tensor and case {unnamed[:3]}")
    check(all(float(c.time) >= 0 for c in all_cases) and
          sum(float(c.time) for c in all_cases) > 0, "mutant: testcases carry measured times")
    check(report["capabilities"] is not None and
          report["verdicts"][0]["case"]["problem"]["batch"] >= 1,
          "mutant: JSON has capabilities and cases as fields")
    check(all(v["case"]["file"] for v in failing), "mutant: failing cases name their case file")
    check(re.fullmatch(r"[0-9a-f]{40}", report["attest"]["commit"] or "") is not None or
          report["attest"]["commit"] is None, "mutant: attest commit is a hash or null")
    # The same seed, the same names (stable across runs and machines: no times, no paths).
    _, _, again, _ = run(work, "mutant-again", "mutant/store-permutation", "--suite", "quick")
    check([c.name for c in cases(again)] == names, "mutant: same seed, same testcase names")


def test_skipping_worker(work):
    worker = minimal_worker(work)
    kernel = f"exec:{PYTHON} {worker}"
    rc, out, junit, report = run(work, "minimal", kernel, "--suite", "quick")
    check(rc == 1, f"minimal worker: quick suite exit {rc}, want 1 (it must not pass silently)")
    check(report["first_failure"] is not None and report["first_failure"]["check"] == "coverage",
          f"minimal worker: the diagnosis is coverage ({report['first_failure']})")
    check("too many rows skipped" in out.splitlines()[-1],
          "minimal worker: the verdict line says too many rows were skipped")
    skipped = [c for c in cases(junit) if results(c, Skipped)]
    check(len(skipped) == len(report["skipped"]) > 0,
          f"minimal worker: {len(skipped)} <skipped> for {len(report['skipped'])} skipped rows")
    check(all(results(c, Skipped)[0].message for c in skipped),
          "minimal worker: every <skipped> says why")
    suite = next(iter(junit))
    check(int(suite.skipped) == len(skipped), f"minimal worker: testsuite skipped={suite.skipped}")
    rc, out, junit, report = run(work, "minimal-allowed", kernel, "--suite", "quick",
                                 "--allow-skips")
    check(rc == 0, f"minimal worker with --allow-skips: exit {rc}, want 0")
    check("(accepted)" in out.splitlines()[-1], "minimal worker: the acceptance is stated")


def test_crashing_workers(work):
    for mode, says in (("crash", "killed by signal SIGSEGV (11)"),
                       ("exception", "TypeError: flash_attn_func() got an unexpected keyword")):
        kernel = f"exec:{PYTHON} tools/workers/faulty_worker.py --mode {mode}"
        rc, out, junit, report = run(work, mode, kernel, "--suite", "quick")
        check(rc == 1, f"{mode}: exit {rc}, want 1")
        errors = [c for c in cases(junit) if results(c, Error)]
        labels = {json.dumps(v["case"]["problem"], sort_keys=True)
                  for v in report["verdicts"] if v["check"] == "kernel-error"}
        check(len(errors) == len(labels) > 0,
              f"{mode}: {len(errors)} <error> testcases, one per case ({len(labels)} cases)")
        check(not any(results(c, Failure) and c.classname == "kernel-error"
                      for c in cases(junit)), f"{mode}: a kernel error is never a <failure>")
        msgs = [results(c, Error)[0].message for c in errors]
        check(all(says in m for m in msgs), f"{mode}: every <error> message names '{says}'")
        check(all("Traceback" not in m and "\n" not in m for m in msgs),
              f"{mode}: the message is one line, not the whole stderr")
        check(report["first_failure"]["check"] == "kernel-error", f"{mode}: diagnosis kernel-error")
        check(sum(int(s.errors) for s in junit) == len(errors), f"{mode}: errors= counts them")


def test_cannot_start(work):
    rc, out, junit, report = run(work, "missing", "exec:/nonexistent/worker", "--suite", "quick")
    check(rc == 2, f"missing worker: exit {rc}, want 2")
    errors = [c for c in cases(junit) if results(c, Error)]
    check(len(errors) == 1 and "cannot start" in errors[0].result[0].message,
          "missing worker: the JUnit report holds one <error> with the cause")
    check(report["error"] and "cannot start" in report["error"] and not report["passed"],
          "missing worker: the JSON report says why the run did not finish")


def test_schema_rejects(work):
    good = {"schema_version": 1}
    check(validate_report.errors(SCHEMA, good) != [], "schema: an incomplete report is rejected")
    with open(os.path.join(work, "mutant.json"), encoding="utf-8") as f:
        report = json.load(f)
    bad = json.loads(json.dumps(report))
    bad["verdicts"][0]["margin"] = "inf"
    check(validate_report.errors(SCHEMA, bad) != [], "schema: a margin written as \"inf\" is rejected")
    bad = json.loads(json.dumps(report))
    bad["verdicts"][0]["worst"]["b"] = -1
    check(validate_report.errors(SCHEMA, bad) != [], "schema: a coordinate -1 (not null) is rejected")
    bad = json.loads(json.dumps(report))
    del bad["attest"]
    check(validate_report.errors(SCHEMA, bad) != [], "schema: a report without attest is rejected")


SCHEMA = validate_report.validator()
if SCHEMA is None:
    print("skip: jsonschema is not installed (tools/bootstrap puts it in build/venv)")
    sys.exit(77)
with tempfile.TemporaryDirectory() as work:
    test_failing_mutant(work)
    test_skipping_worker(work)
    test_crashing_workers(work)
    test_cannot_start(work)
    test_schema_rejects(work)
print(f"report_consumers_test: {'FAILED ' + str(len(FAILED)) if FAILED else 'all passed'}"
      f" (junitparser {junitparser.version})")
sys.exit(1 if FAILED else 0)
