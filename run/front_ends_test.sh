#!/usr/bin/env bash
# ctest front_ends_test: one suite through the three front ends of the run layer (run/
# check_run.h) — `attest check --json`, the Python package's attest.check(...).to_json() and
# the public C++ API's RunChecks(...).json (run/front_ends_json.cc) — must give byte-identical
# JSON reports and the same exit code, for a correct kernel (exit 0) and a seeded bug (exit 1,
# failing cases saved: the same files, named alike, in the same folder).
# Usage: front_ends_test.sh ATTEST FRONT_ENDS_JSON PYTHON PYTHONPATH
set -uo pipefail
attest="$1" cxx="$2" python="$3" pypath="$4"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }

for spec in "cpu/flash2-bf16 quick 7 0" "mutant/lse-log2 quick 7 1"; do
  read -r kernel suite seed want <<< "$spec"
  out="$work/failures"  # one folder for the three runs: the reports name the files saved there
  rm -rf "$out"
  "$attest" check --kernel "$kernel" --suite "$suite" --seed "$seed" --out "$out" --quiet \
    --json "$work/cli.json" > /dev/null
  rc_cli=$?
  rm -rf "$out"
  PYTHONPATH="$pypath" "$python" - "$kernel" "$suite" "$seed" "$out" "$work/py.json" <<'PY'
import sys
import attest
kernel, suite, seed, out, path = sys.argv[1:]
r = attest.check(kernel, suite=suite, seed=int(seed), failure_dir=out)
open(path, "w", encoding="utf-8", newline="").write(r.to_json())
sys.exit(r.exit_code)
PY
  rc_py=$?
  rm -rf "$out"
  "$cxx" "$kernel" "$suite" "$seed" "$out" "$work/cxx.json"
  rc_cxx=$?
  echo "$kernel $suite seed $seed: exit codes cli $rc_cli, python $rc_py, c++ $rc_cxx (want $want)"
  [ "$rc_cli" = "$want" ] && [ "$rc_py" = "$want" ] && [ "$rc_cxx" = "$want" ] ||
    fail "$kernel: exit codes differ from $want"
  for f in py cxx; do
    if cmp -s "$work/cli.json" "$work/$f.json"; then
      echo "  $f.json: identical to cli.json ($(wc -c < "$work/cli.json") bytes)"
    else
      fail "$kernel: $f.json differs from cli.json"
      diff "$work/cli.json" "$work/$f.json" | head -20
    fi
  done
done
[ $status = 0 ] && echo "front_ends_test: ok"
exit $status
