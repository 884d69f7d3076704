#!/usr/bin/env bash
# --oracle-device end to end (docs/checks.md "The oracle on the GPU"), through the CUDA oracle
# compiled for CPU threads (reference/oracle/cuda/oracle_cuda_emulated.cc), which stands in for
# a GPU here: "auto" runs the oracle on the GPU for a kernel that declares CUDA tensors and
# says why not when it cannot; "cuda" without the library is an infrastructure error (exit 2);
# a report says where the oracle ran and validates against docs/report.schema.json; a GPU
# oracle gives the CPU oracle's verdicts (margins within 1e-6 of each other) and still fails a
# wrong kernel.
# Usage: oracle_device_cli_test.sh ATTEST EMULATED_LIBRARY PYTHON   (exit 77 = skipped)
set -uo pipefail
# The FMA path: the emulated tensor-core path costs 7x more here and is tested on its own
# (ctest oracle_cuda_emulated); this test is about where the oracle runs.
export ATTEST_ORACLE_CUDA_FMA=1
attest="$1"
emulated="$2"
python="$3"
"$python" -c 'import numpy' 2> /dev/null || { echo "skip: $python cannot import numpy"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
gpu_kernel="exec:$python tools/workers/numpy_worker.py --declare-device cuda"
run() {  # name env-library args... : runs attest check --suite quick --check accuracy
  local name="$1" lib="$2"; shift 2
  ATTEST_ORACLE_CUDA="$lib" "$attest" check --suite quick --check accuracy \
    --json "$tmp/$name.json" --out "$tmp/f-$name" "$@" > "$tmp/$name.log" 2> "$tmp/$name.err"
  echo $?
}
key() { "$python" -c "import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]))" "$@"; }

# 1. auto: a kernel declaring CUDA tensors gets the GPU oracle; the report says so.
rc=$(run auto "$emulated" --kernel "$gpu_kernel")
[ "$rc" = 0 ] || { cat "$tmp/auto.log" "$tmp/auto.err"; fail "auto on a cuda kernel: exit $rc"; }
[ "$(key "$tmp/auto.json" oracle_device)" = cuda ] || fail "auto did not use the GPU oracle"
grep -q '"device": "cuda"' "$tmp/auto.json" || fail "the report lacks the declared device"
"$python" verify/report/validate_report.py "$tmp/auto.json"; v=$?
[ $v = 0 ] || [ $v = 77 ] || fail "the report does not validate"

# 2. The same kernel on the CPU oracle: the same verdicts, margins within 1e-6.
rc=$(run cpu "$emulated" --kernel "$gpu_kernel" --oracle-device cpu)
[ "$rc" = 0 ] || fail "cpu oracle: exit $rc"
[ "$(key "$tmp/cpu.json" oracle_device)" = cpu ] || fail "--oracle-device cpu not reported"
"$python" - "$tmp/cpu.json" "$tmp/auto.json" <<'PY' || fail "CPU and GPU oracles disagree"
import json, sys
a, b = (json.load(open(f))["verdicts"] for f in sys.argv[1:])
assert len(a) == len(b) > 0, (len(a), len(b))
for x, y in zip(a, b):
    assert (x["check"], x["tensor"], x["pass"]) == (y["check"], y["tensor"], y["pass"]), (x, y)
    mx, my = x["margin"], y["margin"]
    assert (mx is None) == (my is None), (x, y)
    if mx is not None:
        assert abs(mx - my) <= 1e-6 * max(1.0, abs(mx)), (x["tensor"], mx, my)
PY

# 3. A wrong kernel fails against the GPU oracle (--oracle-device cuda on a host kernel).
rc=$(run mutant "$emulated" --kernel mutant/store-permutation --oracle-device cuda)
[ "$rc" = 1 ] || { cat "$tmp/mutant.log"; fail "mutant/store-permutation: exit $rc, want 1"; }
[ "$(key "$tmp/mutant.json" oracle_device)" = cuda ] || fail "mutant run not on the GPU oracle"
grep -q "^FAIL accuracy" "$tmp/mutant.log" || fail "no accuracy failure for the mutant"

# 4. cuda without the library: exit 2, naming what is missing; the report says why.
rc=$(run nolib /nonexistent/libattest_oracle_cuda.so --kernel cpu/flash2-bf16 \
     --oracle-device cuda)
[ "$rc" = 2 ] || fail "--oracle-device cuda without the library: exit $rc, want 2"
grep -q -- "--oracle-device cuda: .*cannot load libattest_oracle_cuda.so" "$tmp/nolib.err" \
  || { cat "$tmp/nolib.err"; fail "the error does not say the library is missing"; }

# 5. auto without the library: the CPU oracle, and a note that says why.
rc=$(run fallback /nonexistent/libattest_oracle_cuda.so --kernel "$gpu_kernel")
[ "$rc" = 0 ] || fail "auto without the library: exit $rc, want 0"
[ "$(key "$tmp/fallback.json" oracle_device)" = cpu ] || fail "auto fallback not reported"
grep -q "the float64 oracle runs on the CPU: .*cannot load" "$tmp/fallback.err" \
  || { cat "$tmp/fallback.err"; fail "no note saying why the oracle is on the CPU"; }

# 6. A host kernel under auto stays on the CPU and says nothing; a bad choice is exit 2.
rc=$(run host "$emulated" --kernel cpu/flash2-bf16)
[ "$rc" = 0 ] && [ "$(key "$tmp/host.json" oracle_device)" = cpu ] || fail "host kernel, auto"
grep -q "oracle" "$tmp/host.err" && fail "a note for a host kernel"
rc=$(run bad "$emulated" --kernel cpu/flash2-bf16 --oracle-device gpu)
[ "$rc" = 2 ] && grep -q "unknown oracle device 'gpu'" "$tmp/bad.err" || fail "bad choice"

# 7. repro --dump with the GPU oracle writes its oracle tensors.
case_file="$(ls "$tmp"/f-mutant/*.case.json | head -1)"
ATTEST_ORACLE_CUDA="$emulated" "$attest" repro --kernel mutant/store-permutation \
  --case "$case_file" --oracle-device cuda --dump "$tmp/dump" > "$tmp/repro.log" 2>&1
[ $? = 1 ] || { cat "$tmp/repro.log"; fail "repro with the GPU oracle: want exit 1"; }
[ -s "$tmp/dump/oracle.safetensors" ] || fail "repro --dump wrote no oracle tensors"
echo "oracle_device_cli_test: all passed"
