#!/usr/bin/env bash
# End-to-end test of `attest compare` (tools/attest/cmd_compare.cc): the oracle's own f64
# outputs pass (exit 0) and write JSON/JUnit/Markdown reports; the same outputs converted to
# bf16 fail on lse only (a bf16 lse is far less accurate than any fp32 kernel's) with exit 1
# and a repro line; bad input exits 2.
# Usage: compare_cli_test.sh ATTEST_BINARY [XMLLINT] [PYTHON]
set -u
attest=$1
xmllint=${2:-}
python=${3:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cat > "$dir/c.case.json" <<'JSON'
{
  "problem": {
    "batch": 2, "heads_q": 4, "heads_kv": 2, "seqlen_q": 24, "seqlen_k": 40,
    "head_dim": 32, "head_dim_v": 32, "dtype": "bf16", "scale": null,
    "causal": true, "causal_align": "bottom_right", "window": [-1, -1],
    "softcap": 0.0, "alibi_slopes": null, "cu_seqlens_q": null, "cu_seqlens_k": null
  },
  "generator": {"name": "gaussian", "seed": 99, "params": {}}
}
JSON

"$attest" oracle --case "$dir/c.case.json" --out "$dir/ref.safetensors" --quiet ||
  fail "attest oracle exited $?"

"$attest" compare --case "$dir/c.case.json" --outputs "$dir/ref.safetensors" \
  --json "$dir/r.json" --junit "$dir/r.xml" --markdown "$dir/r.md" > "$dir/out.txt"
rc=$?
cat "$dir/out.txt"
[ $rc -eq 0 ] || fail "exact outputs: exit $rc, expected 0"
grep -q '^PASS accuracy dq' "$dir/out.txt" || fail "no PASS line for dq"
grep -q '"passed": true' "$dir/r.json" || fail "JSON report does not say passed"
# The JSON report validates against docs/report.schema.json (77: no jsonschema).
if [ -n "$python" ]; then
  "$python" verify/report/validate_report.py "$dir/r.json"; rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || fail "the JSON report does not validate"
fi
grep -q '^| PASS | accuracy | o |' "$dir/r.md" || fail "Markdown report lacks the o row"
if [ -n "$xmllint" ]; then
  "$xmllint" --noout --schema "$(dirname "$0")/../verify/report/testdata/junit.xsd" "$dir/r.xml" ||
    fail "JUnit report does not validate"
fi

"$attest" convert --to bf16 --in "$dir/ref.safetensors" --out "$dir/bf16.safetensors" --quiet ||
  fail "attest convert exited $?"
"$attest" compare --case "$dir/c.case.json" --outputs "$dir/bf16.safetensors" > "$dir/out2.txt"
rc=$?
cat "$dir/out2.txt"
[ $rc -eq 1 ] || fail "bf16 lse: exit $rc, expected 1"
grep -q '^FAIL accuracy lse' "$dir/out2.txt" || fail "lse did not fail"
grep -q '^PASS accuracy o ' "$dir/out2.txt" || fail "bf16 o did not pass"
grep -q 'repro: attest compare --case' "$dir/out2.txt" || fail "no repro line"

"$attest" compare --case "$dir/c.case.json" --outputs "$dir/missing.safetensors" 2> "$dir/err.txt"
rc=$?
[ $rc -eq 2 ] || fail "missing outputs: exit $rc, expected 2"
"$attest" compare --case "$dir/c.case.json" --outputs "$dir/ref.safetensors" --profile nope \
  2> "$dir/err.txt"
rc=$?
[ $rc -eq 2 ] || fail "unknown profile: exit $rc, expected 2"
grep -q "unknown profile 'nope'" "$dir/err.txt" || fail "unknown profile message"
echo "compare_cli_test: OK"
