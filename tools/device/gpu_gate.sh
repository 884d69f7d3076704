#!/usr/bin/env bash
# gpu_gate.sh — run on a CUDA host from the repository root (after tools/device/pack.sh ran on
# the build machine and .device/ was carried along): builds the example CUDA plugins with the
# host's nvcc (kernels/plugin/examples/cuda_flash.cu, no CMake, no other dependency) and runs
# `attest check --suite gate` on the correct kernels (must exit 0) and the mutants (must
# exit 1), in parallel, after cross-checking the GPU outputs against the CPU build of the same
# row code on the cases of tools/device/cases/. Logs, JSON reports and failing cases go under $OUT (default ./gpu-out).
# Usage: tools/device/gpu_gate.sh [SUITE]   (SUITE: gate (default) or quick)
# Exit status: 0 when every kernel got the expected verdict and the cross-check agreed, 1
# otherwise, 2 on setup errors.
set -uo pipefail
suite="${1:-gate}"
out="${OUT:-$PWD/gpu-out}"
mkdir -p "$out"

main() {
echo "gpu_gate.sh: $(date -u +%FT%TZ), suite $suite, OUT=$out"

attest=".device/attest.sh"
[ -x "$attest" ] || { echo "no $attest: run tools/device/pack.sh on the build machine" >&2; return 2; }
"$attest" list kernels > /dev/null || { echo "the packed attest does not run on this host" >&2; return 2; }
nvcc="$(command -v nvcc || true)"
[ -n "$nvcc" ] || nvcc=/usr/local/cuda/bin/nvcc
[ -x "$nvcc" ] || { echo "no nvcc on PATH or in /usr/local/cuda/bin" >&2; return 2; }
cuda_root="$(cd "$(dirname "$nvcc")/.." && pwd)"
nvidia-smi -L > "$out/nvidia-smi.txt" 2>&1 || true
cat "$out/nvidia-smi.txt"
"$nvcc" --version | tail -1

# 1. Build (the flags of kernels/plugin/examples/CMakeLists.txt).
arch="${ATTEST_CUDA_ARCH:-sm_90}"
build="$out/build"
mkdir -p "$build"
# shellcheck disable=SC2054  # the commas belong to -Xcompiler and -Xlinker, not to the array
flags=(-std=c++17 -O2 --fmad=false -Xcompiler=-fPIC,-fvisibility=hidden -I. -Ikernels/plugin/examples
       -arch="$arch" -shared -cudart shared "-Xlinker=-rpath,$cuda_root/lib64")
t0=$(date +%s)
"$nvcc" "${flags[@]}" -o "$build/libattest_example_cuda.so" kernels/plugin/examples/cuda_flash.cu || return 2
"$nvcc" "${flags[@]}" -DATTEST_EXAMPLE_MUTANT -o "$build/libattest_example_cuda_mutant.so" \
  kernels/plugin/examples/cuda_flash.cu || return 2
echo "built in $(( $(date +%s) - t0 )) s for $arch"
export LD_LIBRARY_PATH="$cuda_root/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ATTEST_PLUGIN_TIMEOUT="${ATTEST_PLUGIN_TIMEOUT:-120}"

# 2. The GPU against the CPU build of the same row code on a few cases (tools/device/cases):
# they differ only where CUDA's expf/logf/tanhf differ from glibc's, so a race, an indexing
# error or an unwritten element shows up here directly (compare_dumps.py). `attest repro
# --check accuracy` also judges each case against the oracle.
cross=0
if g++ -std=c++17 -O2 -shared -fPIC -fvisibility=hidden -I. -o "$build/libattest_example_host.so" \
     kernels/plugin/examples/host_flash.cc; then
  mkdir -p "$out/cross"
  for c in tools/device/cases/*.case.json; do
    case_name="$(basename "$c" .case.json)"
    dtype="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["problem"]["dtype"])' "$c")"
    for side in gpu cpu; do
      lib="$build/libattest_example_cuda.so"; [ "$side" = cpu ] && lib="$build/libattest_example_host.so"
      "$attest" repro --kernel "plugin:$lib:flash-$dtype" --case "$c" --check accuracy \
        --dump "$out/cross/$case_name/$side" > "$out/cross/$case_name.$side.log" 2>&1
      rc=$?
      [ $rc -eq 0 ] || { echo "repro $side $case_name: exit $rc ($(tail -1 "$out/cross/$case_name.$side.log"))"; cross=1; }
    done
    echo "cross-check $case_name ($dtype), GPU vs CPU build:"
    python3 tools/device/compare_dumps.py "$out/cross/$case_name/gpu" "$out/cross/$case_name/cpu" || cross=1
    # Keep what comes back small: the outputs only (inputs and oracle are reproducible).
    rm -f "$out/cross/$case_name"/*/inputs.safetensors "$out/cross/$case_name"/*/oracle.safetensors
  done
else
  echo "no g++: cross-check skipped"
fi

# 3. The gate, one run per kernel, in parallel (the oracle is the CPU cost: split the cores).
cores=$(nproc)
runs=("flash-bf16 $build/libattest_example_cuda.so 0"
      "flash-f16 $build/libattest_example_cuda.so 0"
      "mutant-causal-off-by-one $build/libattest_example_cuda_mutant.so 1"
      "mutant-no-rescale $build/libattest_example_cuda_mutant.so 1")
threads=$(( cores / ${#runs[@]} )); [ "$threads" -ge 1 ] || threads=1
pids=()
for r in "${runs[@]}"; do
  read -r name lib want <<< "$r"
  ( start=$(date +%s)
    timeout "${ATTEST_GATE_TIMEOUT:-520}" "$attest" check --kernel "plugin:$lib:$name" --suite "$suite" --threads "$threads" \
      --json "$out/$suite-$name.json" --junit "$out/$suite-$name.xml" --out "$out/failures-$name" \
      > "$out/$suite-$name.log" 2>&1
    echo "$? $(( $(date +%s) - start ))" > "$out/$suite-$name.rc" ) &
  pids+=($!)
done
wait "${pids[@]}"

# 4. Summary.
status=$cross
[ "$cross" = 0 ] || echo "UNEXPECTED cross-check: see above and $out/cross/"
for r in "${runs[@]}"; do
  read -r name lib want <<< "$r"
  read -r rc secs < "$out/$suite-$name.rc"
  verdict=ok; [ "$rc" = "$want" ] || { verdict=UNEXPECTED; status=1; }
  echo "$verdict $name: exit $rc (want $want) in ${secs}s; $(tail -1 "$out/$suite-$name.log")"
  grep -m 3 '^FAIL' "$out/$suite-$name.log" | sed 's/^/    /'
done
echo "gpu_gate.sh: exit $status"
return $status
}

# Everything is shown and kept in $OUT/gpu_gate.txt.
main 2>&1 | tee "$out/gpu_gate.txt"
exit "${PIPESTATUS[0]}"
