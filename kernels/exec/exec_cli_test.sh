#!/usr/bin/env bash
# End-to-end test of the exec protocol through the CLI (the exec protocol
# tested end to end on the NumPy worker): `attest check --suite quick` passes on the NumPy
# worker, and a worker that crashes mid-call gives findings (exit 1) naming the signal and a
# repro line, never an infrastructure failure (exit 2) or a dead harness.
# Usage: exec_cli_test.sh ATTEST PYTHON   (run from the repository root; exit 77 = skipped)
set -uo pipefail
attest="$1"
python="$2"
"$python" -c 'import numpy' 2> /dev/null || { echo "skip: $python cannot import numpy"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. The NumPy worker passes the quick suite; the JSON report names the kernel.
kernel="exec:$python tools/workers/numpy_worker.py"
"$attest" check --kernel "$kernel" --suite quick --json "$tmp/quick.json" --out "$tmp/f1" \
  > "$tmp/quick.log" 2>&1
rc=$?
[ "$rc" = 0 ] || { cat "$tmp/quick.log"; fail "numpy worker: quick suite exit $rc, want 0"; }
grep -q 'numpy_worker.py' "$tmp/quick.json" || fail "the JSON report does not name the kernel"
"$python" verify/report/validate_report.py "$tmp/quick.json"; rc=$?  # docs/report.schema.json
[ "$rc" = 0 ] || [ "$rc" = 77 ] || fail "the JSON report does not validate"
echo "ok: numpy worker passes the quick suite ($(tail -1 "$tmp/quick.log"))"

# 2. A worker that segfaults on every forward: findings with the signal, a repro line, exit 1.
kernel="exec:$python tools/workers/faulty_worker.py --mode crash"
"$attest" check --kernel "$kernel" --suite quick --out "$tmp/f2" > "$tmp/crash.log" 2>&1
rc=$?
[ "$rc" = 1 ] || { tail -20 "$tmp/crash.log"; fail "crashing worker: exit $rc, want 1"; }
grep -q 'killed by signal SIGSEGV (11)' "$tmp/crash.log" || fail "the signal is not named"
grep -q "repro: attest repro --kernel 'exec:" "$tmp/crash.log" || fail "no repro line"
ls "$tmp"/f2/*.case.json > /dev/null 2>&1 || fail "no case file written for the crash"
echo "ok: a crashing worker is a finding (exit 1) naming SIGSEGV"

# 3. A worker that does not start: an infrastructure error (exit 2) naming the cause.
"$attest" check --kernel "exec:/nonexistent/worker" --suite quick > "$tmp/missing.log" 2>&1
rc=$?
[ "$rc" = 2 ] || fail "missing worker: exit $rc, want 2"
grep -q "cannot start '/nonexistent/worker'" "$tmp/missing.log" || fail "cause not named"
echo "ok: a worker that cannot start is exit 2 with its cause"

# 4. A worker whose API returns no lse and says so ("lse": false) passes the quick suite with
#    o and the gradients judged and no lse verdict; one that omits lse while claiming it fails,
#    unwritten-outputs first.
kernel="exec:$python tools/workers/numpy_worker.py --no-lse"
"$attest" check --kernel "$kernel" --suite quick --json "$tmp/nolse.json" --out "$tmp/f4" \
  > "$tmp/nolse.log" 2>&1
rc=$?
[ "$rc" = 0 ] || { tail -20 "$tmp/nolse.log"; fail "--no-lse worker: quick suite exit $rc, want 0"; }
"$python" - "$tmp/nolse.json" <<'PY' || fail "--no-lse worker: wrong verdicts in the report"
import json, sys
verdicts = json.load(open(sys.argv[1]))["verdicts"]
tensors = {(v["check"], v["tensor"]) for v in verdicts}
assert not any(t == "lse" for _, t in tensors), "an lse verdict for a kernel without lse"
for need in [("accuracy", "o"), ("accuracy", "dq"), ("special-values", "o"),
             ("consistency", "dk"), ("non-interference", "o")]:
    assert need in tensors, f"no {need} verdict"
PY
echo "ok: a worker declaring \"lse\": false passes the quick suite, judged on o and gradients"
kernel="exec:$python tools/workers/numpy_worker.py --omit-lse"
"$attest" check --kernel "$kernel" --suite quick --json "$tmp/omit.json" --out "$tmp/f5" \
  > "$tmp/omit.log" 2>&1
rc=$?
[ "$rc" = 1 ] || { tail -20 "$tmp/omit.log"; fail "--omit-lse worker: exit $rc, want 1"; }
# The exec client refuses an outputs file without the claimed lse (a protocol error of the
# worker), so the case's diagnosis is kernel-error, naming the missing tensor.
"$python" - "$tmp/omit.json" <<'PY' || fail "--omit-lse worker: not diagnosed as a kernel error naming lse"
import json, sys
failed = [v for v in json.load(open(sys.argv[1]))["verdicts"] if not v["pass"]]
assert failed and failed[0]["check"] == "kernel-error", failed[:1]
assert "'lse' missing" in failed[0]["message"], failed[0]["message"]
PY
echo "ok: a worker omitting the lse it claims fails, kernel-error first, naming lse"
# Views (docs/protocol.md "Views"): a worker that declares "strides": "any" is handed the
# layouts check's views through the protocol, and passes; one that reads them as if they were
# contiguous fails the check (so the views do reach it: the check is not vacuous).
"$attest" check --kernel "exec:$python tools/workers/numpy_worker.py" --suite gate \
  --check layouts > "$tmp/views.log" 2>&1 || { tail -20 "$tmp/views.log"; fail "views: the NumPy worker fails the layouts check"; }
grep -q "^PASS: [1-9][0-9]* verdicts, none failed, from 1 checks" "$tmp/views.log" \
  || { tail -3 "$tmp/views.log"; fail "views: no layouts verdicts for the NumPy worker"; }
"$attest" check --kernel "exec:$python tools/workers/faulty_worker.py --mode strides-ignored" \
  --suite gate --check layouts --out "$tmp/f6" > "$tmp/views2.log" 2>&1
rc=$?
[ "$rc" = 1 ] || { tail -20 "$tmp/views2.log"; fail "views: a worker ignoring strides: exit $rc, want 1"; }
grep -q "diagnosis: layouts" "$tmp/views2.log" \
  || { tail -3 "$tmp/views2.log"; fail "views: a worker ignoring strides is not diagnosed by layouts"; }
echo "ok: views reach an exec worker; one that ignores their strides fails the layouts check"
echo "exec_cli_test: 6 passed, 0 failed"
