#!/usr/bin/env bash
# python_wheel.sh — builds the Python package's wheels (pyproject.toml: scikit-build-core and
# nanobind, `pip wheel .`), repairs them with auditwheel so that they carry the shared libraries
# they link (MPFR, GMP, fmt), and proves that a repaired wheel installs and runs in a
# fresh virtual environment that has none of the build's Python packages, loading those
# libraries from the wheel and none from the system (python/tests/wheel_proof.py: the API, the
# pytest plugin by its entry point, the `attest` command).
#
# Usage: tools/python_wheel.sh [--abi3] [--cuda-oracle auto|on|off] [--cli ATTEST] [--chroot DIR]
#                              [OUT_DIR]
#   (no --abi3)  the cp311 wheel, built by tools/bootstrap's build/venv (CPython 3.11);
#                OUT_DIR defaults to build/wheel-dist
#   --abi3       the cp312-abi3 wheel (stable ABI: one wheel for CPython 3.12 and later,
#                docs/python.md), built by the oldest CPython >= 3.12 found (ATTEST_ABI3_PYTHON,
#                python3.12, python3.13, ... on PATH, pyenv's versions) in build/venv-abi3 (made
#                here: the nanobind and scikit-build-core that tools/bootstrap pins), checked by
#                abi3audit (every Python symbol it imports is in 3.12's stable ABI) and proven in
#                a fresh venv of every CPython >= 3.12 found; OUT_DIR defaults to
#                build/wheel-dist-abi3. Exit 77 where no CPython >= 3.12 is found.
#   --cuda-oracle auto|on|off  the CUDA oracle in the wheel (ATTEST_WHEEL_CUDA_ORACLE,
#                reference/oracle/cuda/CMakeLists.txt): auto (the default, as `pip install .`)
#                where nvcc is found, on (nvcc required), off (a CPU-only wheel). Where the wheel
#                has it, the script checks that auditwheel kept it and that it needs no CUDA
#                library but the driver's (its NEEDED entries), and the proof that the package
#                loads it
#   --cli ATTEST the CMake build's tools/attest/attest: the wheel's `attest` must give the same
#                exit codes, outputs and files (wheel_proof.py's COMMANDS)
#   --chroot DIR also prove the wheel inside DIR, a chroot of another distribution with python3
#                and python3-venv (as root: /proc is mounted there for the run); skipped with a
#                message where DIR has no python3. --make-chroot DIR makes a Debian 13 one
#                (debootstrap; about 3 minutes, docs/python.md) and exits.
# The build folder is OUT_DIR/build; with ccache (tools/bootstrap) it reuses the objects of
# earlier builds. The test venvs get NumPy and pytest from PyPI or pip's cache.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
abi3=0 cli="" chroot="" out_arg="" cuda_oracle=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --abi3) abi3=1 ;;
    --cli) cli="$(realpath "$2")"; shift ;;
    --cuda-oracle)
      case "$2" in auto|on|off) cuda_oracle="$2" ;;
        *) echo "python_wheel.sh: --cuda-oracle $2: not auto, on or off" >&2; exit 2 ;;
      esac
      shift ;;
    --chroot) chroot="$2"; shift ;;
    --make-chroot)
      dir="$2"; start=$SECONDS
      debootstrap --variant=minbase trixie "$dir" http://deb.debian.org/debian
      chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        DEBIAN_FRONTEND=noninteractive sh -c \
        'apt-get update -q && apt-get install -y -q --no-install-recommends python3 python3-venv'
      echo "python_wheel.sh: $dir (Debian 13, $(chroot "$dir" python3 --version)) in" \
           "$((SECONDS - start)) s"
      exit 0 ;;
    -*) echo "python_wheel.sh: unknown option $1" >&2; exit 2 ;;
    *) out_arg="$1" ;;
  esac
  shift
done
pytest_pin="pytest==8.4.2"  # tools/bootstrap's
start=$SECONDS

# CPython interpreters >= 3.12 (not free-threaded: the stable ABI is not theirs, PEP 703), one
# per minor version, oldest first, as "MINOR PATH" lines.
abi3_pythons() {
  local c seen=" " v
  for c in ${ATTEST_ABI3_PYTHON:-} $(compgen -c python3.1 | sort -u) \
           "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1*/bin/python3; do
    v="$("$c" -c 'import sys, sysconfig
ok = sys.implementation.name == "cpython" and sys.version_info >= (3, 12) \
     and not sysconfig.get_config_var("Py_GIL_DISABLED")
print(sys.version_info.minor if ok else "")' 2>/dev/null)" || continue
    [ -n "$v" ] && [[ "$seen" != *" $v "* ]] || continue
    seen+="$v "
    echo "$v $(command -v "$c")"
  done | sort -n
}

