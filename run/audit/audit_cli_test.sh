#!/usr/bin/env bash
# `attest audit` end to end (docs/audit.md; docs/design.md "CLI contract"): exit 2 on usage errors
# (no kernel, --kernel with --compare, unknown kernel / baseline / distribution), reports
# written with exit 0 or 1 otherwise, --compare renders every kernel, a forward-only kernel
# audits without gradient charts, plain progress lines when stderr is not a terminal.
# Usage: audit_cli_test.sh ATTEST
set -u
attest=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
expect_rc() {  # expect_rc WANT DESCRIPTION -- COMMAND...
  local want=$1 what=$2
  shift 3
  "$@" >"$dir/out" 2>"$dir/err"
  local rc=$?
  if [[ " $want " != *" $rc "* ]]; then
    echo "FAIL: $what: exit $rc, want $want"; cat "$dir/out" "$dir/err"; fail=1
  fi
}
expect_rc 2 "no kernel" -- "$attest" audit --out "$dir/a"
expect_rc 2 "--kernel with --compare" -- "$attest" audit --kernel cpu/flash2-bf16 --compare cpu/mxfp8-cudnn --out "$dir/a"
expect_rc 2 "unknown kernel" -- "$attest" audit --kernel cpu/no-such --out "$dir/a"
expect_rc 2 "unknown baseline" -- "$attest" audit --kernel cpu/flash2-bf16 --baseline cpu/no-such --quick --out "$dir/a"
expect_rc 2 "unknown distribution" -- "$attest" audit --kernel cpu/flash2-bf16 --quick --distributions gaussian,no-such --out "$dir/a"
grep -q "'no-such'" "$dir/err" || { echo "FAIL: the error does not name the distribution"; fail=1; }

# Side by side: a leaking and a leak-free model; exit 1 (the cudnn model leaks).
expect_rc 1 "compare" -- "$attest" audit --compare cpu/mxfp8-cudnn cpu/mxfp8-pvbf16 --quick --distributions gaussian,heavy-tail --out "$dir/cmp"
for f in report.html report.md report.json; do
  [[ -s "$dir/cmp/$f" ]] || { echo "FAIL: compare wrote no $f"; fail=1; }
done
grep -Eq "^\[[0-9]+/[0-9]+\] audit " "$dir/err" || { echo "FAIL: no plain progress lines on a non-terminal"; fail=1; }
grep -q "plot-leak-cpu-mxfp8-pvbf16-o" "$dir/cmp/report.html" || { echo "FAIL: compare lacks the second kernel's maps"; fail=1; }
grep -q "LEAKS" "$dir/out" && grep -q "PASS cpu/mxfp8-pvbf16\|FAIL cpu/mxfp8-pvbf16" "$dir/out" \
  || { echo "FAIL: console summary"; cat "$dir/out"; fail=1; }
ls "$dir"/cmp/cpu_mxfp8-cudnn-non-interference-*.case.json >/dev/null 2>&1 \
  || { echo "FAIL: smallest leaking case not written"; fail=1; }

# A forward-only kernel: o only, no gradient charts, the reports still written.
expect_rc "0 1" "forward-only kernel" -- "$attest" audit --kernel cpu/fp8-e4m3-tensor --quick --distributions gaussian --out "$dir/fwd"
grep -q 'id="plot-seqlen-o"' "$dir/fwd/report.html" || { echo "FAIL: forward-only report lacks o"; fail=1; }
if grep -q 'id="plot-seqlen-dq"' "$dir/fwd/report.html"; then echo "FAIL: forward-only report draws dq"; fail=1; fi

[[ $fail == 0 ]] && echo "audit_cli_test: all passed"
exit $fail
