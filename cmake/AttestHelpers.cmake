# attest_test(NAME SOURCES... [LIBS ...] [LABELS ...] [SANITIZE]): one GoogleTest executable
# next to the code it tests, registered with ctest (tests run from the source tree root so that
# test data paths are stable). SANITIZE: the test is also run under ASan + UBSan by .ci/run
# (label `sanitize`, built by the target attest_sanitize_tests; the top CMakeLists.txt says
# which tests are chosen and why).
function(attest_test name)
  if(NOT ATTEST_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "SANITIZE" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES} ${T_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE ATTEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  if(T_TIMEOUT)
    set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT})
  endif()
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
  if(T_SANITIZE)
    attest_sanitize_test(${name} ${name})
  endif()
endfunction()

# attest_sanitize_test(TEST TARGET...): label ctest test TEST `sanitize` (call it in the folder
# that added TEST) and make attest_sanitize_tests build the TARGETs it runs.
function(attest_sanitize_test test)
  set_property(TEST ${test} APPEND PROPERTY LABELS sanitize)
  add_dependencies(attest_sanitize_tests ${ARGN})
endfunction()
