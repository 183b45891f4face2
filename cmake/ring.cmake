# Ring attention (context parallelism): include/flashattn/ring.h, src/ring/. Included from the
# top-level CMakeLists after the library target (and the CUDA sources) are defined.
#
# Always built: the schedule, the merge, the ring loop, the thread transport and host ops.
# With the CUDA backend: the device ops (src/ring/ops_cuda.cu). With the CUDA backend and NCCL
# found: the NCCL transport (FLASHATTN_WITH_NCCL; otherwise make_nccl_ring_transport returns
# kNotSupported).
#
# FLASHATTN_ENABLE_NCCL: ON, OFF or AUTO (default; on when found, except in the Python
# extension build, whose ring goes through torch.distributed and should not depend on NCCL).
# NCCL is searched next to the CUDA toolkit and in the system paths; NCCL_ROOT or
# NCCL_INCLUDE_DIR / NCCL_LIBRARY point elsewhere.
set(FLASHATTN_ENABLE_NCCL AUTO CACHE STRING "Build the NCCL ring transport: ON, OFF or AUTO")
set_property(CACHE FLASHATTN_ENABLE_NCCL PROPERTY STRINGS ON OFF AUTO)

target_sources(flashattn PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/src/ring/schedule.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/ring/ring_attention.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/ring/ops_cpu.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/ring/thread_transport.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/ring/nccl_transport.cpp)

if(FLASHATTN_WITH_CUDA)
  target_sources(flashattn PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/ring/ops_cuda.cu)
endif()

set(FLASHATTN_WITH_NCCL OFF)
set(_fa_want_nccl OFF)
if(FLASHATTN_WITH_CUDA)
  if(FLASHATTN_ENABLE_NCCL STREQUAL "AUTO")
    if(NOT FLASHATTN_BUILD_PYTHON)
      set(_fa_want_nccl ON)
    endif()
  elseif(FLASHATTN_ENABLE_NCCL)
    set(_fa_want_nccl ON)
  endif()
elseif(FLASHATTN_ENABLE_NCCL AND NOT FLASHATTN_ENABLE_NCCL STREQUAL "AUTO")
  message(FATAL_ERROR "FLASHATTN_ENABLE_NCCL=ON needs the CUDA backend (FLASHATTN_ENABLE_CUDA)")
endif()

if(_fa_want_nccl)
  set(_fa_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT})
  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS ${_fa_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY NAMES nccl
    HINTS ${_fa_nccl_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(FLASHATTN_WITH_NCCL ON)
  elseif(FLASHATTN_ENABLE_NCCL STREQUAL "ON")
    message(FATAL_ERROR "FLASHATTN_ENABLE_NCCL=ON but nccl.h / libnccl were not found "
                        "(set NCCL_ROOT, or NCCL_INCLUDE_DIR and NCCL_LIBRARY)")
  endif()
endif()

if(FLASHATTN_WITH_NCCL)
  target_compile_definitions(flashattn PRIVATE FLASHATTN_WITH_NCCL)
  target_include_directories(flashattn PRIVATE ${NCCL_INCLUDE_DIR})
  target_link_libraries(flashattn PRIVATE ${NCCL_LIBRARY})
  message(STATUS "flashattn: NCCL ring transport ON (${NCCL_LIBRARY})")
else()
  message(STATUS "flashattn: NCCL ring transport OFF")
endif()
