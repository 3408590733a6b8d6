#include "zero/cuda/pinned_buffer.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "cuda_check.h"

namespace zero::cuda {

PinnedBuffer::PinnedBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaHostAlloc(&data_, bytes, cudaHostAllocPortable));
  size_ = bytes;
}

PinnedBuffer::~PinnedBuffer() { reset(); }

void PinnedBuffer::reset() noexcept {
  if (data_ != nullptr) (void)cudaFreeHost(data_);  // a destructor must not throw
  data_ = nullptr;
  size_ = 0;
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void copy_async(void* dst, const void* src, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                             static_cast<cudaStream_t>(stream)));
}

}  // namespace zero::cuda
