#!/usr/bin/env bash
# sdpa_public_diag.sh — run on a CUDA host from the repository root, carrying .devA
# (tools/device/pack_sdpa.sh): the diagnosis behind the public SDPA routes' findings, in one
# call, everything at once:
#   - tools/device/sdpa_mask_forms.py: every mask form on the cuDNN, memory-efficient, flash
#     and math backends of F.scaled_dot_product_attention (which form breaks which backend);
#   - the gate on sdpa-cudnn with --mask-form additive (GATES, default bf16 and f16), beside
#     the boolean masks' gate of torch_campaign.sh A;
#   - `attest repro` of each finding's case file on the routes that tell the classes apart
#     (REPROS: "backend:dtype:case-file:check ...", backends as torch_campaign.sh names them).
# Writes $OUT/diag.tar.gz (logs, JSON reports, versions).
# Usage: tools/device/sdpa_public_diag.sh
set -uo pipefail
root="$(pwd)"
out="${OUT:-$root/diag-out}"
stash="${STASH:-/root/attest-stash}"
work="${WORK:-/root/attest-diag}"
rm -rf "$work"; mkdir -p "$out" "$work"
# Unpack attest (torch_campaign.sh A with nothing to run: versions.txt, the stash).
PROBE=0 FLEX_RUNS='' FUZZ='' RUNS='' REPROS='' OUT="$work/unpack" bash tools/device/torch_campaign.sh A \
  > "$work/unpack.log" 2>&1 || { cat "$work/unpack.log"; exit 2; }
cp "$stash/stageA/versions.txt" "$work/"
attest="$stash/.device/attest.sh"
py="$(command -v python3)"
orig_ld="${LD_LIBRARY_PATH:-}"
exec_of() {  # backend dtype -> exec: spec (torch_campaign.sh's kernel_of: the host's libraries
  local b="$1" extra=""  # for the worker, not those packed beside attest)
  case "$b" in sdpa-*-additive) b=${b%-additive}; extra=" --mask-form additive" ;; esac
  echo "exec:LD_LIBRARY_PATH=$orig_ld $py tools/workers/torch_worker.py --backend $b --dtype $2 --device cuda$extra"
}
timeout 200 "$py" tools/device/sdpa_mask_forms.py --dtype bf16 --json "$work/mask-forms-bf16.json" \
  > "$work/mask-forms-bf16.log" 2>&1 &
for g in ${GATES-sdpa-cudnn-additive:bf16 sdpa-cudnn-additive:f16}; do
  IFS=: read -r b d <<< "$g"
  ( timeout "${GATE_TIMEOUT:-300}" "$attest" check --kernel "$(exec_of "$b" "$d")" --suite gate \
      --seed 0 --threads 2 --json "$work/gate-$b-$d.json" --out "$work/failures-$b-$d" \
      > "$work/gate-$b-$d.log" 2>&1; echo "$?" > "$work/gate-$b-$d.rc" ) &
done
for r in ${REPROS-}; do
  IFS=: read -r b d c chk <<< "$r"
  n="repro-$b-$d-$(basename "$c" .case.json)-$chk"
  ( timeout 200 "$attest" repro --kernel "$(exec_of "$b" "$d")" --case "$c" --check "$chk" \
      > "$work/$n.log" 2>&1; echo "$?" > "$work/$n.rc" ) &
done
wait
echo "== $(tr '\n' ' ' < "$work/versions.txt")"
cat "$work/mask-forms-bf16.log"
for f in "$work"/gate-*.log; do echo "== $(basename "$f"): $(grep -E '^(PASS|FAIL)' "$f" | cut -c1-200)"; done
for f in "$work"/repro-*.log; do
  echo "== $(basename "$f" .log): $(grep -E '^(PASS|FAIL):' "$f" | cut -c1-160)"
  grep -E '^FAIL ' "$f" | head -3 | cut -c1-200
done
find "$work" -name '*.safetensors' -delete
rm -rf "$work/unpack"
tar -C "$(dirname "$work")" -czf "$out/diag.tar.gz" "$(basename "$work")"
