#!/usr/bin/env bash
# oracle_cuda_profile.sh — run on a CUDA GPU host from the repository root, with .devO/ carried
# along (tools/device/pack_oracle_cuda.sh; for source lines also a library built with -lineinfo
# as .devO/libattest_oracle_cuda_lineinfo.so, and bench/fp64_rates.cu built as .devO/fp64_rates):
#   1. fp64_rates: the GPU's FP64 tensor-core rate per mma shape, fma and exp rates;
#   2. the SASS mma instructions of the library;
#   3. oracle_cuda_check --bench --mma-only at $SIZES with 8 x 8 x 4 and with 16 x 8 x 8 blocks
#      (ATTEST_ORACLE_CUDA_MMA_ROWS);
#   4. with CHECK_ROWS="16 8", the whole check (every feature against the CPU oracle) with each
#      block shape;
#   5. with NCU=1, Nsight Compute on the three tile kernels at S = $NCU_SIZE (sections: speed of
#      light, compute and memory workload, warp states and scheduler, instruction mix, source
#      counters with the lineinfo library).
# Everything goes into $OUT/${NAME:-profile}.tgz (one file: a run brings back few files).
set -uo pipefail
dest="${OUT:-$PWD/oracle-cuda-profile}"
name="${NAME:-profile}"
out="$dest/$name"
mkdir -p "$out"
trap 'tar czf "$dest/$name.tgz" -C "$dest" "$name" && rm -rf "$out"' EXIT
export PATH="$PATH:/usr/local/cuda/bin"
run=.devO/run.sh
nvidia-smi -L 2>&1 | tee "$out/nvidia-smi.txt"
if [ -x .devO/fp64_rates ]; then
  echo "== fp64_rates"
  .devO/fp64_rates 2>&1 | tee "$out/fp64_rates.txt"
fi
echo "== SASS mma of the library"
cuobjdump --dump-sass .devO/libattest_oracle_cuda.so 2>/dev/null | grep -o "DMMA[.0-9A-Zx]*" |
  sort | uniq -c | tee "$out/sass-dmma.txt"
for rows in ${ROWS:-8 16}; do
  echo "== bench, blocks of $rows rows"
  ATTEST_ORACLE_CUDA_MMA_ROWS=$rows timeout "${BENCH_TIMEOUT:-150}" "$run" oracle_cuda_check \
    --bench --sizes "${SIZES:-8192,32768}" --mma-only --json "$out/bench-rows$rows.json" 2>&1 |
    tee "$out/bench-rows$rows.txt" | tail -6
done
# VARIANTS="NAME=LIB ...": the bench again with other builds of the library (experiments that
# leave a stage out, say), default blocks.
for v in ${VARIANTS:-}; do
  echo "== bench, variant ${v%%=*}"
  ATTEST_ORACLE_CUDA="$PWD/${v#*=}" timeout "${BENCH_TIMEOUT:-150}" "$run" oracle_cuda_check \
    --bench --sizes "${SIZES:-8192,32768}" --mma-only --json "$out/bench-${v%%=*}.json" 2>&1 |
    tee "$out/bench-${v%%=*}.txt" | tail -4
done
# ENVS="NAME=VAR=VALUE ...": the bench again with the library's environment switches (say
# ATTEST_ORACLE_CUDA_ROWS=0, the kernels before the row kernels), default blocks.
for e in ${ENVS:-}; do
  echo "== bench, ${e#*=}"
  env "${e#*=}" timeout "${BENCH_TIMEOUT:-150}" "$run" oracle_cuda_check \
    --bench --sizes "${SIZES:-8192,32768}" --mma-only --json "$out/bench-${e%%=*}.json" 2>&1 |
    tee "$out/bench-${e%%=*}.txt" | tail -4
done
for rows in ${CHECK_ROWS:-}; do
  echo "== check, blocks of $rows rows"
  ATTEST_ORACLE_CUDA_MMA_ROWS=$rows timeout "${CHECK_TIMEOUT:-200}" "$run" oracle_cuda_check \
    --json "$out/check-rows$rows.json" > "$out/check-rows$rows.txt" 2>&1
  rc=$?
  echo "check: exit $rc ($(grep -c ' ok' "$out/check-rows$rows.txt") ok," \
    "$(grep -c FAIL "$out/check-rows$rows.txt") FAIL)"
  grep FAIL "$out/check-rows$rows.txt" | head -5
done
if [ "${NCU:-0}" = 1 ]; then
  echo "== ncu"
  lib=.devO/libattest_oracle_cuda_lineinfo.so
  [ -f "$lib" ] || lib=.devO/libattest_oracle_cuda.so
  ATTEST_ORACLE_CUDA_MMA_ROWS="${NCU_ROWS:-16}" ATTEST_ORACLE_CUDA="$PWD/$lib" \
    timeout "${NCU_TIMEOUT:-240}" ncu --clock-control none \
    --import-source yes --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section Occupancy --section SourceCounters \
    -k regex:"Forward|DqKernel|DkDv" -c 3 -o "$out/ncu-report" "$run" oracle_cuda_check \
    --bench --sizes "${NCU_SIZE:-8192}" --mma-only > "$out/ncu-run.txt" 2>&1
  echo "ncu: exit $?"
  rep="$out/ncu-report.ncu-rep"
  # The sections with their tables (stall reasons among them), then per kernel the SASS with
  # each instruction's executed count and stall samples (the source page, as CSV).
  ncu -i "$rep" --print-details all > "$out/ncu.txt" 2>&1 || ncu -i "$rep" > "$out/ncu.txt" 2>&1
  for k in RowForward RowDq RowDkDv; do
    ncu -i "$rep" -k regex:"$k" --page source --csv --print-source sass \
      > "$out/source-$k.csv" 2> "$out/source-$k.err"
  done
  [ -s "$out/source-RowForward.csv" ] && rm -f "$rep"  # else keep the report itself
  grep -E "Kernel|Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible" \
    "$out/ncu.txt" | head -40
fi
