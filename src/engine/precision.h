// The training precision and what follows from it at each step: the loss
// scale (fp16), and from the global gradient norm the step's decision:
// skip (non-finite), or the one factor the optimizer multiplies the summed
// gradients by (1 / (world * accumulation * loss scale) times the clip
// coefficient).
#pragma once

#include <cstdint>

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>

#include "zero/config/config.h"
#include "zero/engine/loss_scaler.h"

namespace zero::detail {

struct StepDecision {
  bool skip = false;          // non-finite gradients: no update, the scaler backed off
  double norm = 0.0;          // global norm of the averaged gradient, before clipping
  double clipped_norm = 0.0;  // after
  float grad_scale = 1.0f;    // what the optimizer multiplies the summed gradients by
};

class Precision {
 public:
  explicit Precision(const config::Config& config);

  c10::ScalarType dtype() const { return dtype_; }
  float loss_scale() const { return scaler_.scale(); }
  std::int64_t skipped_steps() const { return scaler_.skipped_steps(); }
  LossScaler& scaler() { return scaler_; }

  // backward() of loss times the current scale over the micro-batches of
  // the window, as DeepSpeed's engine does (scale_wrt_gas): the gradients
  // summed over a window are then no larger than one micro-batch's, and
  // fp16's range holds them at the same loss scale whatever the accumulation.
  void backward(const at::Tensor& loss, int accumulation) const;

  // global_sq: the squared norm of the gradients summed over
  // `ranks_summed` ranks (each already the window's mean; 1 where the
  // reduction divided by the ranks first), still times the loss scale.
  // Updates the scaler.
  StepDecision decide(double global_sq, double ranks_summed);

 private:
  c10::ScalarType dtype_;
  LossScaler scaler_;
  float clip_;
};

}  // namespace zero::detail
