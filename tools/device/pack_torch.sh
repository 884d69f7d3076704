#!/usr/bin/env bash
# pack_torch.sh — run on the build machine (it reaches PyPI; the GPU host does not): puts what
# tools/device/torch_campaign.sh needs on a CUDA host into git-ignored folders, each small
# enough for one transfer of the device tool (64 MiB of disk blocks, the working tree included):
#   .devA/  the attest binary with its libraries (tools/device/pack.sh, zstd-compressed), a
#           zstd binary with its library (the GPU image has none), the small Python wheels of
#           FlashAttention-4 and its dependencies, and the first part of the one large wheel;
#   .devB/, .devC/, ...  the next parts, as many as the tree's size leaves room for (two with
#           a tree of 21 MB, three with one of 26 MB).
# The large wheel, nvidia-cutlass-dsl-libs-cu13 (92 MB, one 193 MB MLIR library inside), is
# unpacked and recompressed with `zstd -15 --long=27` (71 MB), then split. torch_campaign.sh
# stage A unpacks .devA into a stash folder outside the repository; stage S stashes a middle
# part (DEVS=.devB), and stage B, carrying the last folder, joins the parts there: one call
# each, in a row, on the same warm machine. The script prints the calls.
# Usage: tools/device/pack_torch.sh [BUILD_DIR]      (default build/default)
# Versions: flash-attn-4 4.0.0b36 and what it requires (its METADATA Requires-Dist).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build/default}"
cd "$root"
cache="${ATTEST_WHEEL_CACHE:-/tmp/attest-wheels}"
# Each call carries the tracked tree too; the device tool counts disk blocks. What a call may
# carry besides it: 64 MiB less the tree's blocks less 1 MiB of margin.
tree_bytes=$(git ls-files -z | xargs -0 du -c -B1 | tail -1 | cut -f1)
call_bytes=$(( ${ATTEST_CALL_MIB:-64} * 1024 * 1024 - tree_bytes - 1024 * 1024 ))

wheels=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1
        apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5
        einops==0.8.2)
mkdir -p "$cache"
for w in "${wheels[@]}"; do
  name="${w%%==*}"; file_glob="$(echo "$name" | tr - _)-${w##*==}-*.whl"
  ls "$cache"/$file_glob > /dev/null 2>&1 && continue
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$cache" "$w"
done

for d in .devA .devB .devC .devD .devE; do
  grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude
done
rm -rf .devA .devB .devC .devD .devE
mkdir -p .devA/wheels .devA/bin

# 1. attest and its libraries.
tools/device/pack.sh "$build" > /dev/null
tar -C . -cf - .device | zstd -q -12 -T2 -o .devA/attest-device.tar.zst

# 2. zstd itself, with the compression libraries it links (the GPU image has libc, no zstd).
cp "$(command -v zstd)" .devA/bin/
ldd "$(command -v zstd)" | awk '/lib(zstd|z|lzma|lz4)\.so/{print $3}' | while read -r lib; do
  cp -L "$lib" .devA/bin/
done

# 3. The small wheels as they are; the large one unpacked, recompressed and split.
# Only this list's wheels (the cache may hold others, e.g. pack_cudnn_fp8.sh's).
for w in "${wheels[@]}"; do
  name="${w%%==*}"
  # shellcheck disable=SC2046  # the name is a glob pattern: unquoted on purpose
  f="$(ls "$cache"/$(echo "$name" | tr - _)-${w##*==}-*.whl)"
  case "$f" in *libs_cu13*) continue ;; esac
  cp "$f" .devA/wheels/
done
big="$(ls "$cache"/nvidia_cutlass_dsl_libs_cu13-*.whl)"
packed="$cache/$(basename "$big" .whl).tar.zst"
if [ ! -f "$packed" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m zipfile -e "$big" "$tmp/tree"
  tar -C "$tmp/tree" -cf - . | zstd -q -15 --long=27 -T2 -o "$packed.tmp"
  mv "$packed.tmp" "$packed"
fi
# Part 0 fills what .devA leaves of a call; each later part a whole call, in .devB, .devC, ...
used_a=$(du -s -B1 .devA | cut -f1)
total=$(stat -c %s "$packed")
first=$(( call_bytes - used_a - 64 * 1024 ))
[ "$first" -gt 0 ] || { echo "pack_torch.sh: .devA alone fills a call" >&2; exit 2; }
dd if="$packed" of=.devA/cu13.part0 bs=1M iflag=count_bytes status=none count="$first"
offset=$first
n=1
folders=(.devA)
while [ "$offset" -lt "$total" ]; do
  [ "$n" -lt 5 ] || { echo "pack_torch.sh: too many parts for the tree's size" >&2; exit 2; }
  d=".dev$(echo ABCDE | cut -c$(( n + 1 )))"  # .devB, .devC, ... (.devF is pack_cudnn_fp8.sh's)
  mkdir -p "$d"
  dd if="$packed" of="$d/cu13.part$n" bs=1M iflag=skip_bytes,count_bytes status=none \
    skip="$offset" count="$(( call_bytes - 64 * 1024 ))"
  offset=$(( offset + $(stat -c %s "$d/cu13.part$n") ))
  folders+=("$d")
  n=$(( n + 1 ))
done
echo "$n" > .devA/cu13.parts
sha256sum "$packed" | cut -d' ' -f1 > .devA/cu13.sha256
du -sh "${folders[@]}"
echo "calls, in a row on one warm machine: stage A carrying .devA;"
for (( i = 1; i < n - 1; i++ )); do
  echo "  DEVS=${folders[$i]} stage S carrying ${folders[$i]};"
done
echo "  stage B carrying ${folders[$(( n - 1 ))]}."
