# ctest layering_test: folders depend one way (docs/design.md "Layers"). The table at the end
# lists, for every folder of code, the folders above it that it must not include: reference ->
# kernels -> verify -> run -> property_tests / tools -> python, with bench/, golden/ and the
# public headers of include/ beside them. Tests (files named *_test.*, test data) sit above
# every library and may include any layer (EXCEPT_TESTS). Inside reference/, reference/problem/ includes neither reference/data/ nor
# reference/case/, and reference/data/ does not include reference/case/ (a case is a problem
# plus the generator that fills it); kernels/device/ (the CUDA and HIP adapters) includes
# nothing of kernels/plugin/ (the C ABI loader above it), also not the ABI header under its
# installed name <attest/attest_kernel.h>. Inside verify/, metrics/ -> tolerance/ -> checks/ ->
# report/.
# Reads the #include lines of every C, C++, CUDA and HIP file under each folder (tests too)
# and the paths its CMake files name outside comments, and prints every forbidden edge as
# "FILE: the line  (the rule it breaks)". Run as: cmake -DROOT=<source root> -P this file.
if(NOT ROOT OR NOT IS_DIRECTORY "${ROOT}")
  message(FATAL_ERROR "usage: cmake -DROOT=<source root> -P layering_test.cmake")
endif()
set(violations 0)

