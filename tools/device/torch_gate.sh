#!/usr/bin/env bash
# torch_gate.sh — run on a CUDA host from the repository root (after tools/device/pack.sh
# put an `attest` binary in .device/): `attest check --suite gate` against PyTorch's attention
# backends through the exec protocol (tools/workers/torch_worker.py; DESIGN.md "External
# kernels"; issue 9 item 6): sdpa-flash, sdpa-efficient, sdpa-cudnn, flex, and sdpa-math as
# the sanity reference, all runs in parallel. Writes under $OUT (default ./torch-out):
# versions.txt (torch, CUDA, cuDNN, driver, GPU), <suite>-<backend>-<dtype>.{log,json,xml,rc}
# (rc: exit code and wall seconds), failures-<backend>-<dtype>/ (failing cases) and
# torch_gate.txt (everything printed).
# Usage: tools/device/torch_gate.sh [SUITE]        (gate (default), quick or full)
# Environment: BACKENDS (default "sdpa-math sdpa-flash sdpa-efficient sdpa-cudnn flex"),
#   DTYPES (default "bf16"), DEVICE (default cuda), ATTEST (default .device/attest.sh),
#   ATTEST_TORCH_PYTHON (a python3 with torch and numpy; else the first that has them),
#   ATTEST_GATE_TIMEOUT (seconds per run, default 500), ATTEST_EXEC_TIMEOUT_S (per call).
# Exit status: 0 when every run finished with a verdict (exit 0 pass or 1 findings: both are
# results), 2 when a run could not judge (exit 2, a timeout) or on setup errors.
set -uo pipefail
suite="${1:-gate}"
out="${OUT:-$PWD/torch-out}"
mkdir -p "$out"
exec > >(tee -a "$out/torch_gate.txt") 2>&1
echo "torch_gate.sh: $(date -u +%FT%TZ), suite $suite, OUT=$out"

attest="${ATTEST:-.device/attest.sh}"
[ -x "$attest" ] || { echo "no $attest: run tools/device/pack.sh on the build machine" >&2; exit 2; }
device="${DEVICE:-cuda}"
backends=(${BACKENDS:-sdpa-math sdpa-flash sdpa-efficient sdpa-cudnn flex})
dtypes=(${DTYPES:-bf16})

# The worker must not inherit the packed libraries attest.sh puts on LD_LIBRARY_PATH: torch
# brings its own. Each exec: command line restores the caller's value.
orig_ld="${LD_LIBRARY_PATH:-}"
python=""
for p in ${ATTEST_TORCH_PYTHON:-} python3 /opt/torch/.venv/bin/python3; do
  if command -v "$p" > /dev/null 2>&1 && "$p" -c 'import torch, numpy' > /dev/null 2>&1; then
    python="$(command -v "$p")"; break
  fi
done
[ -n "$python" ] || { echo "no python3 with torch and numpy (set ATTEST_TORCH_PYTHON)" >&2; exit 2; }

# 1. Versions.
{
  echo "date: $(date -u +%FT%TZ)"
  echo "python: $python"
  "$python" - "$device" <<'PY'
import sys, platform
import numpy, torch
dev = sys.argv[1]
print("python_version:", platform.python_version())
print("torch:", torch.__version__, "| cuda:", torch.version.cuda,
      "| cudnn:", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
print("numpy:", numpy.__version__)
if dev == "cuda" and torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu:", p.name, "| sm_%d%d" % (p.major, p.minor), "| %.0f GiB" % (p.total_memory / 2**30))
PY
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
    | sed 's/^/nvidia-smi: /'
  echo "attest: $("$attest" --version 2>/dev/null || echo '(no --version)')"
} > "$out/versions.txt" 2>&1
cat "$out/versions.txt"

# 2. Beside the suites: each backend against the NumPy worker on small cases through the
# protocol itself (tools/workers/torch_worker_test.py), a check independent of attest's
# tolerance machinery.
( IFS=,; LD_LIBRARY_PATH="$orig_ld" timeout "${ATTEST_GATE_TIMEOUT:-500}" "$python" \
    tools/workers/torch_worker_test.py --device "$device" --backends "${backends[*]}" \
    > "$out/torch_worker_test.txt" 2>&1; echo "$?" > "$out/torch_worker_test.rc" ) &
side=$!

# 3. The suite on each (backend, dtype), in parallel; the oracle's threads split the cores.
runs=()
for b in "${backends[@]}"; do for d in "${dtypes[@]}"; do runs+=("$b $d"); done; done
cores=$(nproc)
threads=$(( cores / ${#runs[@]} )); [ "$threads" -ge 1 ] || threads=1
pids=()
for r in "${runs[@]}"; do
  read -r backend dtype <<< "$r"
  name="$backend-$dtype"
  kernel="exec:LD_LIBRARY_PATH=$orig_ld $python tools/workers/torch_worker.py --backend $backend --dtype $dtype --device $device"
  ( start=$(date +%s%N)
    echo "attest check --kernel '$kernel' --suite $suite" > "$out/$suite-$name.cmd"
    timeout "${ATTEST_GATE_TIMEOUT:-500}" "$attest" check --kernel "$kernel" --suite "$suite" \
      --threads "$threads" --json "$out/$suite-$name.json" --junit "$out/$suite-$name.xml" \
      --out "$out/failures-$name" > "$out/$suite-$name.log" 2>&1
    rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    printf '%s %d.%03d\n' "$rc" $(( ms / 1000 )) $(( ms % 1000 )) > "$out/$suite-$name.rc" ) &
  pids+=($!)
done
wait "${pids[@]}" "$side"

# 4. Summary: exit code, wall time, the closing line and the first failures of each run.
status=0
for r in "${runs[@]}"; do
  read -r backend dtype <<< "$r"
  name="$backend-$dtype"
  read -r rc secs < "$out/$suite-$name.rc"
  case "$rc" in 0) v=PASS ;; 1) v=FINDINGS ;; 124) v=TIMEOUT; status=2 ;; *) v="ERROR($rc)"; status=2 ;; esac
  echo "$v $name: exit $rc in ${secs}s; $(grep -E '^(PASS|FAIL):' "$out/$suite-$name.log" | tail -1)"
  grep -m 5 '^FAIL ' "$out/$suite-$name.log" | sed 's/^/    /'
  grep -m 2 'repro: ' "$out/$suite-$name.log" | sed 's/^ */    /'
done
echo "torch_worker_test (vs NumPy worker): exit $(cat "$out/torch_worker_test.rc")"
grep -E '^(sdpa|flex|fa:)' "$out/torch_worker_test.txt" | grep -v ' ok' | sed 's/^/    /'
echo "torch_gate.sh: exit $status"
exit $status
