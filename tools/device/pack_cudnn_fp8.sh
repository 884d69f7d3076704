#!/usr/bin/env bash
# pack_cudnn_fp8.sh — run on the build machine (it reaches PyPI; the GPU host does not): puts what
# stage F of tools/device/torch_campaign.sh needs on a CUDA host into the git-ignored .devF/
# (one transfer of the device tool, 64 MiB with the working tree):
#   the attest binary with its libraries (tools/device/pack.sh, zstd-compressed), a zstd binary
#   with its libraries (the GPU image has none), and the cuDNN frontend's wheel (11.6 MB; its
#   FP8 SDPA needs cuDNN >= 9.14, which the GPU image's PyTorch brings).
# Usage: tools/device/pack_cudnn_fp8.sh [BUILD_DIR]      (default build/default, Release)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build/default}"
cd "$root"
cache="${ATTEST_WHEEL_CACHE:-/tmp/attest-wheels}"
wheel=nvidia-cudnn-frontend==1.32.0
mkdir -p "$cache"
ls "$cache"/nvidia_cudnn_frontend-1.32.0-*.whl > /dev/null 2>&1 ||
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 -d "$cache" "$wheel"
grep -qx "/.devF/" .git/info/exclude 2>/dev/null || echo "/.devF/" >> .git/info/exclude
rm -rf .devF
mkdir -p .devF/wheels .devF/bin
tools/device/pack.sh "$build" > /dev/null
tar -C . -cf - .device | zstd -q -12 -T2 -o .devF/attest-device.tar.zst
cp "$(command -v zstd)" .devF/bin/
ldd "$(command -v zstd)" | awk '/lib(zstd|z|lzma|lz4)\.so/{print $3}' | while read -r lib; do
  cp -L "$lib" .devF/bin/
done
cp "$cache"/nvidia_cudnn_frontend-1.32.0-*.whl .devF/wheels/
du -sh .devF
