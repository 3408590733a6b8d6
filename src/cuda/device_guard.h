// DeviceGuard: makes a device current for a scope and restores the previous
// one (c10::cuda::CUDAGuard's job). CUDA calls on events and streams must run
// with their device current; the caller's thread may have another one.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda_check.h"

namespace zero::cuda::detail {

class DeviceGuard {
 public:
  // Throws zero::Error if the device cannot be made current.
  explicit DeviceGuard(int device) {
    CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) {
      CUDA_CHECK(cudaSetDevice(device));
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace zero::cuda::detail
