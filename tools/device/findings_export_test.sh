#!/usr/bin/env bash
# ctest findings_export_dry: tools/device/findings_export.sh on a CPU, run from the repository
# root with the fixture pages of tools/device/testdata/findings-dry/ (a GQA dv finding of
# PyTorch's CPU flash backward, checked as gqa-mha: repro.py exits 1; a kernel error of the CPU
# flash op on Sq = 0, which kills the process with SIGFPE on x86: repro.py dies of it too):
# the summary JSON and table, the exit statuses; then a per-run timeout that kills attest and
# the worker it started in a process group of its own (a worker that hangs; without the kill of
# its group it outlives the run, which this test catches), and a budget that starts nothing.
# Usage: findings_export_test.sh ATTEST PYTHON (PYTHON has torch; 77 where it has not).
set -uo pipefail
attest="$1" py="$2"
"$py" -c "import torch" 2> /dev/null || { echo "skipped: torch is not importable"; exit 77; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; cat "$work"/out*/findings-export.txt 2> /dev/null; exit 1; }
# torch_campaign.sh's environment: python3 is the one with torch.
export PATH="$(dirname "$py"):$PATH"
fixture=tools/device/testdata/findings-dry
STASH="$work/stash" ATTEST="$attest" OUT="$work/out" REPRO_PYTHON="$py" JOBS=2 \
  CALL_SECONDS=400 tools/device/findings_export.sh --backends sdpa --device cpu \
  --findings "$fixture" || fail "findings_export.sh exited $?"
"$py" - "$work/out/findings-export.json" <<'PY' || fail "summary"
import json, sys
r = {c["finding"]: c for c in json.load(open(sys.argv[1]))["cases"]}
assert set(r) == {"D1", "D2"}, r.keys()
d1, d2 = r["D1"], r["D2"]
assert d1["attest_exit"] == 1 and d1["export"] == "repro.py" and d1["repro_exit"] == 1, d1
assert d1["check"] == "gqa-mha" and "--device cpu" in d1["kernel"], d1
assert d1["repro_environment"].startswith("python ") and "torch" in d1["repro_environment"], d1
assert d1["repro_verdict"] == "FINDING REPRODUCES", d1
assert d2["attest_exit"] == 1 and d2["export"] == "repro.py", d2
assert d2["repro_exit"] in (1, -8), d2  # the exception, or SIGFPE as attest saw it
print("ok   D1 repro.py exits 1, D2", d2["repro_exit"])
PY
grep -q "^D1 .*gqa-dv.* 1 *repro.py *1 " "$work/out/findings-export.txt" || fail "table row D1"
[ -s "$work/out/findings-export.tar.gz" ] || fail "no findings-export.tar.gz"
# A per-run timeout kills attest and its worker (which attest starts in a process group of its
# own: faulty_worker.py --mode hang sleeps forever in its first forward); no budget starts
# nothing.
"$py" tools/device/findings_export.py --backends faulty_worker.py --device cpu \
  --attest "$attest" --out "$work/out2" --findings "$fixture" --run-timeout 5 \
  --worker-python "$py" > /dev/null || fail "timeout run"
grep -q '"attest_exit": "timeout"' "$work/out2/findings-export.json" || fail "no timeout recorded"
grep -q '"finding": "D[12]"' "$work/out2/findings-export.json" && fail "the filter let others in"
sleep 1
for d in /proc/[0-9]*; do
  [ "$(readlink "$d/cwd" 2> /dev/null)" = "$(pwd -P)" ] || continue
  tr '\0' ' ' < "$d/cmdline" 2> /dev/null | grep -q "faulty_worker.py --mode hang" &&
    fail "a worker outlived its timeout: $(tr '\0' ' ' < "$d/cmdline")"
done
"$py" tools/device/findings_export.py --backends sdpa --device cpu --attest "$attest" \
  --out "$work/out3" --findings "$fixture" --call-seconds 0 --worker-python "$py" \
  > /dev/null || fail "budget run"
[ "$(grep -c '"attest_exit": "not run (budget)"' "$work/out3/findings-export.json")" = 2 ] ||
  fail "a run started past the budget"
echo "findings_export_dry: ok"
