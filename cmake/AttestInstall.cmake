# Install rules and the exported package: a kernel project writes
#   find_package(attest REQUIRED)
#   target_link_libraries(my_kernel_tests PRIVATE attest::attest)
# and gets the oracle, the kernel interface and the checks in its own tests.
include(CMakePackageConfigHelpers)

add_library(attest INTERFACE)
add_library(attest::attest ALIAS attest)
target_link_libraries(attest INTERFACE attest_reference attest_kernels attest_verify)

install(TARGETS attest attest_reference attest_kernels attest_verify attest_casegen
        EXPORT attestTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attest)
install(TARGETS attest_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The external-process workers (docs/protocol.md), to run as `exec:python3 P/share/attest/
# workers/numpy_worker.py` or to copy from; faulty_worker.py and the tests stay in the tree.
install(FILES ${PROJECT_SOURCE_DIR}/tools/workers/attest_worker.py
              ${PROJECT_SOURCE_DIR}/tools/workers/numpy_worker.py
              ${PROJECT_SOURCE_DIR}/tools/workers/torch_worker.py
        DESTINATION ${CMAKE_INSTALL_DATADIR}/attest/workers)
foreach(layer reference kernels verify)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attest/${layer}
          FILES_MATCHING PATTERN "*.h"
          PATTERN "*_test*" EXCLUDE PATTERN "testdata" EXCLUDE)
endforeach()
install(EXPORT attestTargets NAMESPACE attest::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attest)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/attestConfig.cmake.in
  ${PROJECT_BINARY_DIR}/attestConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attest)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/attestConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/attestConfig.cmake
              ${PROJECT_BINARY_DIR}/attestConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attest)
