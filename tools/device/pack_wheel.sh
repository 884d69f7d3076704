#!/usr/bin/env bash
# pack_wheel.sh — run on the build machine: fills .devW/ (git-ignored through the repository's
# info/exclude) for tools/device/wheel_gpu_proof.sh: attest's cp312-abi3 wheel with the CUDA
# oracle inside, and the pure-Python wheels the package needs that the GPU image lacks. The
# image has CPython 3.12 with PyTorch, NumPy and pytest (the package's requirements and its
# plugin's), so by default no other wheel travels; EXTRA_WHEELS="name==version ..." adds some
# (pip download, pure Python, no dependencies).
# Usage: tools/device/pack_wheel.sh [WHEEL]
#   WHEEL  an attest-*-cp312-abi3-*.whl (default: the newest under build/default/wheel-dist-cuda/
#          repaired, made by ctest python_wheel_cuda or by this script: tools/python_wheel.sh
#          --abi3 --cuda-oracle on, about 10 minutes here with its proofs)
# Then one call carrying .devW: CALL_SECONDS=420 tools/device/wheel_gpu_proof.sh
# (docs/python.md "Proof on the GPU"). The device tool carries about 8-10 MB besides the tree:
# the script says how big .devW is.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
wheel="${1:-}"
if [ -z "$wheel" ]; then
  dist="$root/build/default/wheel-dist-cuda"
  newest() { local w n=""; for w in "$dist"/repaired/attest-*-cp312-abi3-*.whl; do
               [ -f "$w" ] && { [ -z "$n" ] || [ "$w" -nt "$n" ]; } && n="$w"; done; echo "$n"; }
  wheel="$(newest)"
  if [ -z "$wheel" ]; then
    tools/python_wheel.sh --abi3 --cuda-oracle on "$dist"
    wheel="$(newest)"
  fi
fi
case "$(basename "$wheel")" in
  attest-*-cp312-abi3-*.whl) ;;
  *) echo "pack_wheel.sh: $wheel: not an attest cp312-abi3 wheel" >&2; exit 2 ;;
esac
python3 - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
if "attest/libattest_oracle_cuda.so" not in names:
    print(f"pack_wheel.sh: {sys.argv[1]} has no CUDA oracle (build it where nvcc is: "
          "tools/python_wheel.sh --abi3 --cuda-oracle on)", file=sys.stderr)
    sys.exit(2)
PY
exclude="$(git rev-parse --git-path info/exclude)"
grep -qx '/.devW/' "$exclude" 2> /dev/null || echo '/.devW/' >> "$exclude"
rm -rf .devW
mkdir -p .devW
cp "$wheel" .devW/
for w in ${EXTRA_WHEELS:-}; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation py --platform any -d .devW "$w"
done
ls -l .devW
size=$(du -sb .devW | cut -f1)
echo "pack_wheel.sh: .devW is $(( size / 1024 )) KiB; then, carrying .devW:" \
     "CALL_SECONDS=420 tools/device/wheel_gpu_proof.sh"
if [ "$size" -gt $(( 8 * 1024 * 1024 )) ]; then
  echo "pack_wheel.sh: .devW is over 8 MiB, by $(( (size - 8 * 1024 * 1024) / 1024 )) KiB:" \
       "the device tool may refuse it with the tree" >&2
fi
