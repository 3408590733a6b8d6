#include "zero/engine/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "zero/core/error.h"

namespace zero {

LossScaler::LossScaler(const LossScalerOptions& opts)
    : opts_(opts),
      scale_(opts.dynamic ? std::ldexp(1.0f, opts.initial_scale_power) : opts.static_scale),
      hysteresis_left_(opts.hysteresis) {
  // (The config refuses it too, naming the keys; this is for a scaler built
  // from options set in code.)
  ZERO_CHECK(!opts.dynamic || opts.min_loss_scale <= scale_, "fp16: min_loss_scale ", opts.min_loss_scale,
             " is above the dynamic loss scale's start, 2^initial_scale_power = ", scale_,
             ": the scale could never come down to it; lower min_loss_scale or raise initial_scale_power");
}

void LossScaler::restore(const State& s) {
  // A static scale stays the configured one (the checkpoint may come from
  // a run with another); the counters carry over.
  if (opts_.dynamic) {
    scale_ = s.scale;
    hysteresis_left_ = s.hysteresis_left;
  }
  iter_ = s.iter;
  last_overflow_iter_ = s.last_overflow_iter;
  skipped_ = s.skipped;
}

bool LossScaler::update(bool overflow) {
  // DeepSpeed's DynamicLossScaler (raise_error_at_min_scale, on in its ZeRO
  // optimizers) ends the run here: halving cannot go on.
  ZERO_CHECK(!(overflow && opts_.dynamic && hysteresis_left_ <= 1 && scale_ <= opts_.min_loss_scale),
             "fp16: the gradients overflowed with the loss scale already at its minimum (fp16.min_loss_scale ",
             opts_.min_loss_scale, ") and the hysteresis spent, so a smaller scale cannot help (DeepSpeed ends the "
             "run here too: \"Current loss scale already at minimum\"). The model diverged or fp16 cannot hold its "
             "gradients: lower the learning rate, keep gradient_clipping on, train in bf16, or lower "
             "fp16.min_loss_scale");
  if (overflow) {
    ++skipped_;
    if (opts_.dynamic) {
      if (hysteresis_left_ <= 1) {
        scale_ = std::max(scale_ / 2.0f, opts_.min_loss_scale);
      } else {
        --hysteresis_left_;
      }
    }
    last_overflow_iter_ = iter_;
  } else if (opts_.dynamic) {
    // DeepSpeed (0.18 on) counts the steps without overflow since the last
    // overflow (or since the start) before this one, and doubles at each
    // full window of them: a window of W doubles at the (W+1)-th clean step.
    // (Earlier DeepSpeed doubled one step sooner, at (iter - last) % W == 0.)
    const std::int64_t stable = iter_ - last_overflow_iter_ - 1;
    const bool doubles = stable > 0 && stable % opts_.loss_scale_window == 0;
    if (opts_.consecutive_hysteresis || doubles) hysteresis_left_ = opts_.hysteresis;
    if (doubles) scale_ *= 2.0f;
  }
  ++iter_;
  return overflow;
}

}  // namespace zero
