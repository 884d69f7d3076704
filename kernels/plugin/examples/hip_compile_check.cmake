# ctest hip_device_compile (the HIP code must compile for gfx1100 and gfx1151; docs/hip.md):
# takes the example plugin's device code's assembly for each architecture (the build's
# -save-temps output beside BUNDLE, else compiled here with clang++-19),
# requires the WMMA instruction, wave32 and no dynamic stack in every kernel, then builds the
# two-architecture offload bundle the plugin embeds holds both.
# Run as: cmake -DCLANG=... -DLLD=... -DBUNDLER=... -DOBJCOPY=... -DSOURCE=... -DROOT=... -DOUT=...
#         [-DBUNDLE=<the built bundle>] -P this file.
# Prints "SKIP: …" (ctest's SKIP_REGULAR_EXPRESSION) when the toolchain is missing, saying what
# to install.
if(NOT CLANG OR NOT BUNDLER OR NOT LLD OR NOT OBJCOPY)
  message("SKIP: HIP device code not compiled: clang++-19 / ld.lld-19 / clang-offload-bundler-19 "
          "/ llvm-objcopy not all found (clang=${CLANG} lld=${LLD} bundler=${BUNDLER} "
          "objcopy=${OBJCOPY}); the repository's bootstrap script installs clang-19 lld-19 "
          "clang-tools-19 llvm-19")
  return()  # ctest marks the test skipped on this line (SKIP_REGULAR_EXPRESSION)
endif()
set(flags -x hip --cuda-device-only -nogpulib -nogpuinc -O3 -std=c++20 -Wall -Wextra -Werror
          -I${ROOT})
set(kernels)
foreach(dims d64_dv64 d64_dv128 d128_dv64 d128_dv128)
  list(APPEND kernels attest_hip_wmma_fwd_${dims} attest_hip_wmma_bwd_dq_${dims}
                      attest_hip_wmma_bwd_dkdv_${dims})
endforeach()
foreach(arch gfx1100 gfx1151)
  # The build compiled the bundle with -save-temps=obj: its assembly for this architecture,
  # when newer than the source, is that compile's own; otherwise compile it here.
  set(asm_file)
  if(BUNDLE AND EXISTS "${BUNDLE}")
    get_filename_component(bundle_dir ${BUNDLE} DIRECTORY)
    set(asm_file ${bundle_dir}/hip_attention_device-hip-amdgcn-amd-amdhsa-${arch}.s)
    if(NOT EXISTS "${asm_file}" OR "${SOURCE}" IS_NEWER_THAN "${asm_file}")
      set(asm_file)
    endif()
  endif()
  if(asm_file)
    message("${arch}: the build's assembly ${asm_file}")
  else()
    set(asm_file ${OUT}/hip_attention_${arch}.s)
    execute_process(COMMAND ${CLANG} ${flags} --offload-arch=${arch} -S ${SOURCE}
                            -o ${asm_file}
                    RESULT_VARIABLE rc ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "clang++-19 --offload-arch=${arch} failed:\n${err}")
    endif()
  endif()
  file(READ ${asm_file} asm)
  string(REGEX MATCHALL "v_wmma_f32_16x16x16_f16" wmma "${asm}")
  list(LENGTH wmma n_wmma)
  # Unrolled, per (D, Dv): forward D/16 (S) + Dv/16 (O); dQ 2 D/16 (S, dQ) + 2 Dv/16 (dP, Δ);
  # dK/dV 2 D/16 (Sᵀ, dK) + 3 Dv/16 (dPᵀ, Δ, dV). Over (64,64), (64,128), (128,64),
  # (128,128): 48 + 96 + 120 = 264.
  if(NOT n_wmma EQUAL 264)
    message(FATAL_ERROR "${arch}: ${n_wmma} v_wmma_f32_16x16x16_f16 instructions, expected 264")
  endif()
  foreach(k ${kernels})
    string(FIND "${asm}" ".name:           ${k}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${arch}: kernel ${k} missing from the code object")
    endif()
  endforeach()
  string(REGEX MATCHALL "\\.wavefront_size: +32" w32 "${asm}")
  list(LENGTH w32 n_w32)
  if(NOT n_w32 EQUAL 12)
    message(FATAL_ERROR "${arch}: ${n_w32} of 12 kernels are wave32")
  endif()
  if(asm MATCHES "\\.uses_dynamic_stack: +true")
    message(FATAL_ERROR "${arch}: a kernel uses a dynamic stack")
  endif()
  message("${arch}: 12 kernels, ${n_wmma} WMMA instructions, wave32")
endforeach()
# The bundle the plugin embeds (built by the build); compiled here only when it is absent.
if(NOT BUNDLE OR NOT EXISTS "${BUNDLE}")
  set(BUNDLE ${OUT}/hip_attention_check.hipfb)
  execute_process(COMMAND ${CLANG} ${flags} --offload-arch=gfx1100 --offload-arch=gfx1151 -c
                          ${SOURCE} -o ${BUNDLE}
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "clang++-19 bundle for gfx1100 + gfx1151 failed:\n${err}")
  endif()
endif()
execute_process(COMMAND ${BUNDLER} -list -type=o -input=${BUNDLE}
                OUTPUT_VARIABLE entries RESULT_VARIABLE rc)
foreach(arch gfx1100 gfx1151)
  if(NOT rc EQUAL 0 OR NOT entries MATCHES "hipv4-amdgcn-amd-amdhsa--${arch}")
    message(FATAL_ERROR "the bundle lacks ${arch}: ${entries}")
  endif()
endforeach()
message("bundle entries:\n${entries}")
