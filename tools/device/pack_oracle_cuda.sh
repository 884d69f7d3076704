#!/usr/bin/env bash
# pack_oracle_cuda.sh — run on the build machine: puts what tools/device/oracle_cuda.sh needs on
# a GPU host into .devO/ (ignored by git through its own .gitignore; carry it to the host):
# the CUDA oracle library (reference/oracle/cuda/, built by nvcc), its check and bench program
# oracle_cuda_check, the attest binary (for `attest oracle --device cuda`), bench/fp64_rates.cu
# built by nvcc, and every shared library they need except the C library, split as
# tools/device/pack.sh does (lib/: their own dependencies; compat/: the C++ runtime, used only
# when the host's is older; glibc/: this machine's C library and loader, used only when the
# host's glibc is too old). The GPU host builds nothing.
# Usage: tools/device/pack_oracle_cuda.sh [BUILD_DIR]   (default: build/default, configured
# Release with ATTEST_CUDA on and nvcc found)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build/default}"
cd "$root"
cmake --build "$build" --target attest_cli oracle_cuda_check attest_oracle_cuda -j1 > /dev/null
so="$build/reference/oracle/cuda/libattest_oracle_cuda.so"
check="$build/reference/oracle/cuda/oracle_cuda_check"
bin="$build/tools/attest/attest"
for f in "$so" "$check" "$bin"; do
  [ -f "$f" ] || { echo "pack_oracle_cuda.sh: no $f (ATTEST_CUDA off, no nvcc?)" >&2; exit 2; }
done

out=.devO
rm -rf "$out"
mkdir -p "$out/lib" "$out/compat" "$out/glibc"
echo '*' > "$out/.gitignore"
cp "$so" "$check" "$bin" "$out/"
# bench/fp64_rates.cu (the GPU's FP64 ceilings, tools/device/oracle_cuda_profile.sh runs it).
nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
"$nvcc_bin" -O3 -arch="${ARCH:-sm_90}" -o "$out/fp64_rates" bench/fp64_rates.cu
strip --strip-unneeded "$out/oracle_cuda_check" "$out/attest"
for f in "$check" "$bin" "$so"; do
  ldd "$f" | awk '/=> \//{print $1" "$3}'
done | sort -u | while read -r name path; do
  case "$name" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*)
      cp -L "$path" "$out/glibc/$name" ;;
    libstdc++.so.*|libgcc_s.so.*) cp -L "$path" "$out/compat/$name" ;;
    libcuda.so.*) ;;  # the host's driver, never packed
    *) cp -L "$path" "$out/lib/$name" ;;
  esac
done
loader="$(ldd "$bin" | awk '/ld-linux/{print $1}')"
cp -L "$loader" "$out/glibc/"
cat > "$out/run.sh" <<'WRAP'
#!/usr/bin/env bash
# run.sh PROGRAM ARGS...: PROGRAM (oracle_cuda_check or attest) of this folder with the
# libraries packed beside it: the host's C and C++ runtimes when they are recent enough, else
# the packed ones (tools/device/pack_oracle_cuda.sh).
here="$(cd "$(dirname "$0")" && pwd)"
prog="$here/$1"
shift
export ATTEST_ORACLE_CUDA="${ATTEST_ORACLE_CUDA:-$here/libattest_oracle_cuda.so}"
probe() { "$@" --probe > /dev/null 2>&1 || "$@" --version > /dev/null 2>&1; }
lib="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if probe env LD_LIBRARY_PATH="$lib" "$prog"; then
  LD_LIBRARY_PATH="$lib" exec "$prog" "$@"
elif probe env LD_LIBRARY_PATH="$here/lib:$here/compat:$lib" "$prog"; then
  LD_LIBRARY_PATH="$here/lib:$here/compat:$lib" exec "$prog" "$@"
else
  echo "run.sh: the host's glibc is too old; running with the packed one" >&2
  exec "$here/glibc/ld-linux-x86-64.so.2" --library-path \
    "$here/lib:$here/compat:$here/glibc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$prog" "$@"
fi
WRAP
chmod +x "$out/run.sh"
# Both routes must start here (the probe exits 0 without touching CUDA).
"$out/run.sh" oracle_cuda_check --probe
"$out/glibc/ld-linux-x86-64.so.2" --library-path "$out/lib:$out/compat:$out/glibc" \
  "$out/oracle_cuda_check" --probe
echo "packed: $(du -sh "$out" | cut -f1) in $out/ ($(ls "$out/lib" | wc -l) libraries)"
ls -l "$out" "$out"/*/
