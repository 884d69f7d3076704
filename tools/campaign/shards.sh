#!/usr/bin/env bash
# shards.sh — a fuzz campaign as N processes on one node, one per GPU (docs/fuzz.md
# "Campaigns across GPUs"): each process is started as a launcher starts its ranks
# (torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), so that `attest fuzz --shard
# auto` takes shard RANK/N and `--gpu auto` the visible GPU LOCAL_RANK mod count; then the
# shards' reports and case logs are merged. With --single, the same cases run again as one
# unsharded process and the merged case log must equal its log byte for byte (same cases in
# the same order, same verdict digests), and the merged per-check counts and failures its
# report's: exit 1 where they differ.
#
# Usage: tools/campaign/shards.sh [--procs N] [--single] [--attest BIN] --out DIR -- FUZZ_ARGS...
#   --procs N   processes (default: the GPUs visible, CUDA_VISIBLE_DEVICES or nvidia-smi -L;
#               1 where there is none)
#   FUZZ_ARGS   attest fuzz's arguments (--kernel K --seed S --cases C ...; not --shard or
#               --out, which this script gives)
# Writes DIR/shard-I/ (each process's --out, with log.txt), DIR/merged/ (fuzz-merged.json,
# fuzz-cases.jsonl), DIR/single/ with --single, and DIR/throughput.json (cases per second of
# the sharded run and, with --single, of the unsharded one, wall clock). Exit status: 0 no
# shard found a failure (and, with --single, the merge equals the single run), 1 a failure was
# found or the comparison differs, 2 a usage or infrastructure error.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
attest="${ATTEST:-$root/build/default/tools/attest/attest}"
procs="" single=0 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --procs) procs="$2"; shift 2 ;;
    --single) single=1; shift ;;
    --attest) attest="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "shards.sh: unknown argument '$1' (FUZZ_ARGS go after --)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "shards.sh: --out DIR is required" >&2; exit 2; }
[ -x "$attest" ] || { echo "shards.sh: no attest at $attest (--attest BIN)" >&2; exit 2; }
for a in "$@"; do
  case "$a" in --shard|--shard=*|--out|--out=*|--merge|--merge=*)
    echo "shards.sh: $a is given by this script; leave it out of FUZZ_ARGS" >&2; exit 2 ;;
  esac
done
if [ -z "$procs" ]; then
  if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    procs=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .)
  elif command -v nvidia-smi > /dev/null; then
    procs=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
  fi
  [ "${procs:-0}" -ge 1 ] || procs=1
fi
case "$procs" in ''|*[!0-9]*|0) echo "shards.sh: --procs must be a positive integer" >&2; exit 2 ;; esac
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2> /dev/null)" ]; then
  echo "shards.sh: --out $out exists and is not empty" >&2; exit 2
fi
mkdir -p "$out" || exit 2

now() { date +%s.%N; }
t0=$(now)
pids=()
for ((i = 0; i < procs; i++)); do
  RANK=$i WORLD_SIZE=$procs LOCAL_RANK=$i LOCAL_WORLD_SIZE=$procs \
    "$attest" fuzz "$@" --shard auto --case-log --out "$out/shard-$i" \
    > "$out/shard-$i.log" 2>&1 &
  pids+=($!)
done
worst=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; rc=$?
  [ "$rc" -le 1 ] || { echo "shards.sh: shard $i exited $rc:" >&2; tail -5 "$out/shard-$i.log" >&2; exit 2; }
  [ "$rc" -le "$worst" ] || worst=$rc
done
t1=$(now)
dirs=(); for ((i = 0; i < procs; i++)); do dirs+=("$out/shard-$i"); done
"$attest" fuzz --merge "${dirs[@]}" --out "$out/merged" > "$out/merged.log" 2>&1
mrc=$?
[ "$mrc" -le 1 ] || { echo "shards.sh: the merge failed:" >&2; cat "$out/merged.log" >&2; exit 2; }
head -1 "$out/merged.log"

single_secs=null
if [ "$single" = 1 ]; then
  s0=$(now)
  "$attest" fuzz "$@" --shard 0/1 --case-log --out "$out/single" --quiet --gpu keep \
    > "$out/single.log" 2>&1
  src=$?
  s1=$(now)
  [ "$src" -le 1 ] || { echo "shards.sh: the single run exited $src:" >&2; tail -5 "$out/single.log" >&2; exit 2; }
  single_secs=$(awk -v a="$s0" -v b="$s1" 'BEGIN { printf "%.3f", b - a }')
  if ! cmp -s "$out/single/fuzz-cases.jsonl" "$out/merged/fuzz-cases.jsonl"; then
    echo "shards.sh: DIFFERENT: the merged case log differs from the single run's:" >&2
    diff "$out/single/fuzz-cases.jsonl" "$out/merged/fuzz-cases.jsonl" | head -10 >&2
    worst=1; mrc=3
  fi
  # Counts per check and the failures (case, check, tensor, message, margin, shrunk case).
  python3 - "$out/single/fuzz-report.json" "$out/merged/fuzz-merged.json" <<'PY' || { worst=1; mrc=3; }
import json, sys
single, merged = (json.load(open(p)) for p in sys.argv[1:3])
strip = lambda checks: {k: {f: v[f] for f in ("cases", "judged", "failures", "baseline_failures")}
                        for k, v in checks.items()}
keys = ("case_index", "check", "tensor", "message", "margin", "original", "shrunk_size")
fails = lambda r: [{k: f.get(k) for k in keys} for f in r["failures"]]
diff = []
if strip(single["checks"]) != strip(merged["checks"]):
    diff.append("per-check counts")
if fails(single) != fails(merged):
    diff.append("failures")
if single["cases_run"] != merged["cases_run"]:
    diff.append("cases run")
if diff:
    print("shards.sh: DIFFERENT: " + ", ".join(diff), file=sys.stderr)
    sys.exit(1)
PY
  [ "$mrc" = 3 ] || echo "shards.sh: the merge of $procs shards equals the single run" \
    "($(wc -l < "$out/merged/fuzz-cases.jsonl") cases, byte-identical case logs)"
fi
cases=$(wc -l < "$out/merged/fuzz-cases.jsonl")
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
cat > "$out/throughput.json" <<JSON
{"procs": $procs, "cases": $cases, "sharded_seconds": $secs, "single_seconds": $single_secs,
 "host": "$(hostname)", "cores": $(nproc)}
JSON
echo "shards.sh: $cases cases, $procs processes in ${secs} s; single: ${single_secs} s"
[ "$mrc" != 3 ] || exit 1
exit "$worst"