if [ "$abi3" = 1 ]; then
  out="${out_arg:-$root/build/wheel-dist-abi3}"
  mapfile -t pythons < <(abi3_pythons)
  if [ ${#pythons[@]} = 0 ]; then
    echo "python_wheel.sh --abi3: no CPython >= 3.12 found (set ATTEST_ABI3_PYTHON)" >&2
    exit 77
  fi
  build_python="${pythons[0]#* }"
  venv="$root/build/venv-abi3"
  pins="nanobind==2.9.2 scikit-build-core==0.11.6 abi3audit==0.0.26"
  if [ "$(cat "$venv/.attest-pypi" 2>/dev/null)" != "$build_python $pins" ]; then
    rm -rf "$venv"
    "$build_python" -m venv "$venv"
    # shellcheck disable=SC2086
    "$venv/bin/python3" -m pip install -q --disable-pip-version-check $pins
    echo "$build_python $pins" > "$venv/.attest-pypi"
  fi
  py="$venv/bin/python3"
else
  out="${out_arg:-$root/build/wheel-dist}"
  py="$root/build/venv/bin/python3"
  [ -x "$py" ] || { echo "python_wheel.sh: no $py (run tools/bootstrap)" >&2; exit 2; }
fi
mkdir -p "$out" && out="$(cd "$out" && pwd)"
rm -rf "$out/raw" "$out/repaired" "$out"/venv* "$out/proof"

# 1. The wheel, built against the venv's scikit-build-core and nanobind (no isolated build
# environment: the pinned nanobind, and no download), with the compilers a plain CMake
# configure picks (cc, c++; a build under pip otherwise got g++): ccache hashes the compiler's
# name, so that only the same name reuses the main build's objects.
export CC="${CC:-cc}" CXX="${CXX:-c++}"
"$py" -m pip wheel "$root" --no-build-isolation --no-deps -q -w "$out/raw" \
  -C build-dir="$out/build" -C cmake.define.ATTEST_WHEEL_CUDA_ORACLE="${cuda_oracle^^}"
raw="$(ls "$out"/raw/attest-*.whl)"
echo "built $(basename "$raw") with $("$py" --version) in $((SECONDS - start)) s"
if [ "$abi3" = 1 ]; then
  case "$raw" in *-cp312-abi3-*) ;; *) echo "python_wheel.sh: not cp312-abi3: $raw" >&2; exit 1 ;; esac
fi

# 2. auditwheel (tools/bootstrap's venv; it repairs a wheel of any Python): the libraries the
# extension links, copied into the wheel (attest.libs/) with the RPATH pointing there; the
# platform tag is the oldest manylinux policy its symbols allow.
PATH="$root/build/venv/bin:$PATH" "$root/build/venv/bin/python3" -m auditwheel repair \
  -w "$out/repaired" "$raw" 2>&1 | grep -v "^INFO:" || true
wheel="$(ls "$out"/repaired/attest-*.whl)"
echo "repaired: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"

# 2b. The CUDA oracle: in the wheel as --cuda-oracle says (auto: where nvcc is, as CMake finds
# it), kept by auditwheel (loaded with dlopen, it is no extension's dependency), and needing
# at run time the C and C++ runtimes (which manylinux allows) and, through the static CUDA
# runtime's own dlopen, the driver's libcuda.so.1: no libcudart or other CUDA library.
has_oracle=no
case "$cuda_oracle" in
  on) has_oracle=yes ;;
  auto) { command -v nvcc || [ -x /usr/local/cuda/bin/nvcc ]; } > /dev/null && has_oracle=yes ;;
esac
oracle_tmp="$out/oracle-check"
rm -rf "$oracle_tmp" && mkdir -p "$oracle_tmp"
"$py" - "$wheel" "$oracle_tmp" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for i in z.infolist():
    if i.filename == "attest/libattest_oracle_cuda.so":
        z.extract(i, sys.argv[2])
        print(f"  {i.filename}: {i.file_size} bytes, {i.compress_size} in the wheel")
