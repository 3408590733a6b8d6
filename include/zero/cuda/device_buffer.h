// DeviceBuffer: an owned allocation of device memory (cudaMalloc on the
// current device, cudaFree on destruction), for code and tests that must not
// include CUDA headers. Fill and read it with copy_async (pinned_buffer.h).
#pragma once

#include <cstddef>

namespace zero::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `bytes` of uninitialised device memory, aligned to 256 bytes (cudaMalloc).
  // bytes == 0 allocates nothing (data() is null) and makes no CUDA call.
  // Throws zero::Error (out of memory, no device).
  explicit DeviceBuffer(std::size_t bytes);
  // Destroy it only once no enqueued kernel or copy uses it any more.
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void reset() noexcept;

  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace zero::cuda
