#!/usr/bin/env bash
# oracle_cuda.sh — run on a CUDA GPU host from the repository root, with .devO/ carried along
# (tools/device/pack_oracle_cuda.sh made it on the build machine; nothing is built here):
#   1. oracle_cuda_check: the CUDA float64 oracle against the CPU oracle on every Problem
#      feature (reference/oracle/cuda/oracle_cuda_check.cc), must exit 0;
#   2. `attest oracle --device cuda` on reference/oracle/testdata/varlen_gqa_softcap.case.json
#      (the CLI path), and the CPU oracle's file beside it;
#   3. the bench: fwd+bwd at B = 1, H = 8, D = 128, S = 8k, 16k, 32k, full and causal, beside
#      cuBLAS dgemm (found in $ATTEST_CUBLAS, the CUDA toolkit or the Python packages).
# Logs and JSON go under $OUT (default ./oracle-cuda-out).
# Usage: tools/device/oracle_cuda.sh [--no-bench] [--sizes 8192,16384,32768]
# Exit status: 0 when the check passed, 1 when it failed, 2 on setup errors.
set -uo pipefail
out="${OUT:-$PWD/oracle-cuda-out}"
mkdir -p "$out"
bench=1
sizes=8192,16384,32768
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) bench=0 ;;
    --sizes) sizes="$2"; shift ;;
    *) echo "usage: tools/device/oracle_cuda.sh [--no-bench] [--sizes S1,S2,...]" >&2; exit 2 ;;
  esac
  shift
done
run=.devO/run.sh
if [ ! -x "$run" ]; then
  echo "no $run: run tools/device/pack_oracle_cuda.sh on the build machine" >&2
  exit 2
fi
echo "oracle_cuda.sh: $(date -u +%FT%TZ), OUT=$out"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi -L > "$out/nvidia-smi.txt" 2>&1
  cat "$out/nvidia-smi.txt"
fi

# cuBLAS for the bench's yardstick (the library's own search: libcublas.so.13, .12).
if [ -z "${ATTEST_CUBLAS:-}" ]; then
  dirs=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu)
  py="$(command -v python3 || true)"
  if [ -n "$py" ]; then
    while read -r d; do [ -n "$d" ] && dirs+=("$d"); done < <("$py" -c \
      'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null)
  fi
  for d in "${dirs[@]}"; do
    [ -d "$d" ] || continue
    found="$(find "$d/" -maxdepth 5 -name 'libcublas.so.1[0-9]*' 2>/dev/null | sort -r | head -1)"
    if [ -n "$found" ]; then
      export ATTEST_CUBLAS="$found"
      # shellcheck disable=SC2155  # dirname of a path that exists does not fail
      export LD_LIBRARY_PATH="$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      break
    fi
  done
fi
echo "cuBLAS: ${ATTEST_CUBLAS:-not found (then libcublas.so.13, .12 on the loader path)}"

echo "== 1. check"
t0=$(date +%s)
timeout 300 "$run" oracle_cuda_check --json "$out/oracle_cuda_check.json" \
  > "$out/oracle_cuda_check.txt" 2>&1
rc_check=$?
grep -E "FAIL|PASS|skipped|library:" "$out/oracle_cuda_check.txt" | tail -40
[ "$rc_check" -gt 1 ] && tail -5 "$out/oracle_cuda_check.txt"
echo "check: exit $rc_check in $(( $(date +%s) - t0 )) s (full log: $out/oracle_cuda_check.txt)"

echo "== 2. attest oracle --device cuda"
case_file=reference/oracle/testdata/varlen_gqa_softcap.case.json
timeout 60 "$run" attest oracle --case "$case_file" --out "$out/varlen_cuda.safetensors" \
  --device cuda > "$out/attest_oracle_cuda.txt" 2>&1
echo "attest oracle --device cuda: exit $? ($(tail -1 "$out/attest_oracle_cuda.txt"))"
# The CPU oracle's file beside it (the check above compares the numbers; this is the CLI path).
timeout 60 "$run" attest oracle --case "$case_file" --out "$out/varlen_cpu.safetensors" \
  > /dev/null 2>&1

if [ "$bench" = 1 ]; then
  echo "== 3. bench (sizes $sizes)"
  timeout 420 "$run" oracle_cuda_check --bench --sizes "$sizes" \
    --json "$out/oracle_cuda_bench.json" 2>&1 | tee "$out/oracle_cuda_bench.txt"
  echo "bench: exit ${PIPESTATUS[0]}"
fi
case "$rc_check" in
  0) exit 0 ;;
  1) exit 1 ;;
  *) exit 2 ;;
esac
