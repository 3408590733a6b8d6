// The scalar reference of adam_step: the same maths as the SIMD kernel
// (adam_kernel.cpp), one element at a time, in the same order of operations.
#include <cmath>

#include "half_scalar.h"
#include "zero/optim/detail/step_scalars.h"
#include "zero/optim/adam.h"

namespace zero::optim {

void adam_step_reference(const AdamHyper& hyper, const AdamBuffers& b) {
  const detail::AdamScalars s = detail::adam_scalars(hyper, b);
  const bool l2 = s.l2 != 0.0f;  // torch.optim.Adam adds wd * p only when wd != 0
  for (std::size_t i = 0; i < b.n; ++i) {
    float p = b.params[i];
    float g = detail::load_as_float(b.grads, b.grad_dtype, i) * s.grad_scale;
    if (l2) {
      g = g + s.l2 * p;      // Adam (L2)
    } else {
      p = p * s.decay;       // AdamW: p *= 1 - lr * wd
    }
    const float m = b.exp_avg[i] * s.beta1 + s.one_minus_beta1 * g;
    const float v = b.exp_avg_sq[i] * s.beta2 + (s.one_minus_beta2 * g) * g;
    const float denom = std::sqrt(v) * s.inv_sqrt_bc2 + s.eps;
    p = p - (s.step_size * m) / denom;  // LibTorch's addcdiv order: (value * t1) / t2
    b.params[i] = p;
    b.exp_avg[i] = m;
    b.exp_avg_sq[i] = v;
    if (b.half_out != nullptr) detail::store_from_float(b.half_out, b.half_dtype, i, p);
  }
}

}  // namespace zero::optim
