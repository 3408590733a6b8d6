// Where the engine gets page-locked ("pinned") host memory of an exact size.
//
// The engine's offload buffers on a GPU must be pinned (copies then run at
// the link's speed, asynchronously), and they are the largest allocations of
// the job: 12-16 bytes per parameter. LibTorch's pinned allocator rounds each
// request up to a power of two (a 4.8 GB master partition takes 8 GB), so the
// engine asks for exact sizes from here instead. zero_cuda registers
// cudaHostAlloc/cudaFreeHost at static initialisation
// (src/cuda/register_for_engine.cpp), as it registers its device Adam; the
// engine layer itself links no CUDA (docs/gpu.md).
#pragma once

#include <cstddef>
#include <new>
#include <string>

namespace zero {

// What an allocator throws when the page-locked memory for `bytes` is not
// there (the engine's out-of-memory translation names it, with what the
// engine holds; out_of_memory.h).
class PinnedHostOutOfMemory : public std::bad_alloc {
 public:
  explicit PinnedHostOutOfMemory(std::size_t bytes);
  std::size_t bytes() const { return bytes_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::size_t bytes_;
  std::string what_;
};

struct PinnedHostAllocator {
  // Throws PinnedHostOutOfMemory when the memory is not there, zero::Error
  // for any other failure.
  void* (*allocate)(std::size_t bytes);
  void (*release)(void* ptr);
};

// Registers the allocator (the last registration wins). Thread-safe.
void register_pinned_host_allocator(PinnedHostAllocator allocator);
// The registered allocator, or nullptr when none is linked in.
const PinnedHostAllocator* pinned_host_allocator();

}  // namespace zero
