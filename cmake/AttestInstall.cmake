# Install rules and the exported package: a kernel project writes
#   find_package(attest REQUIRED)
#   target_link_libraries(my_kernel_tests PRIVATE attest::attest)
# and gets the oracle, the kernel interface and the checks in its own tests.
include(CMakePackageConfigHelpers)

add_library(attest INTERFACE)
add_library(attest::attest ALIAS attest)
target_link_libraries(attest INTERFACE attest_reference attest_kernels attest_verify)

install(TARGETS attest attest_reference attest_kernels attest_verify
        EXPORT attestTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attest)
install(TARGETS attest_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
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
