# `attest convert` end to end (tools/attest/cmd_convert.cc, docs/formats.md): converts the
# ml_dtypes golden file, checks the output dtypes with `attest inspect --json`, converts back
# to f64, and checks that bad input exits 2 with a message. Run by ctest as
#   cmake -DATTEST=<attest> -DSRC=<repo root> -DWORK=<scratch dir> -P convert_cli_test.cmake
set(in "${SRC}/golden/formats/ml_dtypes_vectors.safetensors")
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

# Float tensors become F8_E4M3 codes; the statistics line names the conversion.
run_attest(0 out convert --to e4m3fn --saturate --in "${in}" --out "${WORK}/e4m3.safetensors")
expect_match("${out}" "e4m3fn.f32_in f32 -> e4m3fn \\(e4m3fn\\): [0-9]+ elements" "convert")
run_attest(0 out inspect --json "${WORK}/e4m3.safetensors")
expect_match("${out}" "\"safetensors_dtype\": \"F8_E4M3\"" "inspect e4m3")
if(out MATCHES "\"safetensors_dtype\": \"F32\"")
  message(FATAL_ERROR "convert left an F32 tensor:\n${out}")
endif()
expect_match("${out}" "attest.convert" "metadata")

# fp4 goes out as U8 codes; widening back to f64 is exact and accepted.
run_attest(0 out convert --to e2m1fn --rounding rz --in "${in}" --out "${WORK}/e2m1.safetensors")
run_attest(0 out inspect --json "${WORK}/e2m1.safetensors")
expect_match("${out}" "\"safetensors_dtype\": \"U8\"" "inspect e2m1")
run_attest(0 out convert --to f64 --quiet --in "${WORK}/e4m3.safetensors"
           --out "${WORK}/back.safetensors")
run_attest(0 out inspect --json "${WORK}/back.safetensors")
expect_match("${out}" "\"safetensors_dtype\": \"F64\"" "inspect f64")

# Bad input: exit 2 and a message that names the problem.
run_attest(2 out convert --to e9m9 --in "${in}" --out "${WORK}/x.safetensors")
expect_match("${out}" "unknown format 'e9m9'" "bad format")
run_attest(2 out convert --to bf16 --rounding up --in "${in}" --out "${WORK}/x.safetensors")
run_attest(2 out convert --to bf16 --in "${WORK}/missing.safetensors" --out "${WORK}/x.safetensors")
expect_match("${out}" "missing.safetensors" "missing file")
run_attest(2 out convert --to bf16 --in "${SRC}/golden/formats/README.md" --out "${WORK}/x.safetensors")
run_attest(2 out convert --to bf16 --in "${in}" --out "${WORK}/no/such/dir/x.safetensors")
run_attest(2 out convert --in "${in}" --out "${WORK}/x.safetensors")
