#include "zero/engine/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "zero/core/error.h"

namespace zero {

LossScaler::LossScaler(const LossScalerOptions& opts)
    : opts_(opts),
      scale_(opts.dynamic ? std::ldexp(1.0f, opts.initial_scale_power) : opts.static_scale),
      hysteresis_left_(opts.hysteresis) {
  // (The config clamps it; options set in code are checked here: a floor
  // of 0 or NaN is never reached, and the scale would decay to nothing.)
  ZERO_CHECK(!opts.dynamic || (opts.min_loss_scale > 0.0f && std::isfinite(opts.min_loss_scale)),
             "fp16: min_loss_scale must be a finite number > 0 (the config's 0 means the smallest normal float), got ",
             opts.min_loss_scale);
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
  // optimizers) ends the run here: halving cannot go on. (At the floor
  // exactly: a scale that starts below a floor above it is raised to the
  // floor by its first halving, max(scale / 2, min), as in DeepSpeed.)
  ZERO_CHECK(!(overflow && opts_.dynamic && hysteresis_left_ <= 1 && scale_ == opts_.min_loss_scale),
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
    // (At most 2^127, the largest power of two a float holds: doubled past
    // it the scale is inf, and every later step would overflow.)
    if (doubles && scale_ < std::ldexp(1.0f, 127)) scale_ *= 2.0f;
  }
  ++iter_;
  return overflow;
}

}  // namespace zero
