#!/usr/bin/env bash
# Installs the build tree given as $1 into a private prefix, MOVES the prefix (the package
# must be relocatable), then configures, builds and runs tools/install_test as a separate
# project that finds it with find_package(attest): its plugin (attest_add_plugin) and its
# GoogleTest tests (<attest/gtest.h>). Also: only the public headers are installed, and the
# exported CMake files name no absolute path.
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "install_test: $*" >&2; exit 1; }
cmake --install "$build" --prefix "$work/staging" >/dev/null
mv "$work/staging" "$work/prefix"
prefix="$work/prefix"

# 1. Public headers only: <attest/check.h>, <attest/gtest.h>, <attest/attest_kernel.h>.
headers=$(cd "$prefix/include" && find . -type f | sort | tr '\n' ' ')
[ "$headers" = "./attest/attest_kernel.h ./attest/check.h ./attest/gtest.h " ] ||
  fail "installed headers are: $headers"

# 2. Relocatable: the exported files name dependencies by target, never by path.
cmake_dir="$prefix/lib/cmake/attest"
[ -f "$cmake_dir/attestTargets.cmake" ] || cmake_dir="$prefix/lib64/cmake/attest"
if grep -nE '(^|[";[:space:]])/[A-Za-z]' "$cmake_dir"/*.cmake | grep -v '^[^:]*:[0-9]*:#'; then
  fail "absolute paths in the exported CMake files (above)"
fi
for src in "$build" "$(cd "$here/../.." && pwd)" "$work/staging"; do
  ! grep -rqF "$src" "$cmake_dir" || fail "the exported CMake files name $src"
done

# 3. A consumer project against the moved prefix.
cmake -S "$here" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer" --gtest_brief=1
test -x "$prefix/bin/attest"
"$prefix/bin/attest" list kernels > /dev/null

# 4. The installed NumPy worker answers describe through the installed attest_worker.py.
for w in attest_worker.py numpy_worker.py torch_worker.py torch_backends.py \
         torch_backends_common.py torch_backends_fa.py torch_backends_flex.py \
         torch_backends_lse.py torch_backends_cudnn_fp8.py fa4_masks.py torch_call.py \
         torch_export.py torch_export_script.py; do
  test -f "$prefix/share/attest/workers/$w"
done
if python3 -c "import numpy" 2>/dev/null; then
  reply=$(echo '{"op":"describe"}' | (cd / && python3 "$prefix/share/attest/workers/numpy_worker.py"))
  grep -q '"status": *"ok"' <<<"$reply" || fail "installed numpy_worker.py: $reply"
fi
echo "install_test: relocated package, public headers, plugin and GoogleTest helper: ok"
