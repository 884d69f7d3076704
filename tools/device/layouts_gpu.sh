#!/usr/bin/env bash
# layouts_gpu.sh — run on a CUDA host from the repository root, after tools/device/pack.sh ran on
# the build machine and .device/ was carried along: the `layouts` check (verify/checks/
# layouts.h) of the gate on PyTorch's public SDPA backends through tools/workers/torch_worker.py,
# which hands each kernel the views the check makes as views on the GPU (docs/protocol.md
# "Views": torch.as_strided of the storage moved to the device). Correct kernels must pass;
# the worker declares "any" for sdpa-math and "inner" (last dimension contiguous) for the
# fused backends.
# $OUT (default ./layouts-out) gets layouts-<backend>-<dtype>.{log,json} and a summary.
# Usage: tools/device/layouts_gpu.sh   Environment: RUNS (default "sdpa-math:bf16
#   sdpa-flash:bf16 sdpa-efficient:bf16 sdpa-cudnn:bf16 fa4:bf16" without fa4 where
#   flash_attn is not importable), ATTEST (default .device/attest.sh), PYTHON (python3).
set -uo pipefail
out="${OUT:-$PWD/layouts-out}"
mkdir -p "$out"
attest="${ATTEST:-.device/attest.sh}"
python="$(command -v "${PYTHON:-python3}")"
runs="${RUNS:-sdpa-math:bf16 sdpa-flash:bf16 sdpa-efficient:bf16 sdpa-cudnn:bf16}"
for r in $runs; do
  IFS=: read -r b d <<< "$r"
  ( timeout 300 "$attest" check --kernel "exec:$python tools/workers/torch_worker.py --backend $b --dtype $d --device cuda" \
      --suite gate --check layouts --threads 2 --json "$out/layouts-$b-$d.json" \
      --out "$out/failures-$b-$d" > "$out/layouts-$b-$d.log" 2>&1
    echo "$?" > "$out/layouts-$b-$d.rc" ) &
done
wait
for r in $runs; do
  IFS=: read -r b d <<< "$r"
  echo "$b $d: exit $(cat "$out/layouts-$b-$d.rc"): $(tail -1 "$out/layouts-$b-$d.log")"
done | tee "$out/summary.txt"
