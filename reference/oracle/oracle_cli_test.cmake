# `attest oracle` end to end (tools/attest/cmd_oracle.cc): a packed varlen GQA softcap ALiBi
# case (a zero-length query sequence, rows that see no key) through the double and mp256
# oracles, the six F64 outputs and their metadata checked with `attest inspect --json`;
# a bad case file, a missing one and a bad --precision exit 2 with a message; the double
# oracle's output files are byte-identical whichever ISA version of its products runs
# (ATTEST_ORACLE_ISA = portable, avx2, avx512; reference/oracle/oracle_gemm.h), on this case
# and on larger ones from tools/device/cases-oracle/; --device cuda through the CPU-emulated
# GPU oracle (reference/oracle/cuda/). Run by ctest as
#   cmake -DATTEST=<attest> -DSRC=<repo root> -DWORK=<scratch dir> [-DEMULATED=<emulated .so>]
#         -P oracle_cli_test.cmake
cmake_policy(SET CMP0057 NEW)  # if(IN_LIST)
set(case "${SRC}/reference/oracle/testdata/varlen_gqa_softcap.case.json")
file(MAKE_DIRECTORY "${WORK}")

function(run_attest expect_rc out_var)
  execute_process(COMMAND "${ATTEST}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL expect_rc)
    message(FATAL_ERROR "attest ${ARGN}: exit ${rc}, expected ${expect_rc}\n${out}\n${err}")
  endif()
  set(${out_var} "${out}${err}" PARENT_SCOPE)
endfunction()

function(expect_match text regex what)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "${what}: output does not match '${regex}':\n${text}")
  endif()
endfunction()

foreach(precision double mp256)
  run_attest(0 out oracle --case "${case}" --out "${WORK}/${precision}.safetensors"
             --precision ${precision})
  expect_match("${out}" "${precision} oracle.* -> .* \\(12 empty rows, 32 unseen keys" "oracle ${precision}")
  run_attest(0 out inspect --json "${WORK}/${precision}.safetensors")
  foreach(tensor o lse dq dk dv delta)
    expect_match("${out}" "\"${tensor}\"" "inspect ${precision}: tensor ${tensor}")
  endforeach()
  expect_match("${out}" "\"safetensors_dtype\": \"F64\"" "inspect ${precision}: dtype")
  expect_match("${out}" "attest.oracle.precision" "inspect ${precision}: metadata")
  expect_match("${out}" "attest.oracle.error_bound" "inspect ${precision}: bounds")
endforeach()

file(WRITE "${WORK}/bad.case.json" "{\"problem\": {\"batch\": 1, \"heads_q\": 3, \"heads_kv\": 2}, \"generator\": {\"name\": \"gaussian\", \"seed\": 1}}")
run_attest(2 out oracle --case "${WORK}/bad.case.json" --out "${WORK}/bad.safetensors")
expect_match("${out}" "heads_q" "bad case")
run_attest(2 out oracle --case "${WORK}/missing.case.json" --out "${WORK}/m.safetensors")
run_attest(2 out oracle --case "${case}" --out "${WORK}/p.safetensors" --precision mp512)
expect_match("${out}" "precision" "bad precision")

# The same bytes from every ISA version of the products. The portable loop (std::fma, slow)
# runs the small cases only; a version this CPU lacks is reported and skipped.
set(small "${case}" "${SRC}/tools/device/cases-oracle/x_window_alibi_d64.case.json"
          "${SRC}/tools/device/cases-oracle/x_varlen_docs.case.json")
set(large "${SRC}/tools/device/cases-oracle/x_gqa_causal_softcap.case.json")
set(n 0)
foreach(c IN LISTS small large)
  math(EXPR n "${n} + 1")
  run_attest(0 out oracle --case "${c}" --out "${WORK}/isa${n}-default.safetensors")
  file(SHA256 "${WORK}/isa${n}-default.safetensors" want)
  set(isas avx512 avx2)
  if(c IN_LIST small)
    list(APPEND isas portable)
  endif()
  foreach(isa IN LISTS isas)
    set(ENV{ATTEST_ORACLE_ISA} ${isa})
    run_attest(0 out oracle --case "${c}" --out "${WORK}/isa${n}-${isa}.safetensors")
    unset(ENV{ATTEST_ORACLE_ISA})
    if(NOT out MATCHES "\\(${isa} products\\)")
      message(STATUS "skip ${isa} on ${c}: this CPU does not run it (${out})")
      continue()
    endif()
    file(SHA256 "${WORK}/isa${n}-${isa}.safetensors" got)
    if(NOT got STREQUAL want)
      message(FATAL_ERROR "${c}: the ${isa} products give other bytes than the default version")
    endif()
    message(STATUS "${isa}: same bytes on ${c}")
  endforeach()
endforeach()

# --device cuda (reference/oracle/cuda/): through the CPU-emulated library (EMULATED, built
# everywhere) the same counts as the CPU oracle; a library that cannot be loaded, an unknown
# device and a precision the GPU does not run exit 2 with a message.
if(EMULATED)
  set(ENV{ATTEST_ORACLE_CUDA} "${EMULATED}")
  run_attest(0 out oracle --case "${case}" --out "${WORK}/cuda.safetensors" --device cuda)
  expect_match("${out}" "double oracle \\(CUDA\\).* \\(12 empty rows, 32 unseen keys"
               "oracle --device cuda (emulated)")
  run_attest(0 out inspect --json "${WORK}/cuda.safetensors")
  expect_match("${out}" "attest.oracle.device" "inspect --device cuda: metadata")
  set(ENV{ATTEST_ORACLE_CUDA} "${WORK}/no-such-libattest_oracle_cuda.so")
  run_attest(2 out oracle --case "${case}" --out "${WORK}/cuda2.safetensors" --device cuda)
  expect_match("${out}" "--device cuda: CUDA oracle: cannot load" "oracle without the library")
  unset(ENV{ATTEST_ORACLE_CUDA})
