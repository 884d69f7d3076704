#!/usr/bin/env bash
# aarch64_test.sh HOST_DIGEST CROSS_CXX QEMU OUT_DIR (run from the source root): cross-compiles
# the float64 oracle (reference/oracle: its products, exp, forward and backward, and the
# problem and tensor code they use) and oracle_digest.cc for aarch64, runs it under qemu-user and
# compares its output line for line with HOST_DIGEST's (the same program from the build's own
# compiler): the same bits on aarch64 as on this machine. The products are built twice with
# Highway's static target only (HWY_COMPILE_ONLY_STATIC: no libhwy for aarch64 needed): NEON
# (-march=armv8-a), and SVE (-march=armv8-a+sve) run with 128-bit vectors, and for the products
# alone (`oracle_digest gemm`: qemu emulates longer SVE vectors about 10 x slower) with 256-,
# 512- and 2048-bit ones (qemu's sve-default-vector-length, in bytes). Mirrors libcxx_test.sh.
# Exit 77 (skipped) where CROSS_CXX or QEMU is missing or cannot build and run a program
# (tools/bootstrap installs g++-aarch64-linux-gnu and qemu-user).
set -euo pipefail
host_digest=$1 cxx=$2 qemu=$3 out=$4
start=$SECONDS
mkdir -p "$out"
probe="$out/probe.cc"
echo 'int main() { return 0; }' > "$probe"
if [[ -z "$cxx" || -z "$qemu" ]] || ! "$cxx" "$probe" -o "$out/probe" 2>/dev/null ||
    ! "$qemu" -L /usr/aarch64-linux-gnu "$out/probe"; then
  echo "SKIP: no aarch64 cross compiler and qemu-user that run a program (cxx='$cxx'," \
       "qemu='$qemu'); tools/bootstrap installs g++-aarch64-linux-gnu and qemu-user"
  exit 77
fi
# ccache where installed: a second run compiles nothing.
launcher=()
if command -v ccache > /dev/null; then launcher=(env "CCACHE_BASEDIR=$PWD" ccache); fi
# The sources the float64 oracle reaches. MPFR and fmt are not cross-built: the multiprecision
# oracle falls back to cpp_bin_float (ATTEST_ORACLE_HAVE_MPFR=0, oracle_mp.h) and fmt is used
# header-only; BLAS is not needed (the oracle's products are its own).
srcs=(tools/portability/oracle_digest.cc reference/oracle/oracle_common.cc
      reference/oracle/oracle_bound.cc reference/oracle/oracle_double.cc
      reference/oracle/oracle_double_backward.cc reference/oracle/oracle_exp.cc reference/oracle/oracle_mp128.cc
      reference/oracle/oracle_mp256.cc reference/tensor.cc reference/dtype.cc
      reference/problem/problem.cc reference/problem/paged.cc reference/problem/mask.cc
      reference/problem/tile_walk.cc reference/formats/format.cc
      reference/io/json.cc)
# The oracle's flags for its float64 files (reference/oracle/CMakeLists.txt): aarch64 GCC
# contracts a * b + c into an FMA by default, which these files must not.
strict=" reference/oracle/oracle_double.cc reference/oracle/oracle_double_backward.cc"
strict+=" reference/oracle/oracle_exp.cc "
flags=(-std=c++20 -O2 -I. -DATTEST_ORACLE_HAVE_MPFR=0 -DFMT_HEADER_ONLY)
jobs=()
for src in "${srcs[@]}"; do
  extra=""
  [[ "$strict" == *" $src "* ]] && extra="-ffp-contract=off -fno-trapping-math"
  jobs+=("$src|$extra|$out/$(echo "$src" | tr / _).o")
done
for isa in neon:-march=armv8-a sve:-march=armv8-a+sve; do
  jobs+=("reference/oracle/oracle_gemm.cc|-ffp-contract=off -fno-trapping-math ${isa#*:} \
-DHWY_COMPILE_ONLY_STATIC=1|$out/oracle_gemm_${isa%%:*}.o")
done
# And once as the aarch64 build of the library compiles it, for every target Highway attains there
# (NEON, SVE, SVE2, SVE_256, SVE2_128: one source): compiled only, since linking its dynamic
# dispatch needs libhwy built for aarch64.
jobs+=("reference/oracle/oracle_gemm.cc|-ffp-contract=off -fno-trapping-math|\
$out/oracle_gemm_dispatch.o")
printf '%s\n' "${jobs[@]}" | xargs -P "$(nproc)" -I{} bash -c \
  'IFS="|" read -r src extra obj <<< "$1"; shift; "$@" $extra -c "$src" -o "$obj"' \
  _ {} "${launcher[@]}" "$cxx" "${flags[@]}"
objs=()
for src in "${srcs[@]}"; do objs+=("$out/$(echo "$src" | tr / _).o"); done
"$cxx" "${objs[@]}" "$out/oracle_gemm_neon.o" -pthread -o "$out/oracle_digest_neon"
"$cxx" "${objs[@]}" "$out/oracle_gemm_sve.o" -pthread -o "$out/oracle_digest_sve"
targets=$("${cxx/g++/nm}" -C "$out/oracle_gemm_dispatch.o" | grep -o 'N_[A-Z0-9_]*::IsaHere' |
          sed 's/^N_//; s/::IsaHere//' | sort -u | tr '\n' ' ' || true)
echo "built in $((SECONDS - start)) s; the dispatching build has the kernel for: $targets"
"$host_digest" > "$out/host.txt"
# The five runs at once (qemu-user is one process each, single-threaded here but for the
# oracle's two workers), then their results in order.
runs=("neon max,sve=off $out/oracle_digest_neon"
      "sve128 max,sve-default-vector-length=16 $out/oracle_digest_sve"
      "sve256-gemm max,sve-default-vector-length=32 $out/oracle_digest_sve gemm"
      "sve512-gemm max,sve-default-vector-length=64 $out/oracle_digest_sve gemm"
      "sve2048-gemm max,sve-default-vector-length=256 $out/oracle_digest_sve gemm")
t0=$SECONDS
pids=()
for r in "${runs[@]}"; do
  read -r name cpu bin args <<< "$r"
  # shellcheck disable=SC2086
  "$qemu" -L /usr/aarch64-linux-gnu -cpu "$cpu" "$bin" $args > "$out/$name.txt" \
    2> "$out/$name.err" &
  pids+=($!)
done
fail=0
grep '^gemm ' "$out/host.txt" > "$out/host_gemm.txt"
for i in "${!runs[@]}"; do
  read -r name cpu bin args <<< "${runs[$i]}"
  if ! wait "${pids[$i]}"; then
    cat "$out/$name.err"
    echo "FAIL: $name: oracle_digest failed under qemu"
    fail=1
    continue
  fi
  echo "$name: $(wc -l < "$out/$name.txt") results ($(tr -d '\n' < "$out/$name.err"))"
  want="$out/host.txt"
  [[ "$args" == gemm ]] && want="$out/host_gemm.txt"
  if ! diff -u "$want" "$out/$name.txt"; then
    echo "FAIL: $name: the oracle's results above differ from this machine's"
    fail=1
  fi
done
echo "qemu runs: $((SECONDS - t0)) s"
if ((fail)); then exit 1; fi
echo "ok: $(wc -l < "$out/host.txt") oracle results bitwise the same on aarch64 (NEON, SVE at" \
     "128 bits; the products also at SVE 256, 512, 2048 bits) under" \
     "$("$qemu" --version | head -1) as on this machine" \
     "($("$host_digest" 2>&1 > /dev/null | tr -d '\n')); $((SECONDS - start)) s"
