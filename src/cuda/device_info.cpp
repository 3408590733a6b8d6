#include "zero/cuda/device_info.h"

#include <filesystem>

#include <cuda_runtime_api.h>

#include "cuda_check.h"

namespace zero::cuda {

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    // cudaErrorInsufficientDriver without a driver, cudaErrorNoDevice
    // without a GPU: not an error for a probe. Clear it so that the next
    // cudaGetLastError() does not report it.
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::string cuda_device_count_error() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess) return "";
  (void)cudaGetLastError();
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

bool nvidia_driver_present() {
  std::error_code ec;
  return std::filesystem::exists("/dev/nvidiactl", ec) || std::filesystem::exists("/proc/driver/nvidia/version", ec);
}

void set_cuda_device(int device) { CUDA_CHECK(cudaSetDevice(device)); }

int current_cuda_device() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void cuda_device_synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace zero::cuda
