// Registers zero_cuda's fused Adam kernel as the engine's device optimizer
// step (zero/optim/device_adam_registry.h). zero_cuda's link interface names
// the symbol below as undefined (CMakeLists.txt), so every program that links
// zero_cuda pulls this object file, and with it the registrar, out of the
// static library.
#include "zero/cuda/device_adam.h"
#include "zero/optim/device_adam_registry.h"

namespace zero::cuda {
namespace {

void device_adam_step(const optim::AdamHyper& hyper, const optim::AdamBuffers& b, void* stream) {
  fused_adam_device(hyper, b.params, b.grads, b.grad_dtype, b.exp_avg, b.exp_avg_sq, b.n,
                    b.grad_scale, b.half_out, b.half_dtype, stream);
}

const bool registered = [] {
  optim::register_device_adam(&device_adam_step);
  return true;
}();

}  // namespace
}  // namespace zero::cuda

// The anchor the linker is told to resolve.
extern "C" int zero_cuda_device_adam_registrar = 1;
