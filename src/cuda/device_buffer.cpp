#include "zero/cuda/device_buffer.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "cuda_check.h"

namespace zero::cuda {

DeviceBuffer::DeviceBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMalloc(&data_, bytes));
  size_ = bytes;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

void DeviceBuffer::reset() noexcept {
  if (data_ != nullptr) (void)cudaFree(data_);  // a destructor must not throw
  data_ = nullptr;
  size_ = 0;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace zero::cuda
