# `attest oracle` end to end (tools/attest/cmd_oracle.cc): a packed varlen GQA softcap ALiBi
# case (a zero-length query sequence, rows that see no key) through the double and mp256
# oracles, the six F64 outputs and their metadata checked with `attest inspect --json`;
# a bad case file, a missing one and a bad --precision exit 2 with a message. Run by ctest as
#   cmake -DATTEST=<attest> -DSRC=<repo root> -DWORK=<scratch dir> -P oracle_cli_test.cmake
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
  expect_match("${out}" "${precision} oracle -> .* \\(12 empty rows, 32 unseen keys" "oracle ${precision}")
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