endif()
run_attest(2 out oracle --case "${case}" --out "${WORK}/x.safetensors" --device tpu)
expect_match("${out}" "--device: expected cpu or cuda" "oracle --device tpu")
run_attest(2 out oracle --case "${case}" --out "${WORK}/x.safetensors" --device cuda
           --precision mp256)
expect_match("${out}" "only --precision double runs on the GPU" "oracle --device cuda mp256")

# A learnable sink (docs/semantics.md "Learnable sink"): GQA, causal empty rows, a packed
# sequence without keys, softcap, and sinks of 0.5, -inf, 1e30 and -2; both oracles write
# dsink (with its bound). The CUDA oracle declines sinks: --device cuda says so and runs the
# CPU oracle, byte for byte the CPU file. A sink object for a problem without a sink exits 2;
# attest compare and attest repro judge a sink case.
set(sink_case "${SRC}/reference/oracle/testdata/sink_varlen_gqa_causal.case.json")
foreach(precision double mp256)
  run_attest(0 out oracle --case "${sink_case}" --out "${WORK}/sink-${precision}.safetensors"
             --precision ${precision})
  expect_match("${out}" "\\(44 empty rows, " "sink oracle ${precision}")
  run_attest(0 out inspect --json "${WORK}/sink-${precision}.safetensors")
  expect_match("${out}" "\"dsink\"" "inspect sink ${precision}: dsink")
  expect_match("${out}" "sink_mass_max" "inspect sink ${precision}: stats")
endforeach()
if(EMULATED)
  set(ENV{ATTEST_ORACLE_CUDA} "${EMULATED}")
  run_attest(0 out oracle --case "${sink_case}" --out "${WORK}/sink-cuda.safetensors"
             --device cuda)
  unset(ENV{ATTEST_ORACLE_CUDA})
  expect_match("${out}" "the CUDA oracle declines learnable sinks; running the CPU" "sink --device cuda")
  file(SHA256 "${WORK}/sink-cuda.safetensors" got)
  file(SHA256 "${WORK}/sink-double.safetensors" want)
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "sink --device cuda: not the CPU oracle's bytes")
  endif()
endif()
file(WRITE "${WORK}/nosink.case.json" "{\"problem\": {\"heads_q\": 2}, \"generator\": {\"name\": \"gaussian\", \"seed\": 1, \"params\": {\"sink\": {\"values\": [1]}}}}")
run_attest(2 out oracle --case "${WORK}/nosink.case.json" --out "${WORK}/nosink.safetensors")
expect_match("${out}" "generator.params.sink: the problem has no sink" "sink params without a sink")
# attest compare judges a sink case, dsink included: the double oracle's own outputs pass.
run_attest(0 out compare --case "${sink_case}" --outputs "${WORK}/sink-double.safetensors")
expect_match("${out}" "dsink" "compare sink")
# attest repro judges it with the checks whose rules include the sink (the others say why they
# are skipped): the bf16 model passes.
run_attest(0 out repro --kernel cpu/flash2-bf16 --case "${sink_case}")
expect_match("${out}" "does not model the learnable sink" "repro sink")

# A learnable relative bias (docs/semantics.md "Learnable relative bias") with a sink, on the
# same packed causal GQA softcap problem: both oracles write drel_bias [4, 15] (with its bound
# and statistics); --device cuda declines it and runs the CPU oracle.
set(bias_case "${SRC}/reference/oracle/testdata/rel_bias_varlen_gqa_causal.case.json")
foreach(precision double mp256)
  run_attest(0 out oracle --case "${bias_case}" --out "${WORK}/bias-${precision}.safetensors"
             --precision ${precision})
  run_attest(0 out inspect --json "${WORK}/bias-${precision}.safetensors")
  expect_match("${out}" "\"drel_bias\"" "inspect rel_bias ${precision}: drel_bias")
  expect_match("${out}" "rel_bias_mass_max" "inspect rel_bias ${precision}: stats")
endforeach()
if(EMULATED)
  set(ENV{ATTEST_ORACLE_CUDA} "${EMULATED}")
  run_attest(0 out oracle --case "${bias_case}" --out "${WORK}/bias-cuda.safetensors"
             --device cuda)
  unset(ENV{ATTEST_ORACLE_CUDA})
  expect_match("${out}" "declines learnable sinks; running the CPU" "rel_bias --device cuda")
endif()
# attest compare judges a relative-bias case, drel_bias included: the double oracle's own
# outputs pass. attest repro judges it with the checks whose rules include the bias (the
# others say why they are skipped): the bf16 model passes.
run_attest(0 out compare --case "${bias_case}" --outputs "${WORK}/bias-double.safetensors")
expect_match("${out}" "drel_bias" "compare rel_bias")
run_attest(0 out repro --kernel cpu/flash2-bf16 --case "${bias_case}")
expect_match("${out}" "does not model the learnable" "repro rel_bias")
