#!/usr/bin/env bash
# Installs the build tree given as $1 into a private prefix, then configures, builds and
# runs tools/install_test as a separate project that finds it with find_package(attest).
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$here" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer"
test -x "$work/prefix/bin/attest"
# The installed NumPy worker answers describe through the installed attest_worker.py.
for w in attest_worker.py numpy_worker.py torch_worker.py torch_backends.py fa4_masks.py; do
  test -f "$work/prefix/share/attest/workers/$w"
done
if python3 -c "import numpy" 2>/dev/null; then
  reply=$(echo '{"op":"describe"}' | (cd / && python3 "$work/prefix/share/attest/workers/numpy_worker.py"))
  grep -q '"status": *"ok"' <<<"$reply" || { echo "installed numpy_worker.py: $reply" >&2; exit 1; }
fi
