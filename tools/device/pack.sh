#!/usr/bin/env bash
# pack.sh — run on the build machine: puts a Release `attest` binary and every shared library
# it needs except glibc's into .device/ (git-ignored through .git/info/exclude), so that a GPU
# host without Debian's development packages can run it (tools/device/gpu_gate.sh).
# Usage: tools/device/pack.sh [BUILD_DIR]   (default: build/p1; configured Release)
# PACK_EXTRA="bench/oracle_bench ...": more programs of the build (paths under BUILD_DIR), each
# packed beside attest, its libraries that attest lacks in .device/extra-lib/ (off attest's
# path, so that a Python worker attest starts never sees them; tools/device/oracle_e2e.sh puts
# it on the path of the programs it runs).
# PACK_NO_BUILD=1: pack the binaries BUILD_DIR already holds, building nothing (for a build
# folder that someone else builds: a second build running beside theirs would corrupt it).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build/p1}"
cd "$root"
build_target() {  # target: made up to date unless PACK_NO_BUILD=1
  [ "${PACK_NO_BUILD:-0}" = 1 ] || cmake --build "$build" --target "$1" -j2 > /dev/null
}
build_target attest_cli
bin="$build/tools/attest/attest"
[ -x "$bin" ] || { echo "pack.sh: no attest binary at $bin" >&2; exit 2; }
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude

rm -rf .device
mkdir -p .device/lib .device/compat .device/glibc
cp "$bin" .device/attest
strip --strip-unneeded .device/attest
# lib/: attest's own dependencies. compat/: the C++ runtime, used only when the host's is
# older than the build's (a newer host runtime also serves plugins compiled there).
# glibc/: this machine's C library and loader, used only when the host's glibc is too old.
ldd "$bin" | awk '/=> \//{print $1" "$3}' | while read -r name path; do
  case "$name" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*)
      cp -L "$path" ".device/glibc/$name" ;;
    libstdc++.so.*|libgcc_s.so.*) cp -L "$path" ".device/compat/$name" ;;
    *) cp -L "$path" ".device/lib/$name" ;;
  esac
done
for extra in ${PACK_EXTRA:-}; do
  build_target "$(basename "$extra")"
  cp "$build/$extra" .device/
  strip --strip-unneeded ".device/$(basename "$extra")"
  ldd "$build/$extra" | awk '/=> \//{print $1" "$3}' | while read -r name path; do
    case "$name" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*)
        cp -L "$path" ".device/glibc/$name" ;;
      libstdc++.so.*|libgcc_s.so.*) cp -L "$path" ".device/compat/$name" ;;
      *) [ -f ".device/lib/$name" ] || { mkdir -p .device/extra-lib
                                         cp -L "$path" ".device/extra-lib/$name"; } ;;
    esac
  done
done
# The CUDA float64 oracle, where the build made it (ATTEST_CUDA with nvcc): beside attest, where
# reference/oracle/cuda/oracle_cuda_host.cc looks first, so that `attest check` runs the
# oracle on the GPU for a CUDA kernel (--oracle-device auto). It carries its CUDA runtime.
cuda_oracle="$build/reference/oracle/cuda/libattest_oracle_cuda.so"
if [ -f "$cuda_oracle" ]; then
  build_target attest_oracle_cuda
  cp "$cuda_oracle" .device/
fi
loader="$(ldd "$bin" | awk '/ld-linux/{print $1}')"
cp -L "$loader" .device/glibc/
cat > .device/attest.sh <<'WRAP'
#!/usr/bin/env bash
# attest with the libraries packed beside it (tools/device/pack.sh): the host's C and C++
# runtimes when they are recent enough, else the packed ones.
here="$(cd "$(dirname "$0")" && pwd)"
try() { "$@" list kernels > /dev/null 2>&1; }
if try env LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$here/attest"; then
  export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  exec "$here/attest" "$@"
elif try env LD_LIBRARY_PATH="$here/lib:$here/compat${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$here/attest"; then
  export LD_LIBRARY_PATH="$here/lib:$here/compat${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  exec "$here/attest" "$@"
else
  echo "attest.sh: the host's glibc is too old; running with the packed one" >&2
  exec "$here/glibc/ld-linux-x86-64.so.2" --library-path \
    "$here/lib:$here/compat:$here/glibc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$here/attest" "$@"
fi
WRAP
chmod +x .device/attest.sh
.device/attest.sh list kernels > /dev/null
# The third route must work too (it is the one a host with an older glibc takes).
.device/glibc/ld-linux-x86-64.so.2 --library-path .device/lib:.device/compat:.device/glibc \
  .device/attest list kernels > /dev/null
echo "packed: $(du -sh .device | cut -f1) in .device/ ($(ls .device/lib | wc -l) libraries)"
ls -l .device .device/*/
