#!/usr/bin/env bash
# pack_torch.sh — run on the build machine (it reaches PyPI; the GPU host does not): puts what
# tools/device/torch_campaign.sh needs on a CUDA host into two git-ignored folders, each small
# enough for one transfer of the device tool (64 MiB with the working tree):
#   .devA/  the attest binary with its libraries (tools/device/pack.sh, zstd-compressed), a
#           zstd binary with its library (the GPU image has none), the small Python wheels of
#           FlashAttention-4 and its dependencies, and the first part of the one large wheel;
#   .devB/  the second part.
# The large wheel, nvidia-cutlass-dsl-libs-cu13 (92 MB, one 193 MB MLIR library inside), is
# unpacked and recompressed with `zstd -15 --long=27` (71 MB), then split. torch_campaign.sh
# stage A unpacks .devA into a stash folder outside the repository; stage B, the next call on
# the same warm machine, joins the two parts there.
# Usage: tools/device/pack_torch.sh [BUILD_DIR]      (default build/default)
# Versions: flash-attn-4 4.0.0b36 and what it requires (its METADATA Requires-Dist).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build/default}"
cd "$root"
cache="${ATTEST_WHEEL_CACHE:-/tmp/attest-wheels}"
# Each call carries the tracked tree too (about 21 MB) within the device tool's 64 MiB: with
# the 71 MB wheel split at 25 MiB, .devA (attest, zstd, the small wheels, part 0) is about
# 44 MB and .devB about 45 MB. A tracked tree past about 22 MB no longer fits two calls.
part_a_mb="${ATTEST_PART_A_MB:-25}"

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

for d in .devA .devB; do
  grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude
done
rm -rf .devA .devB
mkdir -p .devA/wheels .devA/bin .devB

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
  name="${w%%==*}"; f="$(ls "$cache"/$(echo "$name" | tr - _)-${w##*==}-*.whl)"
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
bytes_a=$(( part_a_mb * 1024 * 1024 ))
head -c "$bytes_a" "$packed" > .devA/cu13.part0
tail -c +"$(( bytes_a + 1 ))" "$packed" > .devB/cu13.part1
sha256sum "$packed" | cut -d' ' -f1 > .devA/cu13.sha256
du -sh .devA .devB
