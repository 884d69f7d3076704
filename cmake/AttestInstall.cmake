# Install rules and the exported package: a kernel project writes
#   find_package(attest REQUIRED)
#   attest_add_plugin(my_kernel SOURCES my_kernel.cc)             # <attest/attest_kernel.h>
#   target_link_libraries(my_kernel_tests PRIVATE attest::attest)  # <attest/gtest.h>
# and runs attest's suites on its kernel from its own tests. Installed headers are the public
# ones only (include/attest/ and the C ABI); the libraries behind them are static and their
# dependencies are named by imported target, so the prefix is relocatable
# (tools/install_test/run.sh installs, moves the prefix and builds a consumer against it).
include(CMakePackageConfigHelpers)

add_library(attest INTERFACE)
add_library(attest::attest ALIAS attest)
target_link_libraries(attest INTERFACE attest_run)

install(TARGETS attest attest_reference attest_kernels attest_verify attest_run
                attest_plugin_abi
        EXPORT attestTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS attest_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The external-process workers (docs/protocol.md), to run as `exec:python3 P/share/attest/
# workers/numpy_worker.py` or to copy from; faulty_worker.py and the tests stay in the tree.
install(FILES ${PROJECT_SOURCE_DIR}/tools/workers/attest_worker.py
              ${PROJECT_SOURCE_DIR}/tools/workers/numpy_worker.py
              ${PROJECT_SOURCE_DIR}/tools/workers/torch_worker.py
              ${PROJECT_SOURCE_DIR}/tools/workers/torch_backends.py
              ${PROJECT_SOURCE_DIR}/tools/workers/torch_backends_common.py
              ${PROJECT_SOURCE_DIR}/tools/workers/torch_backends_fa.py
              ${PROJECT_SOURCE_DIR}/tools/workers/torch_backends_flex.py
              ${PROJECT_SOURCE_DIR}/tools/workers/torch_backends_lse.py
              ${PROJECT_SOURCE_DIR}/tools/workers/torch_backends_cudnn_fp8.py
              ${PROJECT_SOURCE_DIR}/tools/workers/torch_call.py
              ${PROJECT_SOURCE_DIR}/tools/workers/torch_export.py
              ${PROJECT_SOURCE_DIR}/tools/workers/torch_export_script.py
              ${PROJECT_SOURCE_DIR}/tools/workers/torch_probe.py
              ${PROJECT_SOURCE_DIR}/tools/workers/fa4_masks.py
        DESTINATION ${CMAKE_INSTALL_DATADIR}/attest/workers)
install(FILES ${PROJECT_SOURCE_DIR}/include/attest/check.h
              ${PROJECT_SOURCE_DIR}/include/attest/gtest.h
              ${PROJECT_SOURCE_DIR}/kernels/plugin/attest_kernel.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attest)
install(EXPORT attestTargets NAMESPACE attest::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attest)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/attestConfig.cmake.in
  ${PROJECT_BINARY_DIR}/attestConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attest)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/attestConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/attestConfig.cmake
              ${PROJECT_BINARY_DIR}/attestConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/FindMPFR.cmake
              ${PROJECT_SOURCE_DIR}/cmake/FindGMP.cmake
              ${PROJECT_SOURCE_DIR}/cmake/AttestPlugin.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attest)
