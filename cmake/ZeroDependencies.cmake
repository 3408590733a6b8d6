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
# CMake 3.25 knows no CUDA C++20 dialect for nvcc; Torch's config sets
# CMAKE_CUDA_STANDARD to the C++ standard (20) only when it is unset, which
# would make every CUDA target fail at generation. CUDA sources are C++17.
if(NOT CMAKE_CUDA_STANDARD)
  set(CMAKE_CUDA_STANDARD 17)
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

# CUDA code (src/cuda, zero_cuda) and NCCL. The CUDA language is already on
# when the LibTorch has CUDA (its config enables it); say so explicitly.
if(ZERO_WITH_CUDA)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # NCCL: the CUDA toolkit's (here /usr/local/cuda), else the torch wheel's
  # (site-packages/nvidia/nccl: what a GPU machine with only the wheel has;
  # it ships libnccl.so.2 without the libnccl.so link).
  get_filename_component(_zero_site_packages "${Torch_DIR}/../../../.." ABSOLUTE)
  set(_zero_nccl_hints
    ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_TARGET_DIR}
    ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda "${_zero_site_packages}/nvidia/nccl")
  find_path(ZERO_NCCL_INCLUDE_DIR nccl.h HINTS ${_zero_nccl_hints} PATH_SUFFIXES include)
  find_library(ZERO_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_zero_nccl_hints}
               PATH_SUFFIXES lib64 lib)
  if(ZERO_NCCL_INCLUDE_DIR AND ZERO_NCCL_LIBRARY)
    set(_zero_nccl_found ON)
  else()
    set(_zero_nccl_found OFF)
  endif()
  if(ZERO_WITH_NCCL STREQUAL "AUTO")
    set(ZERO_WITH_NCCL ${_zero_nccl_found})
  endif()
  if(ZERO_WITH_NCCL AND NOT _zero_nccl_found)
    message(FATAL_ERROR "ZERO_WITH_NCCL=ON but nccl.h / libnccl were not found (looked in "
      "${_zero_nccl_hints}); pass -DZERO_NCCL_INCLUDE_DIR=... -DZERO_NCCL_LIBRARY=...")
  endif()
  if(ZERO_WITH_NCCL)
    add_library(zero::nccl UNKNOWN IMPORTED)
    set_target_properties(zero::nccl PROPERTIES
      IMPORTED_LOCATION "${ZERO_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${ZERO_NCCL_INCLUDE_DIR}")
    message(STATUS "zerocpp: NCCL ${ZERO_NCCL_LIBRARY} (headers ${ZERO_NCCL_INCLUDE_DIR})")
  endif()
else()
  if(ZERO_WITH_NCCL AND NOT ZERO_WITH_NCCL STREQUAL "AUTO")
    message(FATAL_ERROR "ZERO_WITH_NCCL=ON needs ZERO_WITH_CUDA")
  endif()
  set(ZERO_WITH_NCCL OFF)
endif()
message(STATUS "zerocpp: ZERO_WITH_NCCL=${ZERO_WITH_NCCL}")
