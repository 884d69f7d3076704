#!/usr/bin/env bash
# `attest check` and `attest repro` end to end (DESIGN.md "CLI contract"): exit codes 0 / 2,
# reports written, the same seed giving the same JSON, a saved case reproduced with --dump.
# Usage: check_cli_test.sh ATTEST_BINARY
set -u
attest="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. The quick suite passes a correct model; reports are written; same seed, same report.
"$attest" check --kernel cpu/flash2-bf16 --suite quick --seed 3 --json "$work/a.json" \
  --junit "$work/a.xml" --markdown "$work/a.md" --out "$work/fail" > "$work/out.txt"
rc=$?; [ $rc -eq 0 ] || { cat "$work/out.txt"; fail "quick suite exit $rc, want 0"; }
grep -q "^PASS accuracy" "$work/out.txt" || fail "no console line per verdict"
grep -q "margin" "$work/out.txt" || fail "console lines carry no margin"
for f in a.json a.xml a.md; do [ -s "$work/$f" ] || fail "$f not written"; done
grep -q '"skipped"' "$work/a.json" || fail "JSON has no skipped list"
"$attest" check --kernel cpu/flash2-bf16 --suite quick --seed 3 --json "$work/b.json" \
  --out "$work/fail" > /dev/null || fail "second run failed"
cmp -s "$work/a.json" "$work/b.json" || fail "same seed gave different JSON reports"
[ ! -e "$work/fail" ] || fail "a passing run wrote failure cases"

# 2. Usage errors exit 2: unknown kernel, unknown suite, unknown check, missing case file.
"$attest" check --kernel cpu/no-such-kernel > /dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "unknown kernel: exit $rc, want 2"
"$attest" check --kernel cpu/flash2-bf16 --suite nope > /dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "unknown suite: exit $rc, want 2"
"$attest" check --kernel cpu/flash2-bf16 --check nope > /dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "unknown check: exit $rc, want 2"
"$attest" repro --kernel cpu/flash2-bf16 --case "$work/missing.case.json" > /dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "missing case: exit $rc, want 2"

# 3. repro on a case file: the check named in the file name runs; --dump writes safetensors.
cat > "$work/cpu_flash2-bf16-permutation-o-0000.case.json" <<'CASE'
{"problem": {"batch": 2, "heads_q": 4, "heads_kv": 2, "seqlen_q": 33, "seqlen_k": 70,
 "head_dim": 64, "head_dim_v": 64, "dtype": "bf16", "scale": null, "causal": true,
 "causal_align": "bottom_right", "window": [-1, -1], "softcap": 0.0, "alibi_slopes": null,
 "cu_seqlens_q": null, "cu_seqlens_k": null},
 "generator": {"name": "gaussian", "seed": 11, "params": {}}}
CASE
"$attest" repro --kernel cpu/flash2-bf16 --case "$work/cpu_flash2-bf16-permutation-o-0000.case.json" \
  --dump "$work/dump" > "$work/repro.txt"; rc=$?
[ $rc -eq 0 ] || { cat "$work/repro.txt"; fail "repro exit $rc, want 0"; }
grep -q "^PASS permutation" "$work/repro.txt" || fail "repro did not run the check in the file name"
grep -q "^PASS accuracy" "$work/repro.txt" && fail "repro ran checks other than the named one"
for f in inputs oracle outputs; do
  [ -s "$work/dump/$f.safetensors" ] || fail "--dump did not write $f.safetensors"
done
"$attest" repro --kernel cpu/flash2-bf16 --case "$work/cpu_flash2-bf16-permutation-o-0000.case.json" \
  --check accuracy > "$work/repro2.txt" || fail "repro --check accuracy failed"
grep -q "^PASS accuracy" "$work/repro2.txt" || fail "--check did not select accuracy"
echo "check_cli_test: ok"
