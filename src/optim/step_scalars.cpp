#include "zero/optim/detail/step_scalars.h"

#include <cmath>

#include "zero/core/error.h"

namespace zero::optim::detail {
namespace {

void check_half_out(const void* half_out, DType half_dtype) {
  ZERO_CHECK(half_out == nullptr || half_dtype != DType::kFloat32,
             "half_out must be bf16 or fp16 (half_dtype is fp32); leave half_out null for no copy");
}

}  // namespace

AdamScalars adam_scalars(const AdamHyper& h, const AdamBuffers& b) {
  ZERO_CHECK(h.step >= 1, "AdamHyper::step is the step number after increment (>= 1), got ",
             h.step);
  ZERO_CHECK(b.n == 0 || (b.params && b.grads && b.exp_avg && b.exp_avg_sq),
             "AdamBuffers: params, grads, exp_avg and exp_avg_sq must be set when n > 0 (n=", b.n,
             ")");
  check_half_out(b.half_out, b.half_dtype);

  // Doubles as LibTorch's options are; the float hyper-parameters widen exactly.
  const double lr = h.lr, beta1 = h.beta1, beta2 = h.beta2, wd = h.weight_decay;
  const double step = static_cast<double>(h.step);
  const double bc1 = h.bias_correction ? 1.0 - std::pow(beta1, step) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(beta2, step) : 1.0;

  AdamScalars s;
  s.grad_scale = b.grad_scale;
  if (h.decoupled_weight_decay) {
    s.decay = static_cast<float>(1.0 - lr * wd);
  } else {
    s.l2 = h.weight_decay;
  }
  s.beta1 = h.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = h.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  s.eps = h.eps;
  s.step_size = static_cast<float>(lr / bc1);
  return s;
}

AdagradScalars adagrad_scalars(const AdagradHyper& h, const AdagradBuffers& b) {
  ZERO_CHECK(h.step >= 1, "AdagradHyper::step is the step number after increment (>= 1), got ",
             h.step);
  ZERO_CHECK(b.n == 0 || (b.params && b.grads && b.state_sum),
             "AdagradBuffers: params, grads and state_sum must be set when n > 0 (n=", b.n, ")");
  check_half_out(b.half_out, b.half_dtype);

  AdagradScalars s;
  s.grad_scale = b.grad_scale;
  s.l2 = h.weight_decay;
  s.clr = static_cast<float>(static_cast<double>(h.lr) /
                             (1.0 + static_cast<double>(h.step - 1) * h.lr_decay));
  s.eps = h.eps;
  return s;
}

LionScalars lion_scalars(const LionHyper& h, const LionBuffers& b) {
  ZERO_CHECK(b.n == 0 || (b.params && b.grads && b.exp_avg),
             "LionBuffers: params, grads and exp_avg must be set when n > 0 (n=", b.n, ")");
  check_half_out(b.half_out, b.half_dtype);

  const double lr = h.lr, beta1 = h.beta1, beta2 = h.beta2, wd = h.weight_decay;
  LionScalars s;
  s.grad_scale = b.grad_scale;
  s.lr = h.lr;
  s.decay = static_cast<float>(1.0 - lr * wd);
  s.beta1 = h.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = h.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  return s;
}

}  // namespace zero::optim::detail
