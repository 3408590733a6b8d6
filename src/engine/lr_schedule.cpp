#include "zero/engine/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace zero {

LrSchedule::LrSchedule(const config::SchedulerConfig& s, float base_lr) : s_(s), base_lr_(base_lr) {
  if (s_.warmup_max_lr == 0.0f) s_.warmup_max_lr = base_lr;
}

// DeepSpeed warms up over max(2, warmup_num_steps) steps (its log curve
// divides by ln W).
std::int64_t LrSchedule::warmup_steps() const { return std::max<std::int64_t>(s_.warmup_num_steps, 2); }

float LrSchedule::warmup(std::int64_t step) const {
  const double w = static_cast<double>(warmup_steps());
  const double gamma = s_.warmup_type == "linear" ? static_cast<double>(step) / w
                                                  : std::log(static_cast<double>(step) + 1.0) / std::log(w);
  return static_cast<float>(s_.warmup_min_lr + (s_.warmup_max_lr - s_.warmup_min_lr) * gamma);
}

float LrSchedule::applied(std::int64_t taken) const {
  if (taken > 0 || s_.type.empty()) return lr(taken - 1);
  // Before DeepSpeed's scheduler has stepped: WarmupLR's get_lr() returns
  // min_lrs there (WarmupDecayLR inherits it), WarmupCosineLR's 0; OneCycle
  // and LRRangeTest set their minimum at construction.
  if (s_.type == "OneCycle") return s_.one_cycle.cycle_min_lr;
  if (s_.type == "LRRangeTest") return s_.range_test.min_lr;
  return s_.type == "WarmupCosineLR" ? 0.0f : s_.warmup_min_lr;
}

std::int64_t LrSchedule::cycle_steps() const {
  return s_.one_cycle.cycle_first_step_size + s_.one_cycle.cycle_second_step_size;
}

// DeepSpeed's decay_interval: (k - F - S + 1) / decay_step_size.
double LrSchedule::decay_intervals(std::int64_t step) const {
  return static_cast<double>(step - cycle_steps() + 1) / static_cast<double>(s_.one_cycle.decay_step_size);
}

// DeepSpeed's OneCycle._get_scale_factor, in the same double arithmetic.
double LrSchedule::cycle_scale(std::int64_t step) const {
  const config::OneCycleConfig& c = s_.one_cycle;
  const double first = static_cast<double>(c.cycle_first_step_size);
  const double second = static_cast<double>(c.cycle_second_step_size);
  const double total = first + second, step_ratio = first / total;
  const double b = static_cast<double>(step + 1);
  const double x = 1.0 + b / total - std::floor(1.0 + b / total);
  double scale = 0.0;
  std::int64_t stairs = 0;
  if (x <= step_ratio) {
    scale = x / step_ratio;
    stairs = c.cycle_first_stair_count;
  } else {
    scale = (x - 1.0) / (step_ratio - 1.0);
    stairs = c.cycle_second_stair_count;
  }
  if (stairs > 0) {
    // From the step within the cycle, not from the scale (a scale a hair
    // under an exact stair would drop a whole stair), as DeepSpeed does.
    const double at = std::fmod(b, total);
    const double position = at <= first ? at * static_cast<double>(stairs) / first
                                        : (total - at) * static_cast<double>(stairs) / second;
    scale = std::floor(position) / static_cast<double>(stairs);
  }
  return scale;
}

std::optional<LrSchedule::Betas> LrSchedule::betas(std::int64_t step) const {
  const config::OneCycleConfig& c = s_.one_cycle;
  if (s_.type != "OneCycle" || !c.cycle_momentum) return std::nullopt;
  constexpr float kBeta2 = 0.99f;  // DeepSpeed's OneCycle sets (momentum, 0.99)
  const double max_mom = c.cycle_max_mom, min_mom = c.cycle_min_mom;
  if (step < cycle_steps()) {
    return Betas{static_cast<float>(max_mom - (max_mom - min_mom) * cycle_scale(step)), kBeta2};
  }
  if (c.decay_step_size == 0 || c.decay_mom_rate == 0.0f) return Betas{c.cycle_max_mom, kBeta2};
  const double interval = decay_intervals(step);
  return Betas{static_cast<float>(max_mom * (1.0 + c.decay_mom_rate * interval)), kBeta2};
}

std::optional<LrSchedule::Betas> LrSchedule::applied_betas(std::int64_t taken) const {
  if (taken > 0) return betas(taken - 1);
  if (s_.type != "OneCycle" || !s_.one_cycle.cycle_momentum) return std::nullopt;
  return Betas{s_.one_cycle.cycle_min_mom, 0.99f};
}