# forbid(FOLDER [INCLUDES_ONLY] [EXCEPT_TESTS] PREFIXES...): no file under FOLDER may include a
# path starting with a PREFIX (quoted includes are resolved against the including file's folder
# first, then the source root, which is the project's include path), and no CMake file there
# may name one (unless INCLUDES_ONLY: test data may live anywhere). EXCEPT_TESTS: test sources
# (*_test.*, *_props_test.*, test helpers *_test_util.h, anything under a testdata/ folder) are
# not read.
function(forbid folder)
  cmake_parse_arguments(F "INCLUDES_ONLY;EXCEPT_TESTS" "" "PREFIXES" ${ARGN})
  set(prefixes ${F_PREFIXES})
  if(NOT IS_DIRECTORY "${ROOT}/${folder}")
    message(SEND_ERROR "${folder}: no such folder (moved? update tools/layering)")
    return()
  endif()
  # A sibling folder is also reached as ../NAME/ from CMake files of FOLDER.
  get_filename_component(parent "${folder}" DIRECTORY)
  set(cmake_needles ${prefixes})
  foreach(prefix ${prefixes})
    if(parent AND prefix MATCHES "^${parent}/(.+)$")
      list(APPEND cmake_needles "../${CMAKE_MATCH_1}")
    endif()
  endforeach()
  file(GLOB_RECURSE sources LIST_DIRECTORIES false RELATIVE "${ROOT}"
       "${ROOT}/${folder}/*.h" "${ROOT}/${folder}/*.hpp" "${ROOT}/${folder}/*.c"
       "${ROOT}/${folder}/*.cc" "${ROOT}/${folder}/*.cpp" "${ROOT}/${folder}/*.cu"
       "${ROOT}/${folder}/*.cuh" "${ROOT}/${folder}/*.hip")
  file(GLOB_RECURSE cmake_files LIST_DIRECTORIES false RELATIVE "${ROOT}"
       "${ROOT}/${folder}/CMakeLists.txt" "${ROOT}/${folder}/*.cmake")
  if(F_INCLUDES_ONLY)
    set(cmake_files)
  endif()
  list(FILTER cmake_files EXCLUDE REGEX "^tools/layering/")  # this table names every folder
  if(F_EXCEPT_TESTS)
    list(FILTER sources EXCLUDE REGEX "(_test\\.[a-z]+$|_test_util\\.h$|/testdata/)")
  endif()
  list(LENGTH sources n_sources)
  list(LENGTH cmake_files n_cmake)
  set(found 0)
  foreach(file ${sources})
    get_filename_component(dir "${file}" DIRECTORY)
    file(STRINGS "${ROOT}/${file}" lines REGEX "^[ \t]*#[ \t]*include")
    foreach(line ${lines})
      if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*([<\"])([^>\"]+)[>\"]")
        continue()
      endif()
      set(path "${CMAKE_MATCH_2}")
      if(CMAKE_MATCH_1 STREQUAL "\"" AND EXISTS "${ROOT}/${dir}/${path}")
        get_filename_component(abs "${ROOT}/${dir}/${path}" ABSOLUTE)
        file(RELATIVE_PATH path "${ROOT}" "${abs}")
      endif()
      foreach(prefix ${prefixes})
        string(FIND "${path}" "${prefix}" at)
        if(at EQUAL 0)
          math(EXPR found "${found} + 1")
          message("${file}: ${line}  (${folder}/ must not include ${prefix})")
        endif()
      endforeach()
    endforeach()
  endforeach()
  foreach(file ${cmake_files})
    file(STRINGS "${ROOT}/${file}" lines)
    foreach(line ${lines})
      string(REGEX REPLACE "#.*" "" code "${line}")
      foreach(needle ${cmake_needles})
        string(FIND "${code}" "${needle}" at)
        if(NOT at EQUAL -1)
          math(EXPR found "${found} + 1")
          message("${file}: ${line}  (${folder}/ must not name ${needle})")
        endif()
      endforeach()
    endforeach()
  endforeach()
  if(F_INCLUDES_ONLY)
    message("${folder}/: ${n_sources} sources (includes only), ${found} forbidden edges")
  else()
    message("${folder}/: ${n_sources} sources, ${n_cmake} CMake files, ${found} forbidden edges")
  endif()
  math(EXPR total "${violations} + ${found}")
  set(violations ${total} PARENT_SCOPE)
endfunction()

# The table: each folder of code and the folders above it.
set(above_reference kernels/ verify/ run/ property_tests/ tools/ python/ bench/ golden/)
forbid(reference INCLUDES_ONLY PREFIXES ${above_reference})
forbid(kernels EXCEPT_TESTS PREFIXES verify/ run/ property_tests/ tools/ python/ bench/)
forbid(verify EXCEPT_TESTS PREFIXES run/ property_tests/ tools/ python/ bench/)
forbid(run EXCEPT_TESTS PREFIXES property_tests/ tools/ python/ bench/)
forbid(property_tests EXCEPT_TESTS PREFIXES tools/ python/ bench/)
forbid(tools EXCEPT_TESTS PREFIXES python/ bench/)
forbid(python EXCEPT_TESTS PREFIXES bench/)
forbid(bench PREFIXES tools/ python/ property_tests/)
forbid(golden EXCEPT_TESTS PREFIXES kernels/ verify/ run/ property_tests/ tools/ python/ bench/)
# The installed public headers depend on the C++ standard library (and GoogleTest) only.
forbid(include PREFIXES reference/ kernels/ verify/ run/ property_tests/ tools/ python/ bench/)
forbid(reference/problem PREFIXES reference/data/ reference/case/)
forbid(reference/data PREFIXES reference/case/)
forbid(kernels/device PREFIXES kernels/plugin/ attest/attest_kernel.h)
# Inside verify/: metrics -> tolerance (the tolerance model and the Verdict it returns) ->
# checks -> report (the writers, which order failures by the checks' diagnosis order).
forbid(verify/metrics EXCEPT_TESTS PREFIXES verify/tolerance/ verify/checks/ verify/report/)
forbid(verify/tolerance EXCEPT_TESTS PREFIXES verify/checks/ verify/report/)
forbid(verify/checks EXCEPT_TESTS PREFIXES verify/report/)

if(violations GREATER 0)
  message(FATAL_ERROR "layering: ${violations} forbidden edges (above); docs/design.md "
                      "\"Layers\" says which way each folder may depend")
endif()
message("layering: ok")
