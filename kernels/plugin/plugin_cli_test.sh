#!/usr/bin/env bash
# `attest check` on plugin: kernels end to end (docs/design.md "External kernels", "CLI
# contract"): the host example passes through the loader; load errors exit 2 naming the
# library and symbol; a segfaulting or hanging plugin is a finding (exit 1) with its case
# files while the run goes on; a CUDA plugin without a GPU exits 2 cleanly.
# Usage: plugin_cli_test.sh ATTEST_BINARY PLUGIN_DIR [CUDA_PLUGIN]
set -u
attest="$1"
dir="$2"
cuda="${3:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
host="$dir/libattest_example_host.so"

# 1. The host example through the loader: the quick suite passes (plugin_suite_test runs the
# other dtypes and the mutants through the library API).
"$attest" check --kernel "plugin:$host:flash-bf16" --suite quick -v --out "$work/ok" > "$work/ok.txt" 2>&1
rc=$?; [ $rc -eq 0 ] || { cat "$work/ok.txt"; fail "quick suite exit $rc, want 0"; }
grep -q "^PASS accuracy" "$work/ok.txt" || fail "no PASS lines for the host plugin"

# 2. Load errors: exit 2, the message names the library and the symbol or field.
expect_load_error() {
  local spec="$1" part="$2"
  "$attest" check --kernel "plugin:$spec" --suite quick > "$work/err.txt" 2>&1; rc=$?
  [ $rc -eq 2 ] || { cat "$work/err.txt"; fail "$spec: exit $rc, want 2"; }
  grep -qF -- "$part" "$work/err.txt" || { cat "$work/err.txt"; fail "$spec: no '$part'"; }
}
expect_load_error "$dir/libattest_test_bad_version.so" "libattest_test_bad_version.so: attest_kernel_abi_version() returned 999"
expect_load_error "$dir/libattest_test_missing_get.so" "libattest_test_missing_get.so: missing symbol attest_kernel_get"
expect_load_error "$dir/libattest_test_bad_struct.so:abort" "struct_size is 48"
expect_load_error "$dir/no-such-plugin.so" "no-such-plugin.so: cannot load"
ATTEST_PLUGIN_TIMEOUT=abc "$attest" check --kernel "plugin:$host:flash-f32" > "$work/env.txt" 2>&1
[ $? -eq 2 ] || fail "a malformed ATTEST_PLUGIN_TIMEOUT must exit 2"

# 3. A segfaulting plugin: findings naming the signal, case files, the run completes.
"$attest" check --kernel "plugin:$dir/libattest_test_faulty.so:segfault" --suite quick \
  --out "$work/segv" > "$work/segv.txt" 2>&1; rc=$?
[ $rc -eq 1 ] || { cat "$work/segv.txt"; fail "segfault: exit $rc, want 1"; }
grep -q "signal 11" "$work/segv.txt" || { cat "$work/segv.txt"; fail "segfault not named"; }
grep -q "^FAIL: .* verdicts failed" "$work/segv.txt" || fail "the run did not complete after a segfault"
ls "$work/segv"/*.case.json > /dev/null 2>&1 || fail "no case file for the segfault"

# 4. A hanging plugin: killed after the timeout, a finding, the run goes on (accuracy rows
# only: each call waits out the timeout).
start=$(date +%s)
ATTEST_PLUGIN_TIMEOUT=0.3 "$attest" check --kernel "plugin:$dir/libattest_test_faulty.so:hang" \
  --suite quick --check accuracy --out "$work/hang" > "$work/hang.txt" 2>&1; rc=$?
[ $rc -eq 1 ] || { cat "$work/hang.txt"; fail "hang: exit $rc, want 1"; }
grep -q "no answer to forward within 0.3 s" "$work/hang.txt" || { cat "$work/hang.txt"; fail "hang not named"; }
[ $(( $(date +%s) - start )) -lt 60 ] || fail "the hang took too long to be cut"

# 5. The CUDA example on a machine without a GPU: exit 2 and a reason.
if [ -n "$cuda" ] && ! nvidia-smi -L > /dev/null 2>&1; then
  "$attest" check --kernel "plugin:$cuda:flash-bf16" --suite quick > "$work/cuda.txt" 2>&1; rc=$?
  [ $rc -eq 2 ] || { cat "$work/cuda.txt"; fail "CUDA plugin without a GPU: exit $rc, want 2"; }
  grep -Eq "no CUDA (device|runtime)" "$work/cuda.txt" || { cat "$work/cuda.txt"; fail "no reason"; }
fi
echo "plugin_cli_test: ok"