std::string LrSchedule::describe() const {
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  if (s_.type.empty()) return "constant " + num(base_lr_);
  if (s_.type == "LRRangeTest") {
    const config::LrRangeTestConfig& r = s_.range_test;
    return "range test from " + num(r.min_lr) + ", growing by " + num(static_cast<double>(r.min_lr) * r.step_rate) +
           " every " + std::to_string(r.step_size) + " steps" + (r.staircase ? " (in stairs)" : "");
  }
  if (s_.type == "OneCycle") {
    const config::OneCycleConfig& c = s_.one_cycle;
    auto stairs = [](std::int64_t n) { return n > 0 ? " in " + std::to_string(n) + " stairs" : std::string(); };
    std::string text = "one cycle from " + num(c.cycle_min_lr) + " to " + num(c.cycle_max_lr) + " over " +
                       std::to_string(c.cycle_first_step_size) + " steps" + stairs(c.cycle_first_stair_count) +
                       " and back over " + std::to_string(c.cycle_second_step_size) +
                       stairs(c.cycle_second_stair_count) + ", then ";
    text += c.decay_step_size == 0 || c.decay_lr_rate == 0.0f
                ? "constant " + num(c.cycle_min_lr)
                : num(c.cycle_min_lr) + " / (1 + " + num(c.decay_lr_rate) + " per " +
                      std::to_string(c.decay_step_size) + " steps)";
    if (c.cycle_momentum) {
      text += "; beta1 from " + num(c.cycle_max_mom) + " to " + num(c.cycle_min_mom) + " and back, beta2 0.99";
      if (c.decay_step_size != 0 && c.decay_mom_rate != 0.0f) {
        text += ", then beta1 " + num(c.cycle_max_mom) + " * (1 + " + num(c.decay_mom_rate) + " per " +
                std::to_string(c.decay_step_size) + " steps)";
      }
    }
    return text;
  }
  const bool flat_after = s_.type == "WarmupLR" || (s_.type == "WarmupCosineLR" && s_.cos_min_ratio >= 1.0f) ||
                          (s_.type == "WarmupDecayLR" && s_.warmup_min_lr == s_.warmup_max_lr);
  if (flat_after && s_.warmup_min_lr == s_.warmup_max_lr) return "constant " + num(s_.warmup_max_lr);
  std::string text = s_.warmup_min_lr == s_.warmup_max_lr
                         ? "no warm-up (" + num(s_.warmup_max_lr) + ")"
                         : s_.warmup_type + " warm-up from " + num(s_.warmup_min_lr) + " to " + num(s_.warmup_max_lr) +
                               " over " + std::to_string(warmup_steps()) + " steps" +
                               (s_.warmup_num_steps < 2 ? " (DeepSpeed's least)" : "");
  if (s_.type == "WarmupLR") return text + ", then constant";
  if (s_.type == "WarmupDecayLR") {
    return text + ", then linear decay to " + num(s_.warmup_min_lr) + " at step " + std::to_string(s_.total_num_steps);
  }
  return text + ", then cosine down to " + num(static_cast<double>(s_.cos_min_ratio) * s_.warmup_max_lr) +
         " at step " + std::to_string(s_.total_num_steps);
}

float LrSchedule::lr(std::int64_t step) const {
  if (s_.type.empty()) return base_lr_;
  if (s_.type == "LRRangeTest") {
    const config::LrRangeTestConfig& r = s_.range_test;
    double interval = static_cast<double>(step + 1) / static_cast<double>(r.step_size);
    if (r.staircase) interval = std::floor(interval);
    return static_cast<float>(r.min_lr * (1.0 + r.step_rate * interval));
  }
  if (s_.type == "OneCycle") {
    const config::OneCycleConfig& c = s_.one_cycle;
    const double min_lr = c.cycle_min_lr, max_lr = c.cycle_max_lr;
    if (step < cycle_steps()) return static_cast<float>(min_lr + (max_lr - min_lr) * cycle_scale(step));
    if (c.decay_step_size == 0 || c.decay_lr_rate == 0.0f) return c.cycle_min_lr;
    const double interval = decay_intervals(step);
    return static_cast<float>(min_lr / (1.0 + c.decay_lr_rate * interval));
  }
  const std::int64_t w = warmup_steps();
  if (step < w) return warmup(step);
  const double max_lr = s_.warmup_max_lr, min_lr = s_.warmup_min_lr;
  if (s_.type == "WarmupLR") return static_cast<float>(max_lr);
  const double total = static_cast<double>(s_.total_num_steps);
  if (s_.type == "WarmupDecayLR") {
    // Linear from the peak at the end of warm-up to warmup_min_lr at total_num_steps.
    const double gamma = std::max(0.0, (total - static_cast<double>(step)) / std::max(1.0, total - static_cast<double>(w)));
    return static_cast<float>(min_lr + (max_lr - min_lr) * gamma);
  }
  // WarmupCosineLR: step w already takes the first step of the cosine, and
  // step total_num_steps - 1 reaches its floor (DeepSpeed's "+ 1"). Past
  // the end it stays at the floor (DeepSpeed's cosine would rise again).
  const double span = total - static_cast<double>(w);
  const double x = span > 0.0 ? std::min(1.0, static_cast<double>(step - w + 1) / span) : 1.0;
  const double ratio = s_.cos_min_ratio;
  return static_cast<float>(max_lr * std::max(0.0, ratio + (1.0 - ratio) * 0.5 * (1.0 + std::cos(M_PI * x))));
}

float LrSchedule::peak() const {
  if (s_.type.empty()) return base_lr_;
  if (s_.type == "OneCycle") return s_.one_cycle.cycle_max_lr;
  if (s_.type == "LRRangeTest") return s_.range_test.min_lr;
  return s_.warmup_max_lr;
}

}  // namespace zero
