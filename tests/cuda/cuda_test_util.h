// Shared by the tests of zero_cuda: the "no device" skip, whose message the
// ctest registration (CMakeLists.txt) recognises to report "Skipped".
#pragma once

#include <gtest/gtest.h>

#include "zero/cuda/device_info.h"

// Skips the test when CUDA has no device for this process. The text
// "no CUDA device" is what ctest's SKIP_REGULAR_EXPRESSION matches.
#define ZERO_SKIP_WITHOUT_CUDA_DEVICE()                                                     \
  do {                                                                                      \
    if (::zero::cuda::cuda_device_count() == 0) {                                           \
      GTEST_SKIP() << "no CUDA device (no driver or no GPU): this test runs on a GPU "      \
                      "machine, see docs/gpu.md";                                           \
    }                                                                                       \
  } while (0)
