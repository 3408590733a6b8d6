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

namespace zero {

struct PinnedHostAllocator {
  void* (*allocate)(std::size_t bytes);  // throws zero::Error when it cannot
  void (*release)(void* ptr);
};

// Registers the allocator (the last registration wins). Thread-safe.
void register_pinned_host_allocator(PinnedHostAllocator allocator);
// The registered allocator, or nullptr when none is linked in.
const PinnedHostAllocator* pinned_host_allocator();

}  // namespace zero
