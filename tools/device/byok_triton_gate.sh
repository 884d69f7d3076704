#!/usr/bin/env bash
# byok_triton_gate.sh — run on a CUDA host from the repository root, after tools/device/pack.sh
# ran on the build machine and .device/ was carried along: attest's gate on the Triton example
# kernel of docs/byok.md (examples/triton_attention.py) with its shape limits declared, in bf16
# and f16 (each must exit 0), and on a seeded bug of it, the output accumulator not rescaled
# when the row maximum grows (must exit 1); first the example's float64 tests on the GPU
# (examples/test_triton_attention.py -k float64).
# The kernel runs in attest's exec worker for PyTorch kernels, tools/workers/torch_worker.py,
# through its fa: adapter over the example's flash_attn_func: the worker needs no build of the
# Python package, whose extension is built for the build machine's Python (3.11), not the GPU
# image's (3.12). With --device cuda the worker declares CUDA tensors, so the float64 oracle
# runs on the GPU where pack.sh packed libattest_oracle_cuda.so (docs/checks.md), else on the
# CPU. Triton compiles each kernel variant (head dim, causal, dtype) once per worker.
# $OUT (default ./byok-out) gets the console log byok_triton_gate.txt, one JSON report per run
# (gate-<name>.json) and byok-runs.tar.gz (each run's log and JUnit report, failing cases).
# Usage: tools/device/byok_triton_gate.sh [SUITE]   (gate, the default, or full; the quick suite
#   fails its coverage guard on Sq = Sk kernels: 15 of its 18 rows are for Sq != Sk)
# Environment: PYTHON (default: python3, the GPU image's), ATTEST (default .device/attest.sh),
#   THREADS (oracle threads per run, default: the cores split between the runs),
#   GATE_TIMEOUT (s per run, default 480), DEVICE=cpu DTYPES=f16 with TRITON_INTERPRET=1 for a
#   dry run on a CPU in Triton's interpreter (which has no bf16 arithmetic).
# Exit status: 0 when every run gave the expected verdict, 1 otherwise, 2 on setup errors.
set -uo pipefail
suite="${1:-gate}"
out="${OUT:-$PWD/byok-out}"
mkdir -p "$out"
work="$(mktemp -d "${TMPDIR:-/tmp}/byok-triton.XXXXXX")"
trap 'rm -rf "$work"' EXIT

main() {
echo "byok_triton_gate.sh: $(date -u +%FT%TZ), suite $suite, OUT=$out"
attest="${ATTEST:-.device/attest.sh}"
# Absolute (steps below run from examples/), without resolving a virtual environment's link.
python="$(command -v "${PYTHON:-python3}")" || { echo "no ${PYTHON:-python3}" >&2; return 2; }
python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")"
device="${DEVICE:-cuda}"
read -r -a dtypes <<< "${DTYPES:-bf16 f16}"
[ -x "$attest" ] || { echo "no $attest: run tools/device/pack.sh on the build machine" >&2; return 2; }
"$attest" --version || { echo "the packed attest does not run on this host" >&2; return 2; }
[ "$device" = cpu ] || unset TRITON_INTERPRET
"$python" - "$device" <<'PY' || return 2
import platform, sys
import torch, triton
print("python", platform.python_version(), "| torch", torch.__version__, "| triton",
      triton.__version__, "| cuda", torch.version.cuda)
if sys.argv[1] == "cuda":
    assert torch.cuda.is_available(), "torch sees no CUDA device"
    print("gpu:", torch.cuda.get_device_name(0))
PY
command -v cc > /dev/null || echo "no cc on PATH: Triton needs a C compiler for its launcher"
export TRITON_CACHE_DIR="$work/triton-cache"

# 1. The float64 tests (attest not needed): a broken kernel stops here, before the gate.
( cd examples && "$python" -m pytest -q -p no:cacheprovider test_triton_attention.py \
    -k float64 ) || { echo "UNEXPECTED: the float64 tests fail"; return 1; }

# 2. The claim, from the kernel's module, and the seeded bug: a copy of the module with the
# rescale of the accumulator (acc * alpha) taken out of the forward's key-tile step.
caps="$(cd examples && "$python" -c 'import json, triton_attention as k
print(json.dumps(k.FLASH_ATTN_CAPS, separators=(",", ":")))')" || return 2
echo "caps: $caps"
mkdir -p "$work/mutant"
sed 's/acc \* alpha\[:, None\])/acc)/' examples/triton_attention.py > "$work/mutant/triton_attention.py"
cmp -s examples/triton_attention.py "$work/mutant/triton_attention.py" &&
  { echo "the seeded bug's edit matched nothing in examples/triton_attention.py" >&2; return 2; }

# 3. The runs, in parallel: name, module folder, dtype, expected exit status.
runs=()
for d in "${dtypes[@]}"; do runs+=("triton-$d $PWD/examples $d 0"); done
runs+=("mutant-no-rescale-${dtypes[0]} $work/mutant ${dtypes[0]} 1")
threads="${THREADS:-$(( $(nproc) / ${#runs[@]} ))}"; [ "$threads" -ge 1 ] || threads=1
pids=()
for r in "${runs[@]}"; do
  read -r name dir dtype want <<< "$r"
  kernel="exec:env PYTHONPATH=$dir $python tools/workers/torch_worker.py --backend fa:triton_attention:flash_attn_func --dtype $dtype --device $device --caps '$caps'"
  echo "$name: attest check --suite $suite --kernel \"$kernel\""
  ( start=$(date +%s)
    timeout "${GATE_TIMEOUT:-480}" "$attest" check --kernel "$kernel" --suite "$suite" \
      --threads "$threads" --json "$out/$suite-$name.json" --junit "$work/$suite-$name.xml" \
      --out "$work/failures-$name" > "$work/$suite-$name.log" 2>&1
    echo "$? $(( $(date +%s) - start ))" > "$work/$suite-$name.rc" ) &
  pids+=($!)
done
wait "${pids[@]}"

# 4. Summary: each run's verdict line.
status=0
for r in "${runs[@]}"; do
  read -r name dir dtype want <<< "$r"
  read -r rc secs < "$work/$suite-$name.rc"
  verdict=ok; [ "$rc" = "$want" ] || { verdict=UNEXPECTED; status=1; }
  echo "$verdict $name: exit $rc (want $want) in ${secs}s; $(tail -1 "$work/$suite-$name.log")"
  grep -m 3 '^FAIL' "$work/$suite-$name.log" | sed 's/^/    /'
done
tar -C "$work" -czf "$out/byok-runs.tar.gz" --exclude triton-cache --exclude mutant .
echo "byok_triton_gate.sh: exit $status"
return $status
}

# Everything is shown and kept in $OUT/byok_triton_gate.txt.
main 2>&1 | tee "$out/byok_triton_gate.txt"
exit "${PIPESTATUS[0]}"
