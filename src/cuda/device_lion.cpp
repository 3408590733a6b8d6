#include "zero/cuda/device_lion.h"

#include "zero/optim/detail/step_scalars.h"  // optim's own derivation of the per-step scalars
#include "cuda_check.h"
#include "fused_lion_kernel.h"
#include "kernel_dtype_of.h"

namespace zero::cuda {

void fused_lion_device(const optim::LionHyper& hyper, const optim::LionBuffers& b, void* cuda_stream) {
  // The same checks and the same scalars as optim::lion_step and its reference.
  const optim::detail::LionScalars s = optim::detail::lion_scalars(hyper, b);
  if (b.n == 0) return;
  detail::FusedLionArgs a;
  a.params = b.params;
  a.grads = b.grads;
  a.grad_kind = detail::grad_kind(b.grad_dtype);
  a.exp_avg = b.exp_avg;
  a.n = b.n;
  a.half_out = b.half_out;
  a.half_kind = detail::half_kind(b.half_out, b.half_dtype);
  a.grad_scale = s.grad_scale;
  a.lr = s.lr;
  a.decay = s.decay;
  a.beta1 = s.beta1;
  a.one_minus_beta1 = s.one_minus_beta1;
  a.beta2 = s.beta2;
  a.one_minus_beta2 = s.one_minus_beta2;
  CUDA_CHECK(detail::launch_fused_lion(a, cuda_stream));
}

}  // namespace zero::cuda
