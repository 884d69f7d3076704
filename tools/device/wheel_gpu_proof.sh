#!/usr/bin/env bash
# wheel_gpu_proof.sh — run on a CUDA host from the repository root, carrying .devW (filled by
# tools/device/pack_wheel.sh on the build machine): installs attest's cp312-abi3 wheel offline
# into a target folder of the host's Python (no venv: `pip install --no-index --no-deps
# --target`, the folder on PYTHONPATH and its bin/ on PATH) and proves it on the GPU
# (docs/python.md "Proof on the GPU"), with tools/device/wheel_gpu_proof.py:
#   1. in process: attest.check on each kernel (F.scaled_dot_product_attention under each
#      backend's sdpa_kernel, FlashAttention-4's flash_attn_func where flash_attn.cute
#      imports, a FlexAttention function), the float64 oracle on the GPU from the wheel's
#      own libattest_oracle_cuda.so;
#   2. a pytest file of attest.pytest_suite items on the same kernels (the plugin);
#   3. the exec route: the wheel's `attest check --kernel 'exec:... tools/workers/
#      torch_worker.py --backend X --dtype DTYPE --device cuda'` (torch_campaign.sh's kernel_of)
#      with the same suite and seed;
# then compares the two routes' verdicts per kernel (the same cases, the same pass/fail per
# verdict; the differences written out) and reports seconds per verdict for both and each
# report's oracle_device. Routes and kernels run in parallel (JOBS at a time), every step
# under `timeout`, the whole call within CALL_SECONDS.
# Outputs: $OUT/summary.json, $OUT/summary.txt, $OUT/wheel-proof.tar.gz (reports, logs).
# Environment: OUT (default ./wheel-proof-out), CALL_SECONDS (default 420), JOBS (default 8),
#   KERNELS (default: sdpa-math sdpa-flash sdpa-efficient sdpa-cudnn fa4 flex; fa4 dropped
#   where flash_attn.cute does not import), DTYPE (bf16), DEVICE (cuda; cpu for a dry run),
#   SUITE (gate), SEED (0), THREADS (oracle threads per run, 2), PYTHON (default: python3 on
#   PATH, the GPU image's /opt/torch/.venv), DEVW (.devW), STASH (/root/attest-stash: the
#   wheel goes to $STASH/wheel-site; FlashAttention-4 from torch_campaign.sh stage B is
#   $STASH/site, put on PYTHONPATH where present), PYTEST=0 (no pytest run), WHEEL (another
#   wheel of attest instead of .devW's: a dry run on the build machine, docs/python.md).
set -uo pipefail
root="$(pwd)"
out="${OUT:-$root/wheel-proof-out}"
devw="${DEVW:-.devW}"
stash="${STASH:-/root/attest-stash}"
target="$stash/wheel-site"
work="$stash/wheel-proof"
python="${PYTHON:-$(command -v python3)}"
dtype="${DTYPE:-bf16}" device="${DEVICE:-cuda}" suite="${SUITE:-gate}" seed="${SEED:-0}"
threads="${THREADS:-2}"
deadline=$(( $(date +%s) + ${CALL_SECONDS:-420} ))
left() { echo $(( deadline - $(date +%s) )); }
mkdir -p "$out" "$stash"
rm -rf "$work" "$target" && mkdir -p "$work"
exec > >(tee -a "$work/wheel-proof.txt") 2>&1
echo "wheel_gpu_proof.sh: $(date -u +%FT%TZ) on $(hostname), $(nproc) cores, $("$python" --version)"

# 1. The wheel into a target folder, offline.
wheel="${WHEEL:-}"
for w in "$devw"/attest-*-cp312-abi3-*.whl; do
  [ -z "${WHEEL:-}" ] && [ -f "$w" ] && wheel="$w"
done
[ -n "$wheel" ] || { echo "no attest cp312-abi3 wheel in $devw (tools/device/pack_wheel.sh)" >&2
                     exit 2; }
