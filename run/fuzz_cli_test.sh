#!/usr/bin/env bash
# `attest fuzz` end to end (docs/fuzz.md): exit 1 and a <check>-<hash>.case.json on a
# mutant, identical files for the same seed, `attest repro` on the written case exits 1 with
# the same verdict, exit 0 when nothing fails, exit 2 on usage errors, shards + --merge.
# Usage: fuzz_cli_test.sh path/to/attest
set -u
ATTEST=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

expect_rc() {  # expect_rc WANT CMD...
  local want=$1; shift
  "$@" > "$TMP/out.txt" 2> "$TMP/err.txt"
  local rc=$?
  [[ $rc == "$want" ]] || { cat "$TMP/out.txt" "$TMP/err.txt"; fail "'$*' exited $rc, expected $want"; }
}

# 1. A mutant: exit 1, one shrunk case file, a repro line naming it.
expect_rc 1 "$ATTEST" fuzz --kernel mutant/causal-top-left --baseline cpu/flash2-bf16 --seed 3 --cases 200 --check accuracy --out "$TMP/a"
grep -q '^attest repro --kernel mutant/causal-top-left --case .*accuracy-[0-9a-f]\{12\}\.case\.json --check accuracy$' "$TMP/out.txt" \
  || { cat "$TMP/out.txt"; fail "no repro line"; }
ls "$TMP/a"/accuracy-*.case.json > /dev/null || fail "no case file written"
[[ -f "$TMP/a/fuzz-report.json" ]] || fail "no fuzz-report.json"
# Not a terminal here: plain progress lines, no carriage returns.
grep -q $'\r' "$TMP/err.txt" && fail "progress bar drawn on a non-terminal"

# 2. The same seed writes identical case files.
expect_rc 1 "$ATTEST" fuzz --kernel mutant/causal-top-left --baseline cpu/flash2-bf16 --seed 3 --cases 200 --check accuracy --out "$TMP/b" --quiet
diff -r --exclude=fuzz-report.json "$TMP/a" "$TMP/b" || fail "same seed, different case files"

# 3. attest repro on the written case: exit 1, the same first failing check and tensor; the
# parent passes it (exit 0).
CASE=$(ls "$TMP/a"/accuracy-*.case.json)
expect_rc 1 "$ATTEST" repro --kernel mutant/causal-top-left --case "$CASE" --check accuracy
grep -q '^FAIL accuracy' "$TMP/out.txt" || { cat "$TMP/out.txt"; fail "repro verdict differs"; }
TENSOR=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['failures'][0]['tensor'])" "$TMP/a/fuzz-report.json")
grep -q "; diagnosis: accuracy $TENSOR margin" "$TMP/out.txt" \
  || { cat "$TMP/out.txt"; fail "repro diagnosis is not accuracy $TENSOR"; }

expect_rc 0 "$ATTEST" repro --kernel cpu/flash2-bf16 --case "$CASE" --check accuracy
# Without --check, repro reads the check from the file name (<check>-<hash>.case.json).
expect_rc 1 "$ATTEST" repro --kernel mutant/causal-top-left --case "$CASE"
grep -q "; diagnosis: accuracy $TENSOR margin" "$TMP/out.txt" \
  || { cat "$TMP/out.txt"; fail "repro without --check: diagnosis is not accuracy $TENSOR"; }

# 4. Nothing fails: exit 0 (a correct model on a check family without open findings).
expect_rc 0 "$ATTEST" fuzz --kernel cpu/flash2-bf16 --seed 1 --cases 12 --check unwritten-outputs --check gqa-mha --quiet

# 5. Shards cover the cases disjointly; --merge adds them up and reports missing shards.
for i in 0 1 2; do
  expect_rc 0 "$ATTEST" fuzz --kernel cpu/flash2-bf16 --seed 4 --cases 9 --shard $i/3 --check unwritten-outputs --out "$TMP/s$i" --quiet
done
expect_rc 0 "$ATTEST" fuzz --merge "$TMP/s0" "$TMP/s1" "$TMP/s2"
grep -q '^merged 3 shard report(s) of cpu/flash2-bf16 (seed 4): 9 cases, 0 failure(s)$' "$TMP/out.txt" \
  || { cat "$TMP/out.txt"; fail "merge summary"; }
expect_rc 0 "$ATTEST" fuzz --merge "$TMP/s0" "$TMP/s2"
grep -q '^missing shards: \[1\]$' "$TMP/out.txt" || { cat "$TMP/out.txt"; fail "missing shard not reported"; }
expect_rc 1 "$ATTEST" fuzz --merge "$TMP/a"

# 6. Usage errors: exit 2.
expect_rc 2 "$ATTEST" fuzz --kernel cpu/flash2-bf16 --seed 1
expect_rc 2 "$ATTEST" fuzz --kernel cpu/flash2-bf16 --cases 3 --time 1
expect_rc 2 "$ATTEST" fuzz --kernel cpu/flash2-bf16 --cases 3 --shard 3/3
expect_rc 2 "$ATTEST" fuzz --kernel cpu/flash2-bf16 --cases 3 --shard x
expect_rc 2 "$ATTEST" fuzz --kernel cpu/no-such --cases 3
expect_rc 2 "$ATTEST" fuzz --kernel cpu/flash2-bf16 --baseline cpu/no-such --cases 3
expect_rc 2 "$ATTEST" fuzz --kernel cpu/flash2-bf16 --cases 3 --check acuracy
expect_rc 2 "$ATTEST" fuzz --merge "$TMP/s0" "$TMP/s0"
expect_rc 2 "$ATTEST" fuzz --merge "$TMP/nope"
echo "fuzz_cli_test: all passed"
