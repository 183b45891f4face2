# ctest driver for tests/install (run with cmake -P): installs the already-built library from
# BUILD_DIR into a scratch prefix, configures and builds the consumer project against that
# prefix with find_package(flashattn), and runs the consumer. Any failing step fails the test.
#
# Required: -DBUILD_DIR -DCONSUMER_SOURCE_DIR -DWORK_DIR -DCXX_COMPILER -DGENERATOR
# Optional: -DBUILD_TYPE (default Release)
cmake_minimum_required(VERSION 3.24)

foreach(var BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR CXX_COMPILER GENERATOR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "install_test.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})

message(STATUS "install ${BUILD_DIR} -> ${prefix}")
execute_process(
  COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} --config ${BUILD_TYPE}
  COMMAND_ERROR_IS_FATAL ANY)

message(STATUS "configure the consumer against ${prefix}")
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${consumer_build} -G ${GENERATOR}
          -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
          -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
  COMMAND_ERROR_IS_FATAL ANY)
execute_process(
  COMMAND ${CMAKE_COMMAND} --build ${consumer_build} --config ${BUILD_TYPE}
  COMMAND_ERROR_IS_FATAL ANY)

# Single-config generators put the program at the top; multi-config ones in a per-config folder.
find_program(consumer NAMES flashattn_consumer
  PATHS ${consumer_build} ${consumer_build}/${BUILD_TYPE} NO_DEFAULT_PATH REQUIRED)
message(STATUS "run ${consumer}")
execute_process(COMMAND ${consumer} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "flashattn_consumer failed (exit status ${rc})")
endif()
