#!/usr/bin/env bash
# torch_campaign.sh — run on a CUDA host from the repository root, in calls in a row on one warm
# machine (the device tool keeps files outside the repository between calls while the machine
# stays warm), after tools/device/pack_torch.sh filled .devA/, .devB/ (and .devC/ ...) here:
#   A  (carry .devA, from pack_torch.sh, or from pack_sdpa.sh when no FlashAttention-4 stage
#      follows): stash .devA outside the repository, unpack attest; probe PyTorch's SDPA
#      backends through the public function (sdpa-math, sdpa-flash, sdpa-efficient,
#      sdpa-cudnn) and through the private ops (the +lse extras), and the public function on
#      nested jagged tensors (torch_probe.py --njt); gate the public routes, the +lse extras
#      and flex-triton (one process per check) in bf16 and f16; fuzz the public routes
#      (FUZZ_WITH_GATES=1: beside the gates, not after them).
#   S  (carry .devB, DEVS=.devB; only when pack_torch.sh made more than .devA and .devB): stash
#      a middle part of the large wheel; again for each further middle part.
#   B  (carry the last folder pack_torch.sh made): join the large wheel, install
#      FlashAttention-4 and its dependencies into a target folder; probe, gate and fuzz FlashAttention-4 (default and deterministic=True)
#      and FlexAttention's FLASH backend in bf16 and f16; repro the GQA/MHA finding.
#   C  (nothing carried, optional): more gates (RUNS) or fuzz (FUZZ) on the warm machine.
#   F  (carry .devF, filled by tools/device/pack_cudnn_fp8.sh; one call on its own): install
#      nvidia-cudnn-frontend; probe cuDNN's FP8 SDPA (tools/device/cudnn_fp8_probe.py), gate,
#      audit (AUDITS, against AUDIT_BASELINE; AUDIT_QUICK=1 for --quick) and fuzz it with
#      static and current scales (backends cudnn-fp8-static, cudnn-fp8-current; with an -e4m3
#      suffix O comes out as E4M3, what Hopper builds; PROBE_OUTPUT=e4m3 probes that,
#      PROBE_GRADS=e4m3 probes E4M3 dq, dk, dv (Hopper's FP8 backward; backends
#      cudnn-fp8-{static,current}-e4m3-bwd run it: E4M3 O and gradients); PROBE=0
#      skips the probe).
# Backends: the torch_worker.py names (sdpa-flash+lse etc. included), plus fa4-deterministic,
# flex-triton-static (flex-triton compiled static: --flex-dynamic false), sdpa-*-additive
# (a public SDPA route with --mask-form additive) and sdpa-*-njt (a public SDPA route with
# every problem as nested jagged tensors: --njt).
# Each stage writes $OUT/stage<S>.tar.gz (logs, JSON and JUnit reports, probe JSON, failing and
# shrunk case files) and prints a summary. Commands: docs/gpu-results.md.
# Usage: tools/device/torch_campaign.sh A|S|B|C|F
# Environment: STASH (default /root/attest-stash), GATE_TIMEOUT (s per gate run, default 420),
#   CALL_SECONDS (every run ends by then, default 540), FUZZ_SECONDS (per fuzz shard,
#   shrinking included, default 150), FUZZ_MAX_FAILURES (per
#   shard, default 8), SEED (default 0), PROBE=0 (no torch_probe.py run), RUNS / FUZZ
#   (override a stage's lists: "backend:dtype ..." and "backend:dtype:shards ..."; empty:
#   none), FLEX_RUNS / FLEX_JOBS / FLEX_TIMEOUT (stage A's flex-triton gates), REPROS (after the stage: "backend:dtype:case-file:check ...", each an
#   `attest repro`), GATE_SPLIT=1 (one process per check, GATE_JOBS at a time, default 12),
#   SUITE (what the RUNS run, default gate; long: the long suite), THREADS (oracle threads per
#   run, default 2), ORACLE=1 (stage A: the CUDA oracle's check and bench, below).
# With --device cuda the workers declare CUDA tensors, so every check's float64 oracle runs on
# the GPU when libattest_oracle_cuda.so is packed beside attest (docs/checks.md).
set -uo pipefail
stage="${1:?usage: torch_campaign.sh A|S|B|C|F}"
root="$(pwd)"
out="${OUT:-$root/campaign-out}"
stash="${STASH:-/root/attest-stash}"
site="$stash/site"
work="$stash/stage$stage"
[ "$stage" != A ] && [ "$stage" != F ] || rm -rf "$stash"
mkdir -p "$out" "$work"
log="$work/campaign.txt"
exec > >(tee -a "$log") 2>&1
echo "torch_campaign.sh $stage: $(date -u +%FT%TZ) on $(hostname), $(nproc) cores"
zstd() { LD_LIBRARY_PATH="$stash/bin" "$stash/bin/zstd" "$@"; }
orig_ld="${LD_LIBRARY_PATH:-}"
python="$(command -v python3)"
seed="${SEED:-0}"
# Every run of the call ends by one deadline (CALL_SECONDS after the start, default 540): a run
# started late gets what is left, and one with under a minute left is not started (.rc "-").
deadline=$(( $(date +%s) + ${CALL_SECONDS:-540} ))
left() { echo $(( deadline - $(date +%s) )); }
# `wait` with no operand would also wait for the tee below, which waits for this shell.
waitfor() { [ $# -eq 0 ] || wait "$@"; }

case "$stage" in
  A)
    cp -r "${DEVA:-.devA}"/. "$stash/"
    zstd -d -q -c "$stash/attest-device.tar.zst" | tar -C "$stash" -xf - || exit 2
    ;;
  S)
    # A middle part of the large wheel (pack_torch.sh's .devB, .devC, ...: DEVS names the one
    # carried), kept in the stash for stage B.
    [ -f "$stash/cu13.part0" ] || { echo "no stash from stage A (machine not warm?)" >&2; exit 2; }
    cp "${DEVS:?DEVS: the folder carried, e.g. .devB}"/cu13.part* "$stash/" || exit 2
    ls -l "$stash"/cu13.part*
    exit 0
    ;;
  B)
    [ -f "$stash/cu13.part0" ] || { echo "no stash from stage A (machine not warm?)" >&2; exit 2; }
    mkdir -p "$site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" \
      "$stash"/wheels/*.whl || exit 2
    # The last part is in the folder carried (.devB, or a later one when stage S ran before).
    for d in .dev[B-E]; do [ -d "$d" ] && cp "$d"/cu13.part* "$stash/" 2> /dev/null; done
    parts=$(cat "$stash/cu13.parts" 2> /dev/null || echo 2)
    files=()
    for (( i = 0; i < parts; i++ )); do
      [ -f "$stash/cu13.part$i" ] ||
        { echo "part $i of the large wheel is missing (stage S with DEVS first?)" >&2; exit 2; }
      files+=("$stash/cu13.part$i")
    done
    cat "${files[@]}" > "$stash/cu13.tar.zst"
    [ "$(sha256sum "$stash/cu13.tar.zst" | cut -d' ' -f1)" = "$(cat "$stash/cu13.sha256")" ] \
      || { echo "the joined wheel's checksum differs" >&2; exit 2; }
    zstd -d -q --long=27 -c "$stash/cu13.tar.zst" | tar -C "$site" -xf - || exit 2
    rm -f "$stash/cu13.tar.zst"
    ;;
  C) [ -d "$site" ] || { echo "no FlashAttention-4 install from stage B" >&2; exit 2; } ;;
  F)
    cp -r "${DEVF:-.devF}"/. "$stash/"
    zstd -d -q -c "$stash/attest-device.tar.zst" | tar -C "$stash" -xf - || exit 2
    mkdir -p "$site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" \
      "$stash"/wheels/*.whl || exit 2
    ;;
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
    for n in ("flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels", "triton",
              "nvidia-cudnn-frontend"):
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
    sdpa-*-additive) backend=${backend%-additive}; extra=" --mask-form additive" ;;
    sdpa-*-njt) backend=${backend%-njt}; extra=" --njt" ;;
    flex-triton-static) backend=flex-triton; extra=" --flex-dynamic false" ;;
    cudnn-fp8-static|cudnn-fp8-current) extra=" --fp8-scaling ${backend##*-}"; backend=cudnn-fp8 ;;
    cudnn-fp8-static-e4m3|cudnn-fp8-current-e4m3)
      extra=${backend%-e4m3}; extra=" --fp8-scaling ${extra##*-} --fp8-output e4m3"
      backend=cudnn-fp8 ;;
    cudnn-fp8-static-e4m3-bwd|cudnn-fp8-current-e4m3-bwd)
      extra=${backend%-e4m3-bwd}
      extra=" --fp8-scaling ${extra##*-} --fp8-output e4m3 --fp8-grads e4m3"
      backend=cudnn-fp8 ;;
  esac
  echo "exec:LD_LIBRARY_PATH=$orig_ld PYTHONPATH=$PYTHONPATH $python tools/workers/torch_worker.py --backend $backend --dtype $dtype --device cuda$extra"
}

threads="${THREADS:-2}"
# SUITE (default gate): the suite gate() runs; its reports are named <suite>-<backend>-<dtype>.
suite="${SUITE:-gate}"
# GATE_SPLIT=1: one `attest check --check NAME` process per check (heaviest first, at most
# GATE_JOBS at a time), so a slow kernel's gate fits one call; each writes its own reports.
checks="$("$attest" list checks | awk '{print $1}')"
heavy="accuracy non-interference consistency special-values"
split_checks="$heavy $(for c in $checks; do case " $heavy " in *" $c "*) ;; *) echo "$c" ;; esac; done)"
gate() {  # backend:dtype ...
  local pids=() r runs=() c
  if [ "${GATE_SPLIT:-0}" = 1 ]; then
    for c in $split_checks; do for r in "$@"; do runs+=("$r:$c"); done; done
  else
    for r in "$@"; do runs+=("$r:"); done
  fi
  for r in "${runs[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "${GATE_JOBS:-12}" ]; do wait -n; done
    IFS=: read -r b d c <<< "$r"
    t="${GATE_TIMEOUT:-420}"; [ "$(left)" -ge "$t" ] || t="$(left)"
    if [ "$t" -lt 60 ]; then echo "- 0" > "$work/$suite-$b-$d${c:+-$c}.rc"; continue; fi
    ( k="$(kernel_of "$b" "$d")"; name="$suite-$b-$d${c:+-$c}"; t0=$(date +%s)
      only=(); [ -z "$c" ] || only=(--check "$c")
      budget=$(( t - 40 ))
      echo "attest check --suite $suite --seed $seed ${only[*]} --kernel '$k'" > "$work/$name.cmd"
      timeout "$t" "$attest" check --kernel "$k" --suite "$suite" --seed "$seed" --timings \
        "${only[@]}" --time-budget "$budget" --threads "$threads" --json "$work/$name.json" \
        --junit "$work/$name.xml" --out "$work/failures-$b-$d${c:+-$c}" > "$work/$name.log" 2>&1
      echo "$? $(( $(date +%s) - t0 ))" > "$work/$name.rc" ) &
    pids+=($!)
  done
  waitfor "${pids[@]}"
}

fuzz() {  # backend:dtype:shards ...
  local pids=() r i
  for r in "$@"; do
    IFS=: read -r b d n <<< "$r"
    secs="${FUZZ_SECONDS:-150}"; [ "$(left)" -ge $(( secs + 40 )) ] || secs=$(( $(left) - 40 ))
    [ "$secs" -ge 30 ] || { echo "- 0" > "$work/fuzz-$b-$d-merged.rc"; continue; }
    for ((i = 0; i < n; i++)); do
      ( k="$(kernel_of "$b" "$d")"; name="fuzz-$b-$d-$i"; t0=$(date +%s)
        echo "attest fuzz --seed $seed --time $secs --shard $i/$n --kernel '$k'" > "$work/$name.cmd"
        timeout $(( secs + 30 )) "$attest" fuzz --kernel "$k" --seed "$seed" \
          --time "$secs" --shard "$i/$n" --max-failures "${FUZZ_MAX_FAILURES:-8}" \
          --out "$work/$name" > "$work/$name.log" 2>&1
        echo "$? $(( $(date +%s) - t0 ))" > "$work/$name.rc" ) &
      pids+=($!)
    done
  done
  waitfor "${pids[@]}"
  for r in "$@"; do
    IFS=: read -r b d n <<< "$r"
    [ -d "$work/fuzz-$b-$d-0" ] || continue
    dirs=(); for ((i = 0; i < n; i++)); do dirs+=("$work/fuzz-$b-$d-$i"); done
    "$attest" fuzz --merge "${dirs[@]}" > "$work/fuzz-$b-$d-merged.log" 2>&1
    echo "$?" > "$work/fuzz-$b-$d-merged.rc"
  done
}

repros() {  # backend:dtype:case-file:check ...  (attest repro, one log each)
  local r b d c chk
  for r in "$@"; do
    IFS=: read -r b d c chk <<< "$r"
    name="repro-$b-$d-$(basename "$c" .case.json)-$chk"
    t=200; [ "$(left)" -ge 210 ] || t=$(( $(left) - 10 ))
    [ "$t" -ge 20 ] || { echo "-" > "$work/$name.rc"; continue; }
    timeout "$t" "$attest" repro --kernel "$(kernel_of "$b" "$d")" --check "$chk" --case "$c" \
      > "$work/$name.log" 2>&1
    echo "$?" > "$work/$name.rc"
  done
}

repros_all() { repros ${REPROS-}; }

audits() {  # backend ... (attest audit against AUDIT_BASELINE, default sdpa-flash bf16)
  local b name t
  for b in "$@"; do
    name="audit-$b"
    t=420; [ "$(left)" -ge 430 ] || t=$(( $(left) - 10 ))
    [ "$t" -ge 60 ] || { echo "- 0" > "$work/$name.rc"; continue; }
    ( t0=$(date +%s)
      base="${AUDIT_BASELINE:-$(kernel_of sdpa-flash bf16)}"
      quick=(); [ "${AUDIT_QUICK:-0}" = 1 ] && quick=(--quick)
      echo "attest audit ${quick[*]} --kernel '$(kernel_of "$b" bf16)' --baseline '$base'" \
        > "$work/$name.cmd"
      timeout "$t" "$attest" audit "${quick[@]}" --kernel "$(kernel_of "$b" bf16)" \
        --baseline "$base" --seed "$seed" --out "$work/$name" > "$work/$name.log" 2>&1
      echo "$? $(( $(date +%s) - t0 ))" > "$work/$name.rc" ) &
  done
  wait
}

probe() {  # [--njt] dtype backends...
  local njt=()
  [ "$1" != --njt ] || { njt=(--njt); shift; }
  local d="$1"; shift
  LD_LIBRARY_PATH="$orig_ld" timeout 300 "$python" tools/workers/torch_probe.py --device cuda \
    --dtype "$d" --budget "${PROBE_BUDGET:-100}" --backends "$(IFS=,; echo "$*")" "${njt[@]}" \
    --out "$work/probe-$d-$1.json" > "$work/probe-$d-$1.log" 2>&1
}

# ORACLE=1 (stage A, before its gates, with the GPU to itself): the CUDA float64 oracle packed
# beside attest (pack_torch.sh with PACK_EXTRA=reference/oracle/cuda/oracle_cuda_check):
# oracle_cuda_check against the CPU oracle on every feature, both paths, then its bench at
# ORACLE_SIZES (default 8192,16384,32768; ORACLE_MMA_SIZES more sizes on the mma path alone)
# beside cuBLAS dgemm (torch's libcublas). What tools/device/oracle_cuda.sh runs from .devO.
oracle_cuda() {
  local dev="$stash/.device" cublas
  [ -x "$dev/oracle_cuda_check" ] || { echo "no oracle_cuda_check packed (PACK_EXTRA)"; return; }
  # shellcheck disable=SC2046  # one operand per site-packages folder: split on purpose
  cublas="$(find $("$python" -c 'import site; print(" ".join(site.getsitepackages()))') \
            -maxdepth 5 -name 'libcublas.so.1[0-9]*' 2>/dev/null | sort -r | head -1)"
  local run=(env LD_LIBRARY_PATH="$dev/lib:$dev/extra-lib${orig_ld:+:$orig_ld}"
             ${cublas:+ATTEST_CUBLAS="$cublas"})
  echo "== oracle_cuda_check (cuBLAS: ${cublas:-none found})"
  t0=$(date +%s)
  timeout 300 "${run[@]}" "$dev/oracle_cuda_check" --json "$work/oracle_cuda_check.json" \
    > "$work/oracle_cuda_check.txt" 2>&1
  echo "$? $(( $(date +%s) - t0 ))" > "$work/oracle_cuda_check.rc"
  grep -E "^(PASS|FAIL)|FAIL |library:" "$work/oracle_cuda_check.txt" | tail -8
  timeout 200 "${run[@]}" "$dev/oracle_cuda_check" --bench \
    --sizes "${ORACLE_SIZES:-8192,16384,32768}" --json "$work/oracle_cuda_bench.json" \
    > "$work/oracle_cuda_bench.txt" 2>&1
  if [ -n "${ORACLE_MMA_SIZES:-}" ]; then
    timeout 200 "${run[@]}" "$dev/oracle_cuda_check" --bench --mma-only \
      --sizes "$ORACLE_MMA_SIZES" --json "$work/oracle_cuda_bench_mma.json" \
      > "$work/oracle_cuda_bench_mma.txt" 2>&1
  fi
  cat "$work"/oracle_cuda_bench*.txt
}

case "$stage" in
  A)
    [ "${ORACLE:-0}" = 1 ] && oracle_cuda
    p1=
    if [ "${PROBE:-1}" = 1 ]; then
      ( probe --njt bf16 sdpa-math sdpa-flash sdpa-efficient sdpa-cudnn sdpa-flash+lse \
          sdpa-efficient+lse sdpa-cudnn+lse; probe f16 sdpa-math sdpa-flash sdpa-efficient sdpa-cudnn
        [ -z "${FLEX_RUNS-x}" ] || probe bf16 flex-triton ) &
      p1=$!
    fi
    # flex-triton compiles a kernel per new mask/score rule under torch.compile: one process
    # per check (GATE_SPLIT), beside the SDPA runs, for the whole call.
    g=
    if [ -n "${FLEX_RUNS-flex-triton:bf16 flex-triton:f16}" ]; then
      ( GATE_SPLIT=1 GATE_JOBS="${FLEX_JOBS:-8}" GATE_TIMEOUT="${FLEX_TIMEOUT:-480}" \
          gate ${FLEX_RUNS-flex-triton:bf16 flex-triton:f16} ) &
      g=$!
    fi
    f=
    if [ "${FUZZ_WITH_GATES:-0}" = 1 ]; then
      ( fuzz ${FUZZ-sdpa-flash:bf16:1 sdpa-efficient:bf16:1 sdpa-cudnn:bf16:1} ) &
      f=$!
    fi
    gate ${RUNS-sdpa-math:bf16 sdpa-math:f16 sdpa-flash:bf16 sdpa-flash:f16 \
                 sdpa-efficient:bf16 sdpa-efficient:f16 sdpa-cudnn:bf16 sdpa-cudnn:f16 \
                 sdpa-flash+lse:bf16 sdpa-efficient+lse:bf16 sdpa-cudnn+lse:bf16}
    [ "${FUZZ_WITH_GATES:-0}" = 1 ] || \
      fuzz ${FUZZ-sdpa-math:bf16:1 sdpa-math:f16:1 sdpa-flash:bf16:1 sdpa-flash:f16:1 \
                   sdpa-efficient:bf16:1 sdpa-efficient:f16:1 sdpa-cudnn:bf16:1 sdpa-cudnn:f16:1}
    waitfor $g $p1 $f
    ;;
  B)
    "$python" -c "import flash_attn.cute as f; print('flash_attn.cute from', f.__file__)" || exit 2
    p1=
    if [ "${PROBE:-1}" = 1 ]; then
      ( probe bf16 fa4 fa4-deterministic; probe bf16 flex-flash ) &
      p1=$!
    fi
    gate ${RUNS-fa4:bf16 fa4:f16 fa4-deterministic:bf16 fa4-deterministic:f16 \
                 flex-flash:bf16 flex-flash:f16} &
    g=$!
    # Which spelling of the FlashAttention-4 GQA/MHA disagreement is wrong: each against the
    # oracle (accuracy), and the disagreement itself again.
    REPROS="fa4:bf16:golden/findings/fa4-gqa-vs-mha-dk.case.json:accuracy
            fa4:bf16:golden/findings/fa4-gqa-vs-mha-dk.case.json:gqa-mha ${REPROS-}" \
      repros_all &
    r=$!
    fuzz ${FUZZ-fa4:bf16:1 fa4:f16:1 fa4-deterministic:bf16:1 flex-flash:bf16:1 \
                 flex-flash:f16:1}
    waitfor $g $r $p1
    REPROS=
    ;;
  F)
    "$python" -c "import cudnn; print('cudnn frontend', cudnn.__file__, cudnn.backend_version())" \
      || exit 2
    ( [ "${PROBE:-1}" = 0 ] || for m in static current; do
        LD_LIBRARY_PATH="$orig_ld" timeout 200 "$python" tools/device/cudnn_fp8_probe.py \
          --scaling "$m" --output "${PROBE_OUTPUT:-bf16}" --grads "${PROBE_GRADS:-bf16}" \
          --out "$work/probe-cudnn-fp8-$m.json" > "$work/probe-cudnn-fp8-$m.log" 2>&1
      done ) &
    p1=$!
    ( GATE_SPLIT=1 gate ${RUNS-cudnn-fp8-static:bf16 cudnn-fp8-current:bf16} ) &
    g=$!
    audits ${AUDITS-cudnn-fp8-static cudnn-fp8-current} &
    a=$!
    fuzz ${FUZZ-cudnn-fp8-static:bf16:1 cudnn-fp8-current:bf16:1}
    waitfor $g $a $p1
    ;;
  C)  # what a session has device time left for: RUNS / FUZZ (default: more fuzz)
    gate ${RUNS-}
    fuzz ${FUZZ-sdpa-cudnn:bf16:2 fa4:bf16:2 flex-triton:bf16:1}
    ;;
esac

repros_all

echo "== summary, stage $stage"
for f in "$work"/{gate,long,quick,full}-*.rc "$work"/fuzz-*-merged.rc; do
  [ -f "$f" ] || continue
  n="$(basename "$f" .rc)"; read -r rc secs < "$f"
  echo "$n: exit $rc${secs:+ in ${secs}s}; $(grep -E '^(PASS|FAIL)' "$work/$n.log" | tail -1 | cut -c1-160)"
  grep -m 4 -E '^FAIL ' "$work/$n.log" | cut -c1-220 | sed 's/^/    /'
done
for f in "$work"/repro-*.log; do [ -f "$f" ] && { echo "== $(basename "$f")"; grep -E '^(PASS|FAIL)' "$f" | cut -c1-220 | head -12; }; done
for f in "$work"/probe-*.log; do [ -f "$f" ] && { echo "== $(basename "$f")"; grep -E "refused|Error|error" "$f" | cut -c1-220 | head -20; }; done
for f in "$work"/probe-cudnn-fp8-*.log; do
  [ -f "$f" ] && { echo "== $(basename "$f")"; cut -c1-300 "$f" | head -30; }
done
for f in "$work"/audit-*.rc; do
  [ -f "$f" ] && { echo "== $(basename "$f" .rc): $(cat "$f")"; tail -5 "${f%.rc}.log" | cut -c1-220; }
done
# What comes back: one archive (failing and shrunk cases, reports, logs; no tensors).
find "$work" -name '*.safetensors' -size +2M -delete
tar -C "$stash" -czf "$out/stage$stage.tar.gz" "stage$stage"
ls -l "$out"
