# attest_add_plugin(NAME SOURCES... [LINK_LIBRARIES ...]): a C ABI plugin for attest, the
# MODULE library that `attest check --kernel plugin:$<TARGET_FILE:NAME>` loads
# (<attest/attest_kernel.h>; docs/plugins.md). Only the three ATTEST_KERNEL_EXPORT entry
# points are visible, so plugins never clash with each other or with attest. Installed with
# the package (find_package(attest) includes it) and used in attest's own tree alike.
function(attest_add_plugin name)
  cmake_parse_arguments(P "" "" "SOURCES;LINK_LIBRARIES" ${ARGN})
  if(NOT P_SOURCES AND NOT P_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "attest_add_plugin(${name}): no SOURCES")
  endif()
  add_library(${name} MODULE ${P_SOURCES} ${P_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE attest::plugin_abi ${P_LINK_LIBRARIES})
  set_target_properties(${name} PROPERTIES C_VISIBILITY_PRESET hidden
                                           CXX_VISIBILITY_PRESET hidden
                                           VISIBILITY_INLINES_HIDDEN ON)
endfunction()
