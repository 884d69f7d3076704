# Third-party dependencies, all from Debian 12 packages installed by tools/bootstrap.
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(fmt REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_package(BLAS REQUIRED)  # BLA_VENDOR may pin OpenBLAS; Debian's alternative is OpenBLAS
# Highway (libhwy-dev): the vector micro-kernel of the float64 oracle's products
# (reference/oracle/oracle_gemm.cc), one source for AVX2, AVX-512, NEON and SVE.
find_package(hwy 1.0 CONFIG QUIET)
if(NOT hwy_FOUND)
  message(FATAL_ERROR "Highway not found: the oracle's products need it (Debian: libhwy-dev; "
                      "tools/bootstrap installs it)")
endif()
find_path(ATTEST_CBLAS_INCLUDE cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread
          /usr/include/openblas /usr/include)
# MPFR and GMP as imported targets (cmake/FindMPFR.cmake, FindGMP.cmake, installed with the
# package so that its exported targets name them, not their paths).
list(APPEND CMAKE_MODULE_PATH ${PROJECT_SOURCE_DIR}/cmake)
find_package(GMP REQUIRED)
find_package(MPFR REQUIRED)
set(ATTEST_MPFR_LIB ${MPFR_LIBRARY})
set(ATTEST_GMP_LIB ${GMP_LIBRARY})
set(ATTEST_MPFR_INCLUDE ${MPFR_INCLUDE_DIR})
find_package(CLI11 CONFIG QUIET)
if(NOT CLI11_FOUND)
  find_path(ATTEST_CLI11_INCLUDE CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${ATTEST_CLI11_INCLUDE})
endif()
if(ATTEST_BUILD_TESTS)
  find_package(GTest REQUIRED)
  find_path(ATTEST_RAPIDCHECK_INCLUDE rapidcheck.h REQUIRED)
  find_library(ATTEST_RAPIDCHECK_LIB rapidcheck REQUIRED)
endif()
if(ATTEST_BUILD_BENCH)
  find_package(benchmark QUIET)
endif()

# Python for interop tests: the virtual environment tools/bootstrap makes (numpy,
# safetensors, ml_dtypes), else the system python3 (tests then skip what they cannot import).
# A build configured before the environment existed (tools/attest.sh bootstraps without it)
# moves to it once it does, unless ATTEST_PYTHON was set by hand.
if(EXISTS ${PROJECT_SOURCE_DIR}/build/venv/bin/python3)
  set(_attest_python ${PROJECT_SOURCE_DIR}/build/venv/bin/python3)
else()
  find_program(_attest_python python3)
endif()
if(DEFINED ATTEST_PYTHON_AUTO AND "${ATTEST_PYTHON}" STREQUAL "${ATTEST_PYTHON_AUTO}")
  set(ATTEST_PYTHON ${_attest_python} CACHE FILEPATH "Python used by interop tests" FORCE)
endif()
set(ATTEST_PYTHON ${_attest_python} CACHE FILEPATH "Python used by interop tests")
set(ATTEST_PYTHON_AUTO ${_attest_python} CACHE INTERNAL "the Python chosen automatically")
