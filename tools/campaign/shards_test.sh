#!/usr/bin/env bash
# ctest campaign_shards_test: tools/campaign/shards.sh on CPU kernels. 3 processes started as
# torchrun starts its ranks (`--shard auto`, `--gpu auto`) run the 24 cases of seed 4; their
# merged case log must equal one unsharded run's byte for byte, and the merged counts and
# failures its report's (exit 0). A kernel whose answers depend on what its process ran before
# (tools/workers/faulty_worker.py --mode history) must make the comparison fail (exit 1): the
# comparison can fail. Usage:
# shards_test.sh ATTEST PYTHON (a Python with NumPy for the exec worker; exit 77, skipped,
# where none is given)
set -uo pipefail
attest="${1:?usage: shards_test.sh ATTEST PYTHON}"
py="${2:-}"
[ -n "$py" ] || { echo "campaign_shards_test: skipped, no Python with NumPy given"; exit 77; }
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "campaign_shards_test: $*" >&2; exit 1; }

# 1. Equal: a correct kernel and a mutant with findings (failures are compared too).
for k in cpu/flash2-bf16 mutant/causal-top-left; do
  d="$tmp/${k//\//-}"
  "$here/shards.sh" --attest "$attest" --procs 3 --single --out "$d" -- \
    --kernel "$k" --seed 4 --cases 24 --max-failures 100 --no-shrink > "$d.txt" 2>&1
  rc=$?
  want=0; [ "$k" = cpu/flash2-bf16 ] || want=1
  [ "$rc" = "$want" ] || { cat "$d.txt"; fail "$k: exit $rc, expected $want"; }
  grep -q "the merge of 3 shards equals the single run (24 cases" "$d.txt" \
    || { cat "$d.txt"; fail "$k: no equality line"; }
  for i in 0 1 2; do
    grep -q "shard $i/3 from RANK/WORLD_SIZE" "$d/shard-$i.log" \
      || { cat "$d/shard-$i.log"; fail "$k: shard $i did not take its shard from RANK"; }
  done
  [ "$(wc -l < "$d/shard-1/fuzz-cases.jsonl")" = 8 ] || fail "$k: shard 1 ran other than 8 cases"
done
python3 - "$tmp/mutant-causal-top-left/merged/fuzz-merged.json" <<'PY' || fail "the mutant's merge has no failure"
import json, sys
sys.exit(0 if json.load(open(sys.argv[1]))["failures"] else 1)
PY

# 2. Different: a kernel whose answer depends on what its process ran before (an exec worker
# whose outputs move one ulp on every other request it serves).
d="$tmp/history"
"$here/shards.sh" --attest "$attest" --procs 3 --single --out "$d" -- \
  --kernel "exec:$py $here/../workers/faulty_worker.py --mode history" --seed 4 --cases 12 \
  --check accuracy --max-failures 100 --no-shrink > "$d.txt" 2>&1
rc=$?
[ "$rc" = 1 ] || { cat "$d.txt"; fail "history worker: exit $rc, expected 1 (DIFFERENT)"; }
grep -q "DIFFERENT: the merged case log differs" "$d.txt" || { cat "$d.txt"; fail "no DIFFERENT line"; }

# 3. Usage errors: exit 2 naming the problem.
"$here/shards.sh" --attest "$attest" --out "$tmp/u" -- --kernel cpu/flash2-bf16 --cases 3 \
  --shard 0/2 > "$tmp/u.txt" 2>&1
rc=$?; [ "$rc" = 2 ] || fail "--shard accepted: exit $rc"
grep -q -- "--shard is given by this script" "$tmp/u.txt" || fail "--shard: no message"
"$here/shards.sh" --attest "$attest" --procs 0 --out "$tmp/v" -- --kernel cpu/flash2-bf16 \
  > "$tmp/v.txt" 2>&1
[ $? = 2 ] || fail "--procs 0 accepted"
env -u RANK -u WORLD_SIZE -u SLURM_PROCID -u SLURM_ARRAY_TASK_ID -u JOB_COMPLETION_INDEX \
  -u OMPI_COMM_WORLD_RANK -u PMI_RANK "$attest" fuzz --kernel cpu/flash2-bf16 --cases 2 \
  --shard auto > "$tmp/w.txt" 2>&1
rc=$?; [ "$rc" = 2 ] || fail "--shard auto without a launcher: exit $rc"
grep -q "no launcher variables are set" "$tmp/w.txt" || { cat "$tmp/w.txt"; fail "no message"; }
RANK=1 WORLD_SIZE=x "$attest" fuzz --kernel cpu/flash2-bf16 --cases 2 --shard auto \
  > "$tmp/x.txt" 2>&1
rc=$?; [ "$rc" = 2 ] || fail "WORLD_SIZE=x: exit $rc"
grep -q "WORLD_SIZE='x'" "$tmp/x.txt" || { cat "$tmp/x.txt"; fail "WORLD_SIZE=x: no message"; }
LOCAL_RANK=3 CUDA_VISIBLE_DEVICES=4,5 "$attest" fuzz --kernel cpu/flash2-bf16 --cases 1 \
  --out "$tmp/g" > "$tmp/g.txt" 2>&1
grep -q "LOCAL_RANK=3 of 2 GPUs (CUDA_VISIBLE_DEVICES 4,5): GPU 5" "$tmp/g.txt" \
  || { cat "$tmp/g.txt"; fail "--gpu auto did not choose GPU 5"; }
grep -q '"chosen": "5"' "$tmp/g/fuzz-report.json" || fail "the report has no gpu"
echo "campaign_shards_test: passed"
