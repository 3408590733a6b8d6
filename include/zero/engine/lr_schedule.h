// Learning-rate schedules with DeepSpeed's names and meaning
// (deepspeed/runtime/lr_schedules.py):
//   ""              constant base lr
//   WarmupLR        warm-up from warmup_min_lr to warmup_max_lr over
//                   warmup_num_steps ("log": min + (max-min) * ln(s+1)/ln(W);
//                   "linear": min + (max-min) * s/W), then constant
//   WarmupDecayLR   the same warm-up, then linear decay to 0 at total_num_steps
//   WarmupCosineLR  the same warm-up (from warmup_min_lr), then cosine from
//                   warmup_max_lr down to cos_min_ratio * warmup_max_lr at
//                   total_num_steps
// `step` counts optimizer steps from 0.
#pragma once

#include <cstdint>

#include "zero/config/config.h"

namespace zero {

class LrSchedule {
 public:
  LrSchedule(const config::SchedulerConfig& s, float base_lr);
  float lr(std::int64_t step) const;

 private:
  float warmup(std::int64_t step) const;
  config::SchedulerConfig s_;
  float base_lr_;
};

}  // namespace zero
