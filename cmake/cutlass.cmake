# CUTLASS/CuTe headers come from the PyPI wheel nvidia-cutlass (it ships the C++ headers under
# cutlass_library/source/include). Unless CUTLASS_INCLUDE_DIR points elsewhere, the wheel is
# installed once into the build folder.
set(HOPATTN_CUTLASS_VERSION "4.2.0.0")
set(CUTLASS_INCLUDE_DIR "" CACHE PATH "CUTLASS include directory (empty: install nvidia-cutlass from PyPI into the build folder)")

if(NOT CUTLASS_INCLUDE_DIR)
  set(_cutlass_prefix "${CMAKE_BINARY_DIR}/_deps/nvidia-cutlass-${HOPATTN_CUTLASS_VERSION}")
  set(_cutlass_include "${_cutlass_prefix}/cutlass_library/source/include")
  if(NOT EXISTS "${_cutlass_include}/cute/tensor.hpp")
    find_package(Python3 REQUIRED COMPONENTS Interpreter)
    message(STATUS "Installing nvidia-cutlass==${HOPATTN_CUTLASS_VERSION} from PyPI into ${_cutlass_prefix}")
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -m pip install --quiet --disable-pip-version-check --no-deps
              --target "${_cutlass_prefix}" "nvidia-cutlass==${HOPATTN_CUTLASS_VERSION}"
      RESULT_VARIABLE _pip_result)
    if(NOT _pip_result EQUAL 0)
      message(FATAL_ERROR "pip could not install nvidia-cutlass==${HOPATTN_CUTLASS_VERSION}; "
                          "install it yourself and pass -DCUTLASS_INCLUDE_DIR=<site-packages>/cutlass_library/source/include")
    endif()
  endif()
  set(CUTLASS_INCLUDE_DIR "${_cutlass_include}" CACHE PATH "CUTLASS include directory" FORCE)
endif()

if(NOT EXISTS "${CUTLASS_INCLUDE_DIR}/cute/tensor.hpp")
  message(FATAL_ERROR "CUTLASS_INCLUDE_DIR=${CUTLASS_INCLUDE_DIR} does not contain cute/tensor.hpp")
endif()
message(STATUS "CUTLASS headers: ${CUTLASS_INCLUDE_DIR}")

add_library(hopattn_cutlass INTERFACE)
target_include_directories(hopattn_cutlass SYSTEM INTERFACE "${CUTLASS_INCLUDE_DIR}")
