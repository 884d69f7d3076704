#!/usr/bin/env bash
# Runs the attest CLI from a source checkout, installing dependencies and building on first
# use (later calls rebuild incrementally, quietly). Example:
#   tools/attest.sh list kernels
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build/default"
if [[ ! -f "$build/build.ninja" ]]; then
  "$root/tools/bootstrap" >&2
  cmake --preset default -S "$root" >/dev/null
fi
if ! log=$(cmake --build "$build" --target attest_cli 2>&1); then
  echo "$log" >&2
  echo "tools/attest.sh: build failed" >&2
  exit 2
fi
exec "$build/tools/attest/attest" "$@"
