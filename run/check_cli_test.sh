#!/usr/bin/env bash
# `attest check` and `attest repro` end to end (docs/design.md "CLI contract"): exit codes
# 0 / 1 / 2, the console (failures, summary table, verdict line last; -v every verdict;
# --quiet the line alone; progress lines on a non-terminal stderr), reports written and
# valid against docs/report.schema.json, the same seed giving the same JSON, a saved case
# reproduced with --dump.
# Usage: check_cli_test.sh ATTEST_BINARY [PYTHON]
set -u
attest="$1"
python="${2:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# JSON reports validate against the schema (verify/report/validate_report.py; 77: no jsonschema).
validate() {
  [ -n "$python" ] || { echo "note: no python, JSON reports not validated"; return; }
  "$python" verify/report/validate_report.py "$@"; local rc=$?
  [ $rc -eq 77 ] && { echo "note: $python has no jsonschema, JSON reports not validated"; return; }
  [ $rc -eq 0 ] || fail "JSON report(s) $* do not validate"
}

# 1. The quick suite passes a correct model; reports are written; same seed, same report.
"$attest" check --kernel cpu/flash2-bf16 --suite quick --seed 3 --json "$work/a.json" \
  --junit "$work/a.xml" --markdown "$work/a.md" --out "$work/fail" > "$work/out.txt" \
  2> "$work/err.txt"
rc=$?; [ $rc -eq 0 ] || { cat "$work/out.txt"; fail "quick suite exit $rc, want 0"; }
tail -1 "$work/out.txt" | grep -q "^PASS: 115 verdicts, none failed, from 11 checks on 7 cases" \
  || { tail -1 "$work/out.txt"; fail "the verdict line is not last or miscounts"; }
grep -q "^check  *verdicts  *failed  *o  *lse  *dq  *dk  *dv" "$work/out.txt" \
  || fail "no summary table"
grep -q "^accuracy  *26  *0 " "$work/out.txt" || fail "the table does not count accuracy's verdicts"
grep -q "^PASS accuracy" "$work/out.txt" && fail "a passing verdict printed without -v"
grep -Eq "^\[[0-9]+/20\] check cpu/flash2-bf16 quick: " "$work/err.txt" \
  || fail "no progress lines on a non-terminal stderr"
[ "$(grep -c "check cpu/flash2-bf16" "$work/err.txt")" -le 13 ] || fail "progress floods the log"
for f in a.json a.xml a.md; do [ -s "$work/$f" ] || fail "$f not written"; done
grep -q '"skipped"' "$work/a.json" || fail "JSON has no skipped list"
"$attest" check --kernel cpu/flash2-bf16 --suite quick --seed 3 --json "$work/b.json" \
  --out "$work/fail" -v > "$work/v.txt" 2> /dev/null || fail "second run failed"
cmp -s "$work/a.json" "$work/b.json" || fail "same seed gave different JSON reports"
[ ! -e "$work/fail" ] || fail "a passing run wrote failure cases"
grep -q "^PASS accuracy" "$work/v.txt" || fail "-v does not print every verdict"
grep -q "margin" "$work/v.txt" || fail "verdict lines carry no margin"
tail -1 "$work/v.txt" | grep -q "^PASS: " || fail "-v: the verdict line is not last"
"$attest" check --kernel cpu/flash2-bf16 --suite quick --seed 3 --quiet > "$work/q.txt" \
  2> "$work/qerr.txt" || fail "--quiet run failed"
[ "$(wc -l < "$work/q.txt")" -eq 1 ] && grep -q "^PASS: " "$work/q.txt" \
  || fail "--quiet prints more than the verdict line"
[ ! -s "$work/qerr.txt" ] || fail "--quiet still prints progress"

# 1b. A failing mutant: exit 1, the failures in full, the line counts verdicts and checks.
"$attest" check --kernel mutant/lse-log2 --suite quick --check accuracy --json "$work/m.json" \
  --out "$work/mfail" > "$work/m.txt" 2> /dev/null; rc=$?
[ $rc -eq 1 ] || fail "mutant: exit $rc, want 1"
grep -q "^FAIL accuracy *lse" "$work/m.txt" || fail "mutant: the failure is not printed"
grep -q "^     repro: attest repro --kernel mutant/lse-log2 --case " "$work/m.txt" \
  || fail "mutant: no repro line"
tail -1 "$work/m.txt" | grep -Eq "^FAIL: [0-9]+ of 20 verdicts failed, in 1 of 1 checks[;( ].*diagnosis: accuracy lse" \
  || { tail -1 "$work/m.txt"; fail "mutant: the verdict line miscounts"; }
# 1b'. A directed-rounding mutant: every error within its bound, the gate's bias rows fail it
# (verify/checks/bias.h); the JSON carries the bias figures of passing verdicts too.
"$attest" check --kernel mutant/o-rounded-toward-zero --suite gate --check bias \
  --json "$work/b.json" > "$work/b.txt" 2> /dev/null; rc=$?
[ $rc -eq 1 ] || fail "bias mutant: exit $rc, want 1"
tail -1 "$work/b.txt" | grep -q "diagnosis: bias o" \
  || { tail -1 "$work/b.txt"; fail "bias mutant: not diagnosed as bias of o"; }
grep -q 'mean signed error' "$work/b.json" || fail "bias mutant: no bias figures in the JSON"
validate "$work/a.json" "$work/m.json" "$work/b.json"

# 1c. Exit 2 still writes the reports asked for, saying why.
"$attest" check --kernel cpu/no-such-kernel --json "$work/e.json" --junit "$work/e.xml" \
  > /dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "unknown kernel: exit $rc, want 2"
grep -q '"error": ".*no-such-kernel' "$work/e.json" || fail "exit 2: the JSON report has no error"
grep -q '<error message=".*no-such-kernel' "$work/e.xml" || fail "exit 2: the JUnit has no <error>"
validate "$work/e.json"

# 2. Usage errors exit 2: unknown kernel, unknown suite, unknown check, missing case file.
"$attest" check --kernel cpu/no-such-kernel > /dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "unknown kernel: exit $rc, want 2"
"$attest" check --kernel cpu/flash2-bf16 --suite nope > /dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "unknown suite: exit $rc, want 2"
"$attest" check --kernel cpu/flash2-bf16 --check nope > /dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "unknown check: exit $rc, want 2"
# The three typos of a new user each get a suggestion, and a parse error names the command and
# its usage line.
"$attest" check --kernel flash2-bf16 2> "$work/typo1.txt"; rc=$?
[ $rc -eq 2 ] && grep -q "did you mean 'cpu/flash2-bf16'" "$work/typo1.txt" \
  || { cat "$work/typo1.txt"; fail "unknown kernel: no suggestion"; }
"$attest" check --kernel cpu/flash2-bf16 gate --sute 2> "$work/typo2.txt"; rc=$?
[ $rc -eq 2 ] && grep -q "^attest check: .*--sute.*did you mean '--suite'" "$work/typo2.txt" \
  && grep -q "^usage: attest check --kernel" "$work/typo2.txt" \
  || { cat "$work/typo2.txt"; fail "unexpected option: no command, suggestion or usage line"; }
"$attest" check --kernel cpu/flash2-bf16 --check acuracy 2> "$work/typo3.txt"; rc=$?
[ $rc -eq 2 ] && grep -q "did you mean 'accuracy'" "$work/typo3.txt" \
  || { cat "$work/typo3.txt"; fail "unknown check: no suggestion"; }
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
