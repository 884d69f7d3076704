#!/usr/bin/env bash
# libcxx_test.sh GCC_CONTENT_IDS CLANGXX OUT_DIR (run from the source root): builds content_ids
# with clang and libc++ from the same sources as the build's own (GCC and libstdc++), runs both
# on every case file under golden/ and fails on the first line that differs. Those lines are
# the perturbation seed, the inputs' SHA-256 and the failure file name of each case: the same
# case file must give the same ones under any compiler and standard library (std::hash, which
# named files and seeded perturbations before, differs between the two libraries).
# Exit 77 (skipped) where CLANGXX cannot build against libc++.
set -euo pipefail
gcc_ids=$1 clangxx=$2 out=$3
mkdir -p "$out"
probe="$out/probe.cc"
echo '#include <version>
int main() { return _LIBCPP_VERSION > 0 ? 0 : 1; }' > "$probe"
if [[ -z "$clangxx" ]] || ! "$clangxx" -std=c++20 -stdlib=libc++ "$probe" -o "$out/probe" \
    2>/dev/null || ! "$out/probe"; then
  echo "SKIP: no clang++ that builds against libc++ ($clangxx); tools/bootstrap installs libc++-19-dev"
  exit 77
fi
# The sources content_ids.cc reaches (reference/ and verify/report/repro.cc); fmt header-only, since
# the system's libfmt is built against libstdc++.
srcs=(tools/portability/content_ids.cc verify/report/repro.cc reference/golden/sha256.cc
      reference/case/inputs.cc reference/case/case_file.cc reference/problem/problem.cc
      reference/problem/paged.cc reference/problem/mask.cc reference/problem/budget.cc
      reference/data/generate.cc reference/data/generate_paged.cc
      reference/data/element_stream.cc reference/io/json.cc reference/io/files.cc reference/io/safetensors.cc
      reference/formats/format.cc reference/dtype.cc reference/tensor.cc)
printf '%s\n' "${srcs[@]}" | xargs -P "$(nproc)" -I{} sh -c \
  '"$0" -std=c++20 -stdlib=libc++ -O2 -DFMT_HEADER_ONLY -I. -c "$1" -o "$2/$(echo "$1" | tr / _).o"' \
  "$clangxx" {} "$out"
# Link the objects of this list only: a build folder may still hold objects of sources that
# have since moved.
objs=()
for src in "${srcs[@]}"; do objs+=("$out/$(echo "$src" | tr / _).o"); done
"$clangxx" -stdlib=libc++ "${objs[@]}" -o "$out/content_ids"
# grep reads ldd's whole output (no -q): with pipefail, grep -q exiting at the first match can
# kill ldd with SIGPIPE and fail the pipeline (seen once under load in CI).
if ! ldd "$out/content_ids" | grep 'libc++\.so' > /dev/null; then
  echo "FAIL: $out/content_ids is not linked against libc++"
  exit 1
fi
mapfile -t cases < <(find golden -name '*.case.json' | LC_ALL=C sort)
"$gcc_ids" "${cases[@]}" > "$out/gcc.txt"
"$out/content_ids" "${cases[@]}" > "$out/libcxx.txt"
if ! diff -u "$out/gcc.txt" "$out/libcxx.txt"; then
  echo "FAIL: the case files above give other seeds, inputs or file names under clang and libc++"
  exit 1
fi
echo "ok: ${#cases[@]} case files give the same seed, inputs and failure file name under" \
     "GCC/libstdc++ and $("$clangxx" --version | head -1)/libc++"
