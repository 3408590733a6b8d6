// The scalar reference of lion_step: the same maths as lion_kernel.cpp, one
// element at a time, in the same order of operations.
#include <cmath>
#include <limits>

#include "half_scalar.h"
#include "zero/optim/detail/step_scalars.h"
#include "zero/optim/lion.h"

namespace zero::optim {

void lion_step_reference(const LionHyper& hyper, const LionBuffers& b) {
  const detail::LionScalars s = detail::lion_scalars(hyper, b);
  for (std::size_t i = 0; i < b.n; ++i) {
    const float g = detail::load_as_float(b.grads, b.grad_dtype, i) * s.grad_scale;
    const float m = b.exp_avg[i];
    const float c = s.beta1 * m + s.one_minus_beta1 * g;
    float sign = std::numeric_limits<float>::quiet_NaN();
    if (std::isfinite(c)) sign = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
    const float p = b.params[i] * s.decay - s.lr * sign;
    b.params[i] = p;
    b.exp_avg[i] = s.beta2 * m + s.one_minus_beta2 * g;
    if (b.half_out != nullptr) detail::store_from_float(b.half_out, b.half_dtype, i, p);
  }
}

}  // namespace zero::optim
