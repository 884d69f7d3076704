#!/usr/bin/env bash
# oracle_e2e.sh — run on a GPU host's CPU from the repository root, with .devF/ carried (made by
# PACK_EXTRA=bench/oracle_bench tools/device/pack_cudnn_fp8.sh): `bench/oracle_bench.py --e2e`
# (`attest oracle` end to end beside the bare fwd+bwd call and NumPy float64, docs/bench-oracle.md)
# on this host's CPU, whose ISA (AVX-512 or not) the table's header names. Pin it with taskset to
# keep it off cores that other work uses. Writes $OUT/oracle-e2e.md and the CPU's description.
# Environment: PYTHON (default python3, with NumPy).
# Usage: [taskset -c 14,15] tools/device/oracle_e2e.sh [--threads 2] [--reps 3]
set -euo pipefail
out="${OUT:-$PWD/oracle-e2e-out}"
mkdir -p "$out"
dir="$(mktemp -d)"
LD_LIBRARY_PATH=.devF/bin .devF/bin/zstd -d -q -c .devF/attest-device.tar.zst | tar -C "$dir" -xf -
dev="$dir/.device"
# The packed programs run directly (no wrapper process inside the timed CLI runs): the first
# library route of .device/attest.sh that works here.
for extra in "" ":$dev/compat"; do
  if LD_LIBRARY_PATH="$dev/lib$extra" "$dev/attest" list kernels > /dev/null 2>&1; then
    export LD_LIBRARY_PATH="$dev/lib:$dev/extra-lib$extra"
    break
  fi
done
[ -n "${LD_LIBRARY_PATH:-}" ] ||
  { echo "oracle_e2e.sh: the packed attest does not run" >&2; exit 2; }
{ lscpu | grep -E 'Model name|^CPU\(s\)|Flags' | sed -E 's/(Flags:).*/\1 (avx512 flags below)/'
  grep -o -w -E 'avx512[a-z_0-9]*|avx2|fma' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  echo "cores this process may use: $(nproc)"
  "${PYTHON:-python3}" -c 'import numpy; print("numpy", numpy.__version__)'; } | tee "$out/cpu.txt"
"${PYTHON:-python3}" bench/oracle_bench.py --e2e --bench "$dev/oracle_bench" \
  --attest "$dev/attest" \
  "$@" --out "$out/oracle-e2e.md"
rm -rf "$dir"
