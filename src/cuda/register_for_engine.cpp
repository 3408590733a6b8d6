// Registers what the engine needs from zero_cuda on a GPU: the fused Adam and
// Lion kernels as its device optimizer steps (zero/optim/device_kernel_registry.h) and
// exact-size pinned host memory for its offload buffers
// (zero/core/pinned_host_allocator.h). zero_cuda's link interface names the
// symbol below as undefined (CMakeLists.txt), so every program that links
// zero_cuda pulls this object file, and with it the registrars, out of the
// static library.
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "zero/core/pinned_host_allocator.h"
#include "zero/cuda/device_adam.h"
#include "zero/cuda/device_lion.h"
#include "zero/optim/device_kernel_registry.h"

namespace zero::cuda {
namespace {

void device_adam_step(const optim::AdamHyper& hyper, const optim::AdamBuffers& b, void* stream) {
  fused_adam_device(hyper, b.params, b.grads, b.grad_dtype, b.exp_avg, b.exp_avg_sq, b.n,
                    b.grad_scale, b.half_out, b.half_dtype, stream);
}

void* pinned_allocate(std::size_t bytes) {
  void* p = nullptr;
  const cudaError_t rc = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
  if (rc == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not a sticky error: clear it, so later calls do not report it
    throw PinnedHostOutOfMemory(bytes);
  }
  CUDA_CHECK(rc);
  return p;
}

void pinned_release(void* p) {
  if (p != nullptr) (void)cudaFreeHost(p);  // called from deleters: must not throw
}

const bool registered = [] {
  optim::register_device_adam(&device_adam_step);
  optim::register_device_lion(&fused_lion_device);
  register_pinned_host_allocator({&pinned_allocate, &pinned_release});
  return true;
}();

}  // namespace
}  // namespace zero::cuda

// The anchor the linker is told to resolve.
extern "C" {
int zero_cuda_engine_registrar = 1;
}