PY
oracle_so="$oracle_tmp/attest/libattest_oracle_cuda.so"
if [ "$has_oracle" = yes ]; then
  [ -f "$oracle_so" ] || { echo "python_wheel.sh: no CUDA oracle in $wheel" >&2; exit 1; }
  needed="$(readelf -d "$oracle_so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | xargs)"
  for lib in $needed; do
    case "$lib" in
      libstdc++.so.6|libgcc_s.so.1|libc.so.6|libm.so.6|ld-linux-x86-64.so.2) ;;
      *) echo "python_wheel.sh: the CUDA oracle needs $lib (NEEDED: $needed)" >&2; exit 1 ;;
    esac
  done
  grep -q "libcuda\.so\.1" "$oracle_so" ||
    { echo "python_wheel.sh: the CUDA oracle does not name libcuda.so.1" >&2; exit 1; }
  echo "  NEEDED: $needed; libcuda.so.1 opened by the static CUDA runtime"
  # auditwheel show reads every ELF file of the wheel, the oracle's too: its platform tag.
  show="$(PATH="$root/build/venv/bin:$PATH" "$root/build/venv/bin/python3" -m auditwheel show \
          "$wheel" 2>&1 | tr '\n' ' ')"
  [[ "$show" =~ tag:\ \"([a-z0-9_]+)\" ]] ||
    { echo "python_wheel.sh: auditwheel show: $show" >&2; exit 1; }
  echo "  auditwheel show: the wheel, the CUDA oracle included, is ${BASH_REMATCH[1]}"
else
  [ ! -f "$oracle_so" ] || { echo "python_wheel.sh: a CUDA oracle in $wheel" >&2; exit 1; }
fi

# 3. abi3audit: every CPython symbol the stable-ABI module imports belongs to the stable ABI
# of 3.12 or older (PEP 384, PEP 652: Misc/stable_abi.toml), and none is newer than its tag.
if [ "$abi3" = 1 ]; then
  "$venv/bin/abi3audit" --strict --summary "$wheel"
fi

# 4. The proofs: a fresh venv (no site packages of the build) per interpreter, with the wheel,
# NumPy and pytest alone.
prove() {  # prove PYTHON NAME [wheel_proof.py options]
  local python="$1" name="$2"; shift 2
  "$python" -m venv "$out/venv-$name"
  "$out/venv-$name/bin/python3" -m pip install -q --disable-pip-version-check "$wheel" \
    "$pytest_pin"
  env -u PYTHONPATH -u LD_LIBRARY_PATH -u ATTEST_ORACLE_CUDA "$out/venv-$name/bin/python3" \
    "$root/python/tests/wheel_proof.py" --work "$out/proof/$name" \
    --cuda-oracle "$has_oracle" "$@"
}
cli_args=()
[ -n "$cli" ] && cli_args=(--cli "$cli")
if [ "$abi3" = 1 ]; then
  for p in "${pythons[@]}"; do
    prove "${p#* }" "3.${p%% *}" "${cli_args[@]}"
  done
else
  prove "$("$py" -c 'import sys; print(sys._base_executable)')" "3.11" "${cli_args[@]}"
fi

# 5. In a chroot of another distribution: its own CPython and C library, nothing of this one.
if [ -n "$chroot" ]; then
  if [ ! -x "$chroot/usr/bin/python3" ]; then
    echo "python_wheel.sh: chroot proof skipped: no $chroot/usr/bin/python3 (make one with" \
         "tools/python_wheel.sh --make-chroot $chroot)"
  else
    stage="$chroot/tmp/attest-wheel"
    rm -rf "$stage" && mkdir -p "$stage"
    cp "$wheel" "$root/python/tests/wheel_proof.py" "$root/tools/workers/numpy_worker.py" \
      "$root/tools/workers/attest_worker.py" "$stage/"
    cp /etc/ssl/certs/ca-certificates.crt "$stage/ca.crt"  # pip behind this machine's proxy
    mountpoint -q "$chroot/proc" || { mount -t proc proc "$chroot/proc"; \
      trap 'umount "$chroot/proc"' EXIT; }
    chroot "$chroot" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root \
      PIP_CERT=/tmp/attest-wheel/ca.crt sh -ec "
        cd /tmp/attest-wheel
        echo \"chroot $chroot: \$(. /etc/os-release; echo \$PRETTY_NAME),\" \
             \"\$(python3 --version), \$(ldd --version | head -1)\"
        python3 -m venv venv
        venv/bin/python3 -m pip install -q --disable-pip-version-check $(basename "$wheel") \
          $pytest_pin
        venv/bin/python3 wheel_proof.py --work /tmp/attest-wheel/work \
          --cuda-oracle $has_oracle --workers /tmp/attest-wheel"
  fi
fi
echo "python_wheel.sh: ok in $((SECONDS - start)) s"
