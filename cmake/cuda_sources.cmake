# CUDA backend sources: the hand-written files plus the generated instantiations selected by
# FLASHATTN_CUDA_HEAD_DIMS and FLASHATTN_CUDA_DTYPES. Included from the top-level CMakeLists.
set(_fa_cuda_dir ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda)
file(GLOB _fa_cuda_core CONFIGURE_DEPENDS ${_fa_cuda_dir}/*.cu ${_fa_cuda_dir}/sm80/*.cu ${_fa_cuda_dir}/mla/*.cu)
file(GLOB _fa_cuda_inst CONFIGURE_DEPENDS ${_fa_cuda_dir}/instantiations/*.cu)

set(_fa_selected)
foreach(_f IN LISTS _fa_cuda_inst)
  get_filename_component(_name ${_f} NAME_WE)
  if(NOT _name MATCHES "^[a-z0-9]+_hdim([0-9]+)_(fp16|bf16|e4m3)_")
    message(FATAL_ERROR "unexpected instantiation file name: ${_name}")
  endif()
  # e4m3 files (the FP8 forward, out bf16) follow the head dims only: FLASHATTN_CUDA_DTYPES
  # lists the 16-bit element types.
  if(CMAKE_MATCH_1 IN_LIST FLASHATTN_CUDA_HEAD_DIMS AND
     (CMAKE_MATCH_2 STREQUAL "e4m3" OR CMAKE_MATCH_2 IN_LIST FLASHATTN_CUDA_DTYPES))
    list(APPEND _fa_selected ${_f})
  endif()
endforeach()
list(LENGTH _fa_selected _fa_count)
message(STATUS "flashattn: ${_fa_count} CUDA kernel instantiations (head dims ${FLASHATTN_CUDA_HEAD_DIMS}; dtypes ${FLASHATTN_CUDA_DTYPES})")

# Hopper kernels (src/cuda/sm90 and the sm90* instantiations) use sm_90a-only instructions
# (wgmma, setmaxnreg), so they build as their own object library for compute_90a/sm_90a alone,
# whenever 90 is among the architectures; the dispatcher picks them on compute capability 9.0.
set(_fa_sm90_sources)
set(_fa_other_sources)
foreach(_f IN LISTS _fa_selected)
  get_filename_component(_name ${_f} NAME)
  if(_name MATCHES "^sm90")
    list(APPEND _fa_sm90_sources ${_f})
  else()
    list(APPEND _fa_other_sources ${_f})
  endif()
endforeach()
set(FLASHATTN_CUDA_SM90 OFF)
if("90" IN_LIST CMAKE_CUDA_ARCHITECTURES OR "90a" IN_LIST CMAKE_CUDA_ARCHITECTURES)
  set(FLASHATTN_CUDA_SM90 ON)
endif()
message(STATUS "flashattn: sm90a kernels ${FLASHATTN_CUDA_SM90}")

target_sources(flashattn PRIVATE ${_fa_cuda_core} ${_fa_other_sources})
target_compile_definitions(flashattn PUBLIC $<BUILD_INTERFACE:FLASHATTN_WITH_CUDA>)
target_compile_definitions(flashattn PRIVATE FLASHATTN_WITH_CUDA)
foreach(_d IN LISTS FLASHATTN_CUDA_HEAD_DIMS)
  target_compile_definitions(flashattn PRIVATE FLASHATTN_CUDA_HDIM_${_d})
endforeach()
foreach(_t IN LISTS FLASHATTN_CUDA_DTYPES)
  string(TOUPPER ${_t} _T)
  target_compile_definitions(flashattn PRIVATE FLASHATTN_CUDA_DTYPE_${_T})
endforeach()
target_compile_options(flashattn PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo -Xptxas=--warn-on-spills --expt-relaxed-constexpr -Xcompiler=-fPIC>)
if(FLASHATTN_WERROR)
  # Host-compiler and front-end warnings are errors; ptxas spill reports stay warnings (they
  # are measured and explained, not hidden: see docs/PERFORMANCE.md).
  target_compile_options(flashattn PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror -Werror=cross-execution-space-call,reorder,deprecated-declarations>)
endif()
target_link_libraries(flashattn PUBLIC CUDA::cudart_static)
set_target_properties(flashattn PROPERTIES CUDA_SEPARABLE_COMPILATION OFF CUDA_RESOLVE_DEVICE_SYMBOLS ON)

if(FLASHATTN_CUDA_SM90)
  file(GLOB _fa_sm90_core CONFIGURE_DEPENDS ${_fa_cuda_dir}/sm90/*.cu)
  add_library(flashattn_sm90 OBJECT ${_fa_sm90_core} ${_fa_sm90_sources})
  set_target_properties(flashattn_sm90 PROPERTIES CUDA_ARCHITECTURES OFF POSITION_INDEPENDENT_CODE ON)
  target_include_directories(flashattn_sm90 PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_compile_definitions(flashattn_sm90 PRIVATE
    $<TARGET_PROPERTY:flashattn,COMPILE_DEFINITIONS> FLASHATTN_CUDA_SM90)
  target_compile_options(flashattn_sm90 PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a -lineinfo -Xptxas=--warn-on-spills
      --expt-relaxed-constexpr -Xcompiler=-fPIC>)
  if(FLASHATTN_WERROR)
    target_compile_options(flashattn_sm90 PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror -Werror=cross-execution-space-call,reorder,deprecated-declarations>)
  endif()
  target_sources(flashattn PRIVATE $<TARGET_OBJECTS:flashattn_sm90>)
  target_compile_definitions(flashattn PRIVATE FLASHATTN_CUDA_SM90)
endif()
