# Runs `attest inspect FILE` on every file of the malformed safetensors corpus and checks exit
# code 2 and the message fragment of testdata/malformed/README.md on stderr.
#   cmake -DATTEST=path/to/attest -DDIR=reference/io/testdata/malformed -P inspect_malformed_test.cmake
if(NOT ATTEST OR NOT DIR)
  message(FATAL_ERROR "usage: cmake -DATTEST=<attest> -DDIR=<malformed dir> -P ${CMAKE_CURRENT_LIST_FILE}")
endif()

# Table rows look like: | `file.safetensors` | defect | `fragment` |
file(STRINGS "${DIR}/README.md" rows REGEX "^\\| `[^`]+` \\|")
set(checked 0)
set(failures "")
foreach(row IN LISTS rows)
  if(NOT row MATCHES "^\\| `([^`]+)` \\| [^|]+ \\| `([^`]+)` \\|$")
    list(APPEND failures "unparsable table row: ${row}")
    continue()
  endif()
  set(file "${CMAKE_MATCH_1}")
  set(fragment "${CMAKE_MATCH_2}")
  execute_process(COMMAND "${ATTEST}" inspect "${DIR}/${file}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(FIND "${err}" "${fragment}" at)
  if(NOT rc EQUAL 2)
    list(APPEND failures "${file}: exit code ${rc}, expected 2")
  elseif(at EQUAL -1)
    list(APPEND failures "${file}: stderr lacks '${fragment}': ${err}")
  endif()
  math(EXPR checked "${checked} + 1")
endforeach()

if(checked LESS 20)
  list(APPEND failures "only ${checked} rows found in ${DIR}/README.md")
endif()
if(failures)
  list(JOIN failures "\n  " text)
  message(FATAL_ERROR "attest inspect on the malformed corpus:\n  ${text}")
endif()
message(STATUS "attest inspect: ${checked} malformed files rejected with the expected message")
