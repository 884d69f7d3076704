#!/usr/bin/env bash
# gate_oracle_gpu.sh — run on a CUDA host from the repository root, with .devO/ carried along
# (tools/device/pack_oracle_cuda.sh): the gate suite's accuracy rows through the harness, judged
# once by the GPU oracle and once by the CPU oracle, for
#   - correct kernels: tools/workers/numpy_worker.py declaring its tensors on cuda (so that
#     --oracle-device auto picks the GPU oracle, as for a GPU kernel) and the built-in CPU models
#     cpu/flash2-bf16 and cpu/mxfp8-pvbf16 (--oracle-device cuda): every row must pass with
#     either oracle;
#   - mutants (mutant/store-permutation, mutant/lse-log2, mutant/gqa-h-mod-hkv): must fail with
#     either oracle;
# then compares the two runs row by row: the same verdicts, and how far each row's observed error
# moved between the two references (the largest relative change is printed).
# Everything goes into $OUT/${NAME:-gate-oracle}.tgz. Exit 0 when every verdict is as expected
# and the two oracles agree, 1 otherwise.
set -uo pipefail
dest="${OUT:-$PWD/gate-oracle-gpu}"
name="${NAME:-gate-oracle}"
out="$dest/$name"
mkdir -p "$out"
trap 'tar czf "$dest/$name.tgz" -C "$dest" "$name" && rm -rf "$out"' EXIT
run=.devO/run.sh
export ATTEST_ORACLE_CUDA="${ATTEST_ORACLE_CUDA:-$PWD/.devO/libattest_oracle_cuda.so}"
status=0
check() {  # check LABEL EXPECTED_EXIT ORACLE KERNEL
  local label=$1 want=$2 oracle=$3 kernel=$4
  local t0=$SECONDS
  timeout "${GATE_TIMEOUT:-300}" "$run" attest check --suite gate --check accuracy \
    --threads "${THREADS:-0}" --kernel "$kernel" --oracle-device "$oracle" \
    --json "$out/$label-$oracle.json" > "$out/$label-$oracle.txt" 2>&1
  local rc=$?
  local verdict=ok
  [ "$rc" = "$want" ] || { verdict=UNEXPECTED; status=1; }
  echo "$label oracle=$oracle: exit $rc (want $want) $verdict, $((SECONDS - t0)) s"
  tail -2 "$out/$label-$oracle.txt" | cut -c1-200
}
worker="exec:python3 tools/workers/numpy_worker.py --declare-device cuda"
for oracle in auto cpu; do check numpy-cuda 0 "$oracle" "$worker"; done
for k in ${MODELS:-cpu/flash2-bf16 cpu/mxfp8-pvbf16}; do
  for oracle in cuda cpu; do check "${k//\//_}" 0 "$oracle" "$k"; done
done
for k in ${MUTANTS:-mutant/store-permutation mutant/lse-log2 mutant/gqa-h-mod-hkv}; do
  for oracle in cuda cpu; do check "${k//\//_}" 1 "$oracle" "$k"; done
done
python3 - "$out" <<'PY' || status=1
import json, sys, glob, os
out = sys.argv[1]
bad = 0
for gpu in sorted(glob.glob(os.path.join(out, "*-cuda.json")) +
                  glob.glob(os.path.join(out, "*-auto.json"))):
    cpu = gpu.rsplit("-", 1)[0] + "-cpu.json"
    if not os.path.exists(cpu):
        continue
    a, b = json.load(open(gpu)), json.load(open(cpu))
    va, vb = a.get("verdicts", []), b.get("verdicts", [])
    label = os.path.basename(gpu).rsplit("-", 1)[0]
    if len(va) != len(vb):
        print(f"{label}: {len(va)} verdicts with the GPU oracle, {len(vb)} with the CPU")
        bad += 1
        continue
    differ, worst = 0, 0.0
    for x, y in zip(va, vb):
        key = lambda v: (v.get("pass"), v.get("check"), v.get("tensor"),
                         (v.get("case") or {}).get("label"))
        if key(x) != key(y):
            differ += 1
        ex, ey = x.get("observed"), y.get("observed")
        if isinstance(ex, (int, float)) and isinstance(ey, (int, float)) and max(ex, ey) > 0:
            worst = max(worst, abs(ex - ey) / max(ex, ey))
    print(f"{label}: oracle {a.get('oracle_device')} vs {b.get('oracle_device')}: "
          f"{len(va)} verdicts, {differ} differ; largest relative change of a row's error "
          f"{worst:.3g}")
    bad += differ > 0
sys.exit(1 if bad else 0)
PY
echo "gate_oracle_gpu.sh: exit $status"
exit "$status"
