# Every dependency is found here, once. scripts/setup installs them all.
find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)
find_package(nlohmann_json 3 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(HWY REQUIRED IMPORTED_TARGET libhwy)

# LibTorch comes from the torch wheel in the project's virtual environment.
if(NOT Torch_DIR)
  execute_process(
    COMMAND "${ZERO_PYTHON}" -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _zero_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _zero_torch_rc ERROR_QUIET)
  if(NOT _zero_torch_rc EQUAL 0)
    message(FATAL_ERROR
      "Cannot import torch with ZERO_PYTHON=${ZERO_PYTHON}. Run scripts/setup (it makes "
      ".venv with the torch wheel), or pass -DZERO_PYTHON=/path/to/python with torch, "
      "or -DTorch_DIR=/path/to/share/cmake/Torch.")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${_zero_torch_prefix}")
endif()
if(NOT CMAKE_CUDA_ARCHITECTURES)
  # Without a GPU, "native" fails; 90 covers H100/H200.
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
# Naming the arch list stops Caffe2's config from probing for a GPU with a
# try_run (which fails here: no GPU, and CMake 3.25 has no CUDA20 dialect).
if(NOT TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0")
endif()
find_package(Torch REQUIRED)
message(STATUS "zerocpp: LibTorch ${Torch_VERSION} from ${Torch_DIR}")

# Does this LibTorch have CUDA? The wheel's config defines c10_cuda then.
if(TARGET c10_cuda OR TORCH_CUDA_LIBRARIES)
  set(_zero_torch_has_cuda ON)
else()
  set(_zero_torch_has_cuda OFF)
endif()
if(ZERO_WITH_CUDA STREQUAL "AUTO")
  set(ZERO_WITH_CUDA ${_zero_torch_has_cuda})
endif()
if(ZERO_WITH_CUDA AND NOT _zero_torch_has_cuda)
  message(FATAL_ERROR "ZERO_WITH_CUDA=ON but the LibTorch found (${Torch_DIR}) has no CUDA")
endif()
message(STATUS "zerocpp: ZERO_WITH_CUDA=${ZERO_WITH_CUDA}")
