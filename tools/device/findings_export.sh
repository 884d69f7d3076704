#!/usr/bin/env bash
# findings_export.sh — run on a CUDA host from the repository root, after
# tools/device/torch_campaign.sh stage A (PyTorch's SDPA) or B (FlashAttention-4 and
# FlexAttention's FLASH backend installed) has unpacked attest into $STASH: re-runs every
# finding of docs/findings/ whose backend passes --backends with `attest repro --export`, then
# each exported repro.py with the device's own Python (no attest on its path; the
# FlashAttention-4 install of stage B on PYTHONPATH, as the kernel's own package), and writes
# $OUT/findings-export.json (one record per case: finding, case, attest repro's exit status,
# the export's status, repro.py's exit status, its last line and the versions it printed,
# seconds) and $OUT/findings-export.txt (a table),
# the export folders and logs under $OUT/export/, then $OUT/findings-export.tar.gz of them all.
# The driver is tools/device/findings_export.py; every process runs under a timeout, JOBS at a
# time, and all end within CALL_SECONDS.
# Usage: tools/device/findings_export.sh --backends sdpa|fa4,flex|... [--device cuda|cpu]
# Environment: STASH (default /root/attest-stash), OUT (default ./findings-out), ATTEST (default
#   $STASH/.device/attest.sh), REPRO_PYTHON (default /opt/torch/.venv/bin/python3, else
#   python3), JOBS (default 6: one GPU), CALL_SECONDS (default 540), RUN_TIMEOUT (per attest
#   repro, default 240), REPRO_TIMEOUT (per repro.py, default 180), THREADS (oracle threads per
#   run, default 2).
set -uo pipefail
root="$(pwd)"
stash="${STASH:-/root/attest-stash}"
out="${OUT:-$root/findings-out}"
site="$stash/site"
attest="${ATTEST:-$stash/.device/attest.sh}"
[ -x "$attest" ] || { echo "findings_export.sh: no attest at $attest (torch_campaign.sh A first?)" >&2; exit 2; }
python="$(command -v python3)"
repro_python="${REPRO_PYTHON:-/opt/torch/.venv/bin/python3}"
[ -x "$repro_python" ] || repro_python="$python"
# The workers' Python path as torch_campaign.sh sets it: the FlashAttention-4 target folder
# (stage B) in front; the same folders are the kernel's own packages for repro.py.
pypath="$site:$site/nvidia_cutlass_dsl/dsl_packages"
export PYTHONPATH="$pypath${PYTHONPATH:+:$PYTHONPATH}"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$stash/fa4-cache"
export TORCHINDUCTOR_CACHE_DIR="$stash/inductor-cache"
mkdir -p "$out"
"$python" tools/device/findings_export.py --attest "$attest" --out "$out" \
  --worker-python "$python" \
  --worker-env "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} PYTHONPATH=$PYTHONPATH " \
  --repro-python "$repro_python" --repro-pythonpath "$pypath" \
  --jobs "${JOBS:-6}" --threads "${THREADS:-2}" --call-seconds "${CALL_SECONDS:-540}" \
  --run-timeout "${RUN_TIMEOUT:-240}" --repro-timeout "${REPRO_TIMEOUT:-180}" "$@"
rc=$?
tar -C "$out" -czf "$out/findings-export.tar.gz" findings-export.json findings-export.txt export \
  2> /dev/null
exit "$rc"
