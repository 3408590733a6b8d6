#include "zero/engine/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace zero {

LrSchedule::LrSchedule(const config::SchedulerConfig& s, float base_lr) : s_(s), base_lr_(base_lr) {
  if (s_.warmup_max_lr == 0.0f) s_.warmup_max_lr = base_lr;
}

float LrSchedule::warmup(std::int64_t step) const {
  const double w = static_cast<double>(std::max<std::int64_t>(s_.warmup_num_steps, 1));
  const double frac = s_.warmup_type == "linear"
                          ? static_cast<double>(step) / w
                          : std::log(static_cast<double>(step) + 1.0) / std::log(std::max(w, 2.0));
  return static_cast<float>(s_.warmup_min_lr + (s_.warmup_max_lr - s_.warmup_min_lr) * std::min(1.0, frac));
}

float LrSchedule::lr(std::int64_t step) const {
  if (s_.type.empty()) return base_lr_;
  if (step < s_.warmup_num_steps) return warmup(step);
  const double max_lr = s_.warmup_max_lr;
  if (s_.type == "WarmupLR") return static_cast<float>(max_lr);
  const double span = static_cast<double>(std::max<std::int64_t>(s_.total_num_steps - s_.warmup_num_steps, 1));
  const double progress = std::clamp(static_cast<double>(step - s_.warmup_num_steps) / span, 0.0, 1.0);
  if (s_.type == "WarmupDecayLR") return static_cast<float>(max_lr * (1.0 - progress));
  // WarmupCosineLR
  const double ratio = s_.cos_min_ratio;
  return static_cast<float>(max_lr * (ratio + (1.0 - ratio) * 0.5 * (1.0 + std::cos(M_PI * progress))));
}

}  // namespace zero
