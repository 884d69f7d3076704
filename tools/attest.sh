#!/usr/bin/env bash
# Runs the attest CLI from a source checkout, installing what the CLI needs and building it on
# first use (later calls rebuild incrementally, quietly). Example:
#   tools/attest.sh list kernels
# The first call says each phase on stderr as it starts, and the build shows its own [n/N]
# counter, so that a first run is never silent: the Debian packages the CLI's build needs
# (tools/bootstrap --cli: the CPU checks of built-in kernels need no PyTorch, no test
# framework; the test suite's packages and Python environment come with the README's second
# command), the configuration without tests, the build of the CLI alone, then the run. At the end it says how to run attest again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build/default"
say() { echo "tools/attest.sh: $*" >&2; }
# A line at least every 10 s while a phase runs, whatever the phase itself prints.
ticker=""
tick() {
  local what="$1" start=$SECONDS
  ( while sleep 10; do say "... $what ($((SECONDS - start)) s)"; done ) &
  ticker=$!
}
untick() { [[ -z $ticker ]] || kill "$ticker" 2>/dev/null || true; ticker=""; }
trap untick EXIT
# Python runs its subprocesses with LC_CTYPE=C.UTF-8 where the shell's locale is C or unset
# (PEP 538), pip's build included, and ccache hashes the locale variables: the CLI is built
# under the locale pip's build will have, so that `pip install .` reuses its objects
# (docs/python.md; in a fresh Debian 12 chroot without this it hit none of them).
if [[ -z ${LC_ALL:-} && ${LC_CTYPE:-${LANG:-C}} =~ ^(C|POSIX)$ ]]; then
  export LC_CTYPE=C.UTF-8
fi
first=0
if [[ ! -f "$build/build.ninja" ]]; then
  first=1
  say "1/3 Debian packages the CLI needs (tools/bootstrap --cli; a few minutes when they are" \
      "missing; the tests' packages and PyTorch come with the README's second command)"
  tick "installing Debian packages"
  "$root/tools/bootstrap" --cli >&2
  untick
  say "2/3 configuring the build (cmake --preset default, without tests and benchmarks)"
  tick "configuring"
  # The README's test command configures the same folder again with the preset's tests on.
  cmake --preset default -S "$root" -DATTEST_BUILD_TESTS=OFF -DATTEST_BUILD_BENCH=OFF >/dev/null
  untick
  say "3/3 building the attest CLI (about 4 minutes on 2 cores without a compiler cache:" \
      "110 compile steps, [n/N] is ninja's count of them)"
  tick "building"
  if ! cmake --build "$build" --target attest_cli >&2; then
    say "build failed"
    exit 2
  fi
  untick
elif ! log=$(cmake --build "$build" --target attest_cli 2>&1); then
  echo "$log" >&2
  say "build failed"
  exit 2
fi
if [[ $first == 1 ]]; then
  say "built $build/tools/attest/attest; run it again as tools/attest.sh ARGS, or put it on" \
      "PATH: export PATH=\"$build/tools/attest:\$PATH\""
  if [[ ${1:-} == check ]]; then
    say "running: attest $* (the gate on a built-in kernel: about 30 s on 2 cores; the" \
        "progress line below counts the suite's rows)"
  else
    say "running: attest $*"
  fi
fi
exec "$build/tools/attest/attest" "$@"
