#!/usr/bin/env bash
# torch_campaign.sh — run on a CUDA host from the repository root, in three calls in a row on
# one warm machine (the device tool keeps files outside the repository between calls while the
# machine stays warm), after tools/device/pack_torch.sh filled .devA/ and .devB/ here:
#   A  (carry .devA): stash .devA outside the repository, unpack attest; probe and gate the four
#      PyTorch SDPA backends in bf16 and f16; fuzz them.
#   B  (carry .devB): join the large wheel, install FlashAttention-4 and its dependencies into
#      a target folder; probe and gate FlashAttention-4 (default and deterministic=True) and
#      FlexAttention's FLASH backend in bf16 and f16.
#   C  (nothing carried): gate flex-triton in bf16 and f16; fuzz FlashAttention-4 and the flex
#      backends; merge the shards.
# Each stage writes $OUT/stage<S>.tar.gz (logs, JSON and JUnit reports, probe JSON, failing and
# shrunk case files) and prints a summary. Commands: docs/gpu-results.md.
# Usage: tools/device/torch_campaign.sh A|B|C
# Environment: STASH (default /root/attest-stash), GATE_TIMEOUT (s per gate run, default 420),
#   FUZZ_SECONDS (per fuzz shard, default 150), SEED (default 0), RUNS / FUZZ (override a
#   stage's lists: "backend:dtype ..." and "backend:dtype:shards ...").
set -uo pipefail
stage="${1:?usage: torch_campaign.sh A|B|C}"
root="$(pwd)"
out="${OUT:-$root/campaign-out}"
stash="${STASH:-/root/attest-stash}"
site="$stash/site"
work="$stash/stage$stage"
mkdir -p "$out" "$work"
log="$work/campaign.txt"
exec > >(tee -a "$log") 2>&1
echo "torch_campaign.sh $stage: $(date -u +%FT%TZ) on $(hostname), $(nproc) cores"
zstd() { LD_LIBRARY_PATH="$stash/bin" "$stash/bin/zstd" "$@"; }
orig_ld="${LD_LIBRARY_PATH:-}"
python="$(command -v python3)"
seed="${SEED:-0}"

