// Shared by the tests of zero_cuda: the "no device" skip, whose message the
// ctest registration (CMakeLists.txt) recognises to report "Skipped".
#pragma once

#include <gtest/gtest.h>

#include "zero/cuda/device_info.h"

// Skips the test when this machine has no GPU for the process: CUDA sees no
// device and no NVIDIA kernel driver is loaded. A machine whose driver is
// loaded but whose CUDA fails (a broken or mismatched driver) fails the test
// with CUDA's error instead: a GPU host must not pass by skipping. The text
// "no CUDA device" is what ctest's SKIP_REGULAR_EXPRESSION matches.
#define ZERO_SKIP_WITHOUT_CUDA_DEVICE()                                                           \
  do {                                                                                            \
    if (::zero::cuda::cuda_device_count() == 0) {                                                 \
      if (::zero::cuda::nvidia_driver_present()) {                                                \
        FAIL() << "an NVIDIA driver is loaded but CUDA sees no device ("                          \
               << ::zero::cuda::cuda_device_count_error()                                         \
               << "): check nvidia-smi, the driver against the CUDA runtime, CUDA_VISIBLE_DEVICES"; \
      }                                                                                           \
      GTEST_SKIP() << "no CUDA device (no NVIDIA driver, no GPU): this test runs on a GPU "       \
                      "machine, see docs/gpu.md";                                                 \
    }                                                                                             \
  } while (0)
