// Page-locked ("pinned") host memory and asynchronous copies: what the
// engine's offload will use on a GPU. A copy between device memory and a
// PinnedBuffer runs on the DMA engines without the CPU and can overlap
// kernels on other streams; from pageable memory (std::vector) the same
// cudaMemcpyAsync is staged through a driver buffer and is not asynchronous.
#pragma once

#include <cstddef>

namespace zero::cuda {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  // `bytes` of uninitialised pinned host memory (cudaHostAlloc with
  // cudaHostAllocPortable: pinned for every device of the process, whichever
  // is current now). bytes == 0 allocates nothing and makes no CUDA call.
  // Throws zero::Error (no driver, out of pinnable memory). Pinning is slow
  // (it maps and locks every page): allocate once, reuse.
  explicit PinnedBuffer(std::size_t bytes);
  // Destroy it only once no enqueued copy uses it any more.
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

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

// Enqueues a copy of `bytes` from `src` to `dst` on `stream` (a cudaStream_t
// as void*; nullptr is the legacy default stream) and returns; the direction
// comes from the pointers (cudaMemcpyDefault, unified addressing), so any mix
// of device, pinned and pageable memory works. Both buffers belong to the
// copy until the stream has passed it (stream_synchronize(), or an event).
// bytes == 0 does nothing. Throws zero::Error if the copy cannot be enqueued.
void copy_async(void* dst, const void* src, std::size_t bytes, void* stream);

}  // namespace zero::cuda
