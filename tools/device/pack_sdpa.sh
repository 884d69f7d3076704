#!/usr/bin/env bash
# pack_sdpa.sh — run on the build machine: fills .devA/ for tools/device/torch_campaign.sh
# stage A when only PyTorch's own kernels run (the SDPA backends, public and +lse, and
# flex-triton: the GPU image has PyTorch, so no wheels travel): the attest binary with its
# libraries and, where the build made it, libattest_oracle_cuda.so beside it
# (tools/device/pack.sh, zstd-compressed), and a zstd binary with its libraries (the GPU image
# has none). The binaries are packed as BUILD_DIR holds them, built by whoever owns that
# folder (PACK_NO_BUILD=1 for pack.sh; PACK_BUILD=1 builds them first), so the attest that
# runs is the one `BUILD_DIR/tools/attest/attest --version` names.
# Usage: tools/device/pack_sdpa.sh [BUILD_DIR]      (default build/default)
# Then one call, carrying .devA:  RUNS=... FLEX_RUNS= tools/device/torch_campaign.sh A
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build/default}"
cd "$root"
grep -qx '/.devA/' .git/info/exclude 2>/dev/null || echo '/.devA/' >> .git/info/exclude
rm -rf .devA
mkdir -p .devA/bin
if [ "${PACK_BUILD:-0}" = 1 ]; then
  tools/device/pack.sh "$build" > /dev/null
else
  PACK_NO_BUILD=1 tools/device/pack.sh "$build" > /dev/null
fi
tar -C . -cf - .device | zstd -q -12 -T2 -o .devA/attest-device.tar.zst
cp "$(command -v zstd)" .devA/bin/
ldd "$(command -v zstd)" | awk '/lib(zstd|z|lzma|lz4)\.so/{print $3}' | while read -r lib; do
  cp -L "$lib" .devA/bin/
done
"$build/tools/attest/attest" --version > .devA/attest-version.txt
du -sh .devA
ls -l .devA .devA/bin
echo "attest: $(cat .devA/attest-version.txt); oracle on the GPU: $( [ -f .device/libattest_oracle_cuda.so ] && echo packed || echo not built)"
