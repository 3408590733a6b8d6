#include "precision.h"

#include <algorithm>
#include <cmath>

#include <ATen/TensorOperators.h>

namespace zero::detail {

Precision::Precision(const config::Config& config)
    : dtype_(config.bf16.enabled   ? at::kBFloat16
             : config.fp16.enabled ? at::kHalf
                                   : at::kFloat),
      clip_(config.gradient_clipping) {
  LossScalerOptions so;
  if (config.fp16.enabled) {
    so.dynamic = config.fp16.loss_scale == 0.0f;
    so.static_scale = so.dynamic ? 1.0f : config.fp16.loss_scale;
    so.initial_scale_power = config.fp16.initial_scale_power;
    so.loss_scale_window = config.fp16.loss_scale_window;
    so.hysteresis = config.fp16.hysteresis;
    so.consecutive_hysteresis = config.fp16.consecutive_hysteresis;
    so.min_loss_scale = config.fp16.min_loss_scale;
  }
  scaler_ = LossScaler(so);
}

void Precision::backward(const at::Tensor& loss, int accumulation) const {
  const double factor = static_cast<double>(scaler_.scale()) / accumulation;
  if (factor != 1.0) {
    (loss.to(at::kFloat) * factor).backward();
  } else {
    loss.backward();
  }
}

StepDecision Precision::decide(double global_sq, double ranks_summed) {
  // Sum over ranks of the window's mean (ranks_summed of them: 1 where the
  // reduction carried their mean already), times the loss scale -> the
  // mean gradient.
  const double inv = 1.0 / (ranks_summed * scaler_.scale());
  StepDecision d;
  d.norm = std::sqrt(global_sq) * inv;
  if (scaler_.update(!std::isfinite(d.norm))) {
    d.skip = true;
    return d;
  }
  double clip = 1.0;
  if (clip_ > 0.0f) {
    // torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), capped at 1.
    clip = std::min(1.0, clip_ / (d.norm + 1e-6));
  }
  d.clipped_norm = d.norm * clip;
  d.grad_scale = static_cast<float>(inv * clip);
  return d;
}

}  // namespace zero::detail
