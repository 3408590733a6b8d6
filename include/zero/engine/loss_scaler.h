// Loss scaling for fp16 training, with DeepSpeed's semantics
// (deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler, as of 0.18):
//
//  - static: loss_scale > 0 keeps that scale forever; an overflow still skips
//    the step.
//  - dynamic (loss_scale == 0): start at 2^initial_scale_power. On an overflow
//    the step is skipped; if `hysteresis` overflows have been tolerated the
//    scale is divided by 2 (never below min_loss_scale), otherwise one unit of
//    hysteresis is spent. When `loss_scale_window` steps without overflow
//    have passed since the last one (or the start) before this step, the
//    scale doubles and the hysteresis is refilled: at the (W+1)-th clean
//    step, then every W (DeepSpeed before 0.18 doubled one step sooner).
//    With consecutive_hysteresis every step without overflow refills it, so
//    only `hysteresis` overflows in a row halve the scale. An overflow with
//    the scale at min_loss_scale and the hysteresis spent throws (DeepSpeed's
//    raise_error_at_min_scale): nothing is left to lower.
// bf16 and fp32 training use a scale of 1 that never changes; a non-finite
// gradient there still skips the step (counted and logged), so a bad batch
// never poisons the weights.
#pragma once

#include <cstdint>

namespace zero {

struct LossScalerOptions {
  bool dynamic = false;
  float static_scale = 1.0f;     // used when !dynamic
  int initial_scale_power = 16;  // dynamic: initial scale 2^power
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  float min_loss_scale = 1.0f;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& opts = {});

  float scale() const { return scale_; }
  // Call once per optimizer step with whether any rank saw a non-finite
  // gradient. Returns true when the step must be skipped; throws
  // zero::Error, changing nothing, on an overflow at the floor.
  bool update(bool overflow);

  std::int64_t skipped_steps() const { return skipped_; }
  int hysteresis_left() const { return hysteresis_left_; }

  // Everything that changes, for checkpoints: restore(state()) continues
  // exactly where the scaler was.
  struct State {
    float scale = 1.0f;
    int hysteresis_left = 0;
    std::int64_t iter = 0, last_overflow_iter = -1, skipped = 0;
  };
  State state() const { return {scale_, hysteresis_left_, iter_, last_overflow_iter_, skipped_}; }
  void restore(const State& s);

 private:
  LossScalerOptions opts_;
  float scale_;
  int hysteresis_left_;
  std::int64_t iter_ = 0;
  std::int64_t last_overflow_iter_ = -1;
  std::int64_t skipped_ = 0;
};

}  // namespace zero
