#!/usr/bin/env bash
# `attest list suites --coverage --kernel K` end to end: the gate's listing for a built-in
# kernel says every claimed pair and boundary is reached (exit 0), JSON agrees, and bad
# usage is exit 2 naming the option.
# Usage: coverage_cli_test.sh ATTEST   (run from the repository root)
set -uo pipefail
attest="$1"
fail() { echo "FAIL: $*"; exit 1; }
out=$("$attest" list suites --coverage --kernel cpu/flash2-bf16 --suite gate) ||
  fail "listing exit $?"
grep -q "^suite gate: " <<<"$out" || fail "no gate line: $out"
grep -q "feature pairs: 44 of 44 reached" <<<"$out" || fail "pairs: $out"
grep -q "varlen x documents .*not combinable" <<<"$out" || fail "incompatible pair not named"
grep -q "^  Sq  *0 1 63 64 65 127 128 129  *all reached" <<<"$out" || fail "Sq boundaries: $out"
grep -q "^coverage complete" <<<"$out" || fail "not complete: $out"
! grep -q "MISSING" <<<"$out" || fail "something missing: $out"
# Every built-in kernel: the gate's listing shows every claimed pair and boundary reached.
for k in $("$attest" list kernels --json | python3 -c 'import json, sys
print(" ".join(k["name"] for k in json.load(sys.stdin)))'); do
  listing=$("$attest" list suites --coverage --kernel "$k" --suite gate) ||
    fail "$k: listing exit $?"
  grep -q "^coverage complete" <<<"$listing" || fail "$k: the gate's coverage is incomplete"
done
json=$("$attest" list suites --coverage --kernel cpu/mxfp8-cudnn --json) || fail "json exit $?"
python3 - "$json" <<'PY' || fail "JSON listing"
import json, sys
suites = {s["suite"]: s for s in json.loads(sys.argv[1])}
assert set(suites) == {"quick", "gate", "full", "long"}, suites.keys()
assert suites["gate"]["complete"] and suites["full"]["complete"]
assert not suites["quick"]["complete"]  # the quick suite does not promise coverage
d = {b["length"]: b for b in suites["gate"]["boundaries"]}["D"]
assert d["targets"] == [32, 64, 128] and d["missing"] == [], d
PY
"$attest" list suites --coverage > /dev/null 2>&1; rc=$?
[ "$rc" = 2 ] || fail "--coverage without --kernel: exit $rc, want 2"
"$attest" list kernels --coverage --kernel cpu/flash2-bf16 > /dev/null 2>&1; rc=$?
[ "$rc" = 2 ] || fail "--coverage with kernels: exit $rc, want 2"
"$attest" list suites --coverage --kernel cpu/nope > /dev/null 2>&1; rc=$?
[ "$rc" = 2 ] || fail "unknown kernel: exit $rc, want 2"
echo "coverage_cli_test: ok"
