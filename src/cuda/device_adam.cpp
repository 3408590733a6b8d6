#include "zero/cuda/device_adam.h"

#include "zero/optim/detail/step_scalars.h"  // optim's own derivation of the per-step scalars
#include "cuda_check.h"
#include "fused_adam_kernel.h"
#include "kernel_dtype_of.h"

namespace zero::cuda {

void fused_adam_device(const optim::AdamHyper& hyper, float* params, const void* grads,
                       DType grad_dtype, float* exp_avg, float* exp_avg_sq, std::size_t n,
                       float grad_scale, void* half_out, DType half_dtype, void* cuda_stream) {
  optim::AdamBuffers b;
  b.params = params;
  b.grads = grads;
  b.grad_dtype = grad_dtype;
  b.exp_avg = exp_avg;
  b.exp_avg_sq = exp_avg_sq;
  b.n = n;
  b.grad_scale = grad_scale;
  b.half_out = half_out;
  b.half_dtype = half_dtype;
  // The same checks and the same scalars (computed in double, rounded to
  // float) as optim::adam_step and adam_step_reference.
  const optim::detail::AdamScalars s = optim::detail::adam_scalars(hyper, b);
  if (n == 0) return;

  detail::FusedAdamArgs a;
  a.params = params;
  a.grads = grads;
  a.grad_kind = detail::grad_kind(grad_dtype);
  a.exp_avg = exp_avg;
  a.exp_avg_sq = exp_avg_sq;
  a.n = n;
  a.half_out = half_out;
  a.half_kind = detail::half_kind(half_out, half_dtype);
  a.grad_scale = s.grad_scale;
  a.l2 = s.l2;
  a.decay = s.decay;
  a.beta1 = s.beta1;
  a.one_minus_beta1 = s.one_minus_beta1;
  a.beta2 = s.beta2;
  a.one_minus_beta2 = s.one_minus_beta2;
  a.inv_sqrt_bc2 = s.inv_sqrt_bc2;
  a.eps = s.eps;
  a.step_size = s.step_size;
  CUDA_CHECK(detail::launch_fused_adam(a, cuda_stream));
}

}  // namespace zero::cuda
