#!/usr/bin/env bash
# newcomer_test.sh — a new user's first ten minutes, measured: clones the repository (the
# committed HEAD of this checkout, or REPO) into a fresh folder, runs the README's first
# command there with a timestamp on every line it prints, and reports the time to the first
# line, the longest silent gap, the time to the verdict, and the disk the set-up used. Fails
# (exit 1) when the first line comes after 10 s, a gap passes 30 s, or the command does not
# end with a verdict line; a fresh machine is what it is meant for (on a machine that has the
# packages and a warm ccache it measures less than a newcomer waits).
# Usage: tools/newcomer_test.sh [WORKDIR]   Environment: REPO (default: this checkout).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d "${TMPDIR:-/tmp}/attest-newcomer.XXXXXX")}"
repo="${REPO:-$root}"
git clone -q "$repo" "$work/attest" || { echo "newcomer_test: cannot clone $repo" >&2; exit 2; }
cd "$work/attest" || exit 2
command1="$(sed -n '/^```bash$/{n;p;q}' README.md)"
echo "newcomer_test: $command1"
start=$(date +%s%N)
since() { local ms=$(( ($(date +%s%N) - start) / 1000000 )); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }
# Each line of the command's output (stdout and stderr) with its time since the start.
bash -c "$command1" 2>&1 | while IFS= read -r line; do
  printf '%8s %s\n' "$(since)" "$line"
done > "$work/timeline.txt"
rc=${PIPESTATUS[0]}
end=$(since)
awk -v end="$end" -v rc="$rc" '
  NR == 1 { first = $1 }
  { gap = $1 - prev; if (gap > worst) { worst = gap; at = $0 } prev = $1 }
  END {
    gap = end - prev; if (gap > worst) { worst = gap; at = "(the end)" }
    printf "first line after %.1f s; longest silence %.1f s, before: %s\n", first, worst, at
    printf "exit %d after %.1f s\n", rc, end
    bad = first > 10 || worst > 30
    exit bad
  }' "$work/timeline.txt"
ok=$?
tail -1 "$work/timeline.txt" | grep -Eq " (PASS|FAIL): " || { echo "newcomer_test: no verdict line at the end"; ok=1; }
echo "disk: clone with build $(du -sh "$work/attest" | cut -f1); build/venv: $( [ -d build/venv ] && du -sh build/venv | cut -f1 || echo none)"
[ $ok = 0 ] && echo "newcomer_test: ok" || echo "newcomer_test: FAIL (timeline: $work/timeline.txt)"
exit $ok
