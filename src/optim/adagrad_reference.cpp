// The scalar reference of adagrad_step: the same maths as adagrad_kernel.cpp,
// one element at a time, in the same order of operations.
#include <cmath>

#include "half_scalar.h"
#include "zero/optim/detail/step_scalars.h"
#include "zero/optim/adagrad.h"

namespace zero::optim {

void adagrad_step_reference(const AdagradHyper& hyper, const AdagradBuffers& b) {
  const detail::AdagradScalars s = detail::adagrad_scalars(hyper, b);
  const bool l2 = s.l2 != 0.0f;  // torch.optim.Adagrad adds wd * p only when wd != 0
  for (std::size_t i = 0; i < b.n; ++i) {
    float p = b.params[i];
    float g = detail::load_as_float(b.grads, b.grad_dtype, i) * s.grad_scale;
    if (l2) g = g + s.l2 * p;
    const float sum = b.state_sum[i] + g * g;                  // sum.addcmul_(g, g, 1)
    const float std_dev = std::sqrt(sum) + s.eps;              // sum.sqrt().add_(eps)
    p = p - (s.clr * g) / std_dev;                             // p.addcdiv_(g, std, -clr)
    b.params[i] = p;
    b.state_sum[i] = sum;
    if (b.half_out != nullptr) detail::store_from_float(b.half_out, b.half_dtype, i, p);
  }
}

}  // namespace zero::optim