case "$stage" in
  A)
    rm -rf "$stash"; mkdir -p "$stash" "$work"
    cp -r "${DEVA:-.devA}"/. "$stash/"
    zstd -d -q -c "$stash/attest-device.tar.zst" | tar -C "$stash" -xf - || exit 2
    ;;
  B)
    [ -f "$stash/cu13.part0" ] || { echo "no stash from stage A (machine not warm?)" >&2; exit 2; }
    mkdir -p "$site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" \
      "$stash"/wheels/*.whl || exit 2
    cat "$stash/cu13.part0" .devB/cu13.part1 > "$stash/cu13.tar.zst"
    [ "$(sha256sum "$stash/cu13.tar.zst" | cut -d' ' -f1)" = "$(cat "$stash/cu13.sha256")" ] \
      || { echo "the joined wheel's checksum differs" >&2; exit 2; }
    zstd -d -q --long=27 -c "$stash/cu13.tar.zst" | tar -C "$site" -xf - || exit 2
    rm -f "$stash/cu13.tar.zst"
    ;;
  C) [ -d "$site" ] || { echo "no FlashAttention-4 install from stage B" >&2; exit 2; } ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
attest="$stash/.device/attest.sh"
"$attest" list kernels > /dev/null || { echo "the packed attest does not run here" >&2; exit 2; }
pypath="$site:$site/nvidia_cutlass_dsl/dsl_packages"
# Python for the workers: the GPU image's, with the FlashAttention-4 target folder in front.
export PYTHONPATH="$pypath${PYTHONPATH:+:$PYTHONPATH}"
# FlashAttention-4 compiles each kernel on first use; its disk cache (flash_attn/cute/
# cache_utils.py, file-locked) lets the runs of one stage and the next stages share them.
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$stash/fa4-cache"
export TORCHINDUCTOR_CACHE_DIR="$stash/inductor-cache"

{
  echo "date: $(date -u +%FT%TZ)"
  "$python" - <<'PY'
import platform, torch
print("python:", platform.python_version(), "| torch:", torch.__version__, "| cuda:",
      torch.version.cuda, "| cudnn:", torch.backends.cudnn.version())
p = torch.cuda.get_device_properties(0)
print("gpu:", p.name, "| sm_%d%d" % (p.major, p.minor))
try:
    import importlib.metadata as md
    for n in ("flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels", "triton"):
        try:
            print(n + ":", md.version(n))
        except md.PackageNotFoundError:
            pass
except Exception as e:
    print("metadata:", e)
PY
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/driver: /'
  echo "attest: $("$attest" --version 2>/dev/null)"
} > "$work/versions.txt" 2>&1
cat "$work/versions.txt"

kernel_of() {  # backend dtype -> exec: spec
  local backend="$1" dtype="$2" extra=""
  case "$backend" in
    fa4-deterministic) backend=fa4; extra=" --deterministic" ;;
  esac
  echo "exec:LD_LIBRARY_PATH=$orig_ld PYTHONPATH=$PYTHONPATH $python tools/workers/torch_worker.py --backend $backend --dtype $dtype --device cuda$extra"
}

threads=2
gate() {  # backend:dtype ...
  local pids=() r
  for r in "$@"; do
    IFS=: read -r b d <<< "$r"
    ( k="$(kernel_of "$b" "$d")"; name="gate-$b-$d"; t0=$(date +%s)
      echo "attest check --suite gate --seed $seed --kernel '$k'" > "$work/$name.cmd"
      timeout "${GATE_TIMEOUT:-420}" "$attest" check --kernel "$k" --suite gate --seed "$seed" \
        --threads "$threads" --json "$work/$name.json" --junit "$work/$name.xml" \
        --out "$work/failures-$b-$d" > "$work/$name.log" 2>&1
      echo "$? $(( $(date +%s) - t0 ))" > "$work/$name.rc" ) &
    pids+=($!)
  done
  wait "${pids[@]}"
}

fuzz() {  # backend:dtype:shards ...
  local pids=() r i
  for r in "$@"; do
    IFS=: read -r b d n <<< "$r"
    for ((i = 0; i < n; i++)); do
      ( k="$(kernel_of "$b" "$d")"; name="fuzz-$b-$d-$i"; t0=$(date +%s)
        echo "attest fuzz --seed $seed --time ${FUZZ_SECONDS:-150} --shard $i/$n --kernel '$k'" > "$work/$name.cmd"
        timeout $(( ${FUZZ_SECONDS:-150} + 150 )) "$attest" fuzz --kernel "$k" --seed "$seed" \
          --time "${FUZZ_SECONDS:-150}" --shard "$i/$n" --out "$work/$name" > "$work/$name.log" 2>&1
        echo "$? $(( $(date +%s) - t0 ))" > "$work/$name.rc" ) &
      pids+=($!)
    done
  done
  wait "${pids[@]}"
  for r in "$@"; do
    IFS=: read -r b d n <<< "$r"
    dirs=(); for ((i = 0; i < n; i++)); do dirs+=("$work/fuzz-$b-$d-$i"); done
    "$attest" fuzz --merge "${dirs[@]}" > "$work/fuzz-$b-$d-merged.log" 2>&1
    echo "$?" > "$work/fuzz-$b-$d-merged.rc"
  done
}

probe() {  # dtype backends...
  local d="$1"; shift
  LD_LIBRARY_PATH="$orig_ld" timeout 300 "$python" tools/workers/torch_probe.py --device cuda \
    --dtype "$d" --budget "${PROBE_BUDGET:-100}" --backends "$(IFS=,; echo "$*")" \
    --out "$work/probe-$d-$1.json" > "$work/probe-$d-$1.log" 2>&1
}

case "$stage" in
  A)
    probe bf16 sdpa-math sdpa-flash sdpa-efficient sdpa-cudnn &
    p1=$!
    gate ${RUNS:-sdpa-math:bf16 sdpa-math:f16 sdpa-flash:bf16 sdpa-flash:f16 \
                 sdpa-efficient:bf16 sdpa-efficient:f16 sdpa-cudnn:bf16 sdpa-cudnn:f16}
    fuzz ${FUZZ:-sdpa-math:bf16:1 sdpa-flash:bf16:1 sdpa-efficient:bf16:1 sdpa-cudnn:bf16:1 \
                 sdpa-flash:f16:1 sdpa-cudnn:f16:1}
    wait $p1
    ;;
  B)
    "$python" -c "import flash_attn.cute as f; print('flash_attn.cute from', f.__file__)" || exit 2
    ( probe bf16 fa4 fa4-deterministic ) &
    p1=$!
    ( probe bf16 flex-flash ) &
    p2=$!
    gate ${RUNS:-fa4:bf16 fa4:f16 fa4-deterministic:bf16 fa4-deterministic:f16 \
                 flex-flash:bf16 flex-flash:f16}
    wait $p1 $p2
    ;;
  C)
    ( probe bf16 flex-triton ) &
    p1=$!
    gate ${RUNS:-flex-triton:bf16 flex-triton:f16} &
    g=$!
    fuzz ${FUZZ:-fa4:bf16:2 fa4:f16:1 fa4-deterministic:bf16:1 flex-flash:bf16:1}
    wait $g $p1
    ;;
esac

echo "== summary, stage $stage"
for f in "$work"/gate-*.rc "$work"/fuzz-*-merged.rc; do
  [ -f "$f" ] || continue
  n="$(basename "$f" .rc)"; read -r rc secs < "$f"
  echo "$n: exit $rc${secs:+ in ${secs}s}; $(grep -E '^(PASS|FAIL)' "$work/$n.log" | tail -1 | cut -c1-160)"
  grep -m 4 -E '^FAIL ' "$work/$n.log" | cut -c1-220 | sed 's/^/    /'
done
for f in "$work"/probe-*.log; do [ -f "$f" ] && { echo "== $(basename "$f")"; grep -E "refused|Error|error" "$f" | cut -c1-220 | head -20; }; done
# What comes back: one archive (failing and shrunk cases, reports, logs; no tensors).
find "$work" -name '*.safetensors' -size +2M -delete
tar -C "$stash" -czf "$out/stage$stage.tar.gz" "stage$stage"
ls -l "$out"