extra=()
for w in "$devw"/*.whl; do [ ! -f "$w" ] || [ "$w" = "$wheel" ] || extra+=("$w"); done
timeout 120 "$python" -m pip install -q --no-index --no-deps --no-compile \
  --disable-pip-version-check --target "$target" "$wheel" "${extra[@]}" || exit 2
pypath="$target"
[ -d "$stash/site" ] && pypath="$pypath:$stash/site:$stash/site/nvidia_cutlass_dsl/dsl_packages"
export PYTHONPATH="$pypath${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$target/bin:$PATH"
unset ATTEST_ORACLE_CUDA  # the package's own copy, found on import
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$stash/fa4-cache"
export TORCHINDUCTOR_CACHE_DIR="$stash/inductor-cache"
proof=("$python" "$root/tools/device/wheel_gpu_proof.py")

# What runs: the package, its oracle, the GPU, the kernels importable here.
timeout 120 "$python" - "$work/info.json" "$wheel" <<'PY' || exit 2
import json, os, platform, sys
import attest, torch
info = {"wheel": os.path.basename(sys.argv[2]), "attest": attest.__file__,
        "attest_command": os.popen("command -v attest").read().strip(),
        "ATTEST_ORACLE_CUDA": os.environ.get("ATTEST_ORACLE_CUDA"),
        "cuda_oracle": attest._core.cuda_oracle(), "python": platform.python_version(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
try:
    import flash_attn.cute  # noqa: F401
    info["fa4"] = True
except Exception as e:  # noqa: BLE001
    info["fa4"] = f"{type(e).__name__}: {e}"
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(json.dumps(info, indent=1))
PY
kernels="${KERNELS:-sdpa-math sdpa-flash sdpa-efficient sdpa-cudnn fa4 flex}"
if [ -z "${KERNELS:-}" ] && ! grep -q '"fa4": true' "$work/info.json"; then
  kernels="${kernels/fa4 /}"
  echo "FlashAttention-4 does not import here: fa4 left out"
fi

# 2. The runs, JOBS at a time: per kernel a pytest run of the plugin, the in-process check and
# the exec route; each under `timeout` with what is left of the call (a run with under 30 s left
# is not started: its .rc says "- 0").
run() {  # NAME COMMAND...: $work/NAME.log, $work/NAME.rc ("EXIT SECONDS")
  local name="$1" t t0; shift
  t=$(( $(left) - 15 ))
  if [ "$t" -lt 30 ]; then echo "- 0" > "$work/$name.rc"; return; fi
  t0=$(date +%s)
  echo "$*" > "$work/$name.cmd"
  timeout "$t" "$@" > "$work/$name.log" 2>&1
  echo "$? $(( $(date +%s) - t0 ))" > "$work/$name.rc"
}
jobs_max="${JOBS:-8}"
throttle() { while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done; }
pids=()
for k in $kernels; do
  if [ "${PYTEST:-1}" = 1 ]; then
    test_py="test_wheel_gpu_${k//-/_}.py"
    timeout 60 "${proof[@]}" pytest-file --kernels "$k" --dtype "$dtype" --device "$device" \
      --suite "$suite" --seed "$seed" --out "$work/$test_py" || exit 2
    throttle
    ( cd "$work" && run "pytest-$k" "$python" -m pytest -q -p no:cacheprovider "$test_py" \
        --junitxml "$work/pytest-$k.xml" ) &
    pids+=($!)
  fi
  throttle
  run "inproc-$k" "${proof[@]}" inproc --kernel "$k" --dtype "$dtype" --device "$device" \
    --suite "$suite" --seed "$seed" --threads "$threads" --out "$work" &
  pids+=($!)
  throttle
  spec="$(timeout 30 "${proof[@]}" exec-spec --kernel "$k" --dtype "$dtype" --device "$device" \
          --python "$python" --workers "$root/tools/workers")"
  run "exec-$k" attest check --kernel "$spec" --suite "$suite" --seed "$seed" \
    --threads "$threads" --json "$work/exec-$k.json" --junit "$work/exec-$k.xml" \
    --out "$work/failures-exec-$k" &
  pids+=($!)
done
[ ${#pids[@]} = 0 ] || wait "${pids[@]}"

# 3. The comparison and the summary.
timeout 60 "${proof[@]}" summarize --work "$work" --out "$out" --kernels "${kernels// /,}" \
  --expect-oracle "$device"
timeout 60 tar -C "$stash" -czf "$out/wheel-proof.tar.gz" wheel-proof
echo "wheel_gpu_proof.sh: done in $(( ${CALL_SECONDS:-420} - $(left) )) s"
