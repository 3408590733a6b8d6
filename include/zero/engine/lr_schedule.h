// Learning-rate schedules with DeepSpeed's names and meaning
// (deepspeed/runtime/lr_schedules.py); lr(k) is DeepSpeed's rate at
// last_batch_iteration k. W = max(2, warmup_num_steps), as DeepSpeed has it.
//   ""              constant base lr
//   WarmupLR        warm-up from warmup_min_lr to warmup_max_lr over W steps
//                   ("log": min + (max-min) * ln(k+1)/ln(W); "linear":
//                   min + (max-min) * k/W), then constant
//   WarmupDecayLR   the same warm-up, then linear decay to warmup_min_lr:
//                   min + (max-min) * max(0, (T-k) / max(1, T-W))
//   WarmupCosineLR  the same warm-up (from warmup_min_lr), then cosine from
//                   warmup_max_lr down to cos_min_ratio * warmup_max_lr:
//                   ratio + (1-ratio) * (1 + cos(pi * (k-W+1)/(T-W))) / 2,
//                   held at the floor from k = T-1 on (DeepSpeed's rises
//                   again past T)
//   OneCycle        with F, S the cycle's halves (cycle_first/second_step_size),
//                   b = k+1 and x = b/(F+S) - floor(b/(F+S)): the scale is
//                   x(F+S)/F rising, (1-x)(F+S)/S falling (in stairs of
//                   1/stair_count when a stair count is given); the rate
//                   cycle_min_lr + (cycle_max_lr - cycle_min_lr) * scale for
//                   k < F+S, then cycle_min_lr / (1 + decay_lr_rate *
//                   (k-F-S+1) / decay_step_size) (no decay when either is 0).
//                   With cycle_momentum, betas (beta1, 0.99), beta1 =
//                   cycle_max_mom - (cycle_max_mom - cycle_min_mom) * scale,
//                   then cycle_max_mom * (1 + decay_mom_rate * ...)
//   LRRangeTest     lr_range_test_min_lr * (1 + step_rate * (k+1)/step_size),
//                   the fraction floored with staircase
// with T = total_num_steps; `k` counts optimizer steps from 0.
//
// DeepSpeed steps its scheduler after each optimizer step taken (not after a
// step skipped for overflow), so the step taken after n others runs at
// applied(n) = lr(n - 1), and the first one at the scheduler's value before
// it started: warmup_min_lr (WarmupLR, WarmupDecayLR), 0 (WarmupCosineLR),
// cycle_min_lr and betas (cycle_min_mom, 0.99) (OneCycle),
// lr_range_test_min_lr (LRRangeTest). The engine applies a config's
// scheduler this way (Engine::lr(), Engine::betas()).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "zero/config/config.h"

namespace zero {

class LrSchedule {
 public:
  LrSchedule(const config::SchedulerConfig& s, float base_lr);
  float lr(std::int64_t step) const;
  // The rate of the optimizer step taken after `taken` others (DeepSpeed's).
  float applied(std::int64_t taken) const;
  // Adam's and Lion's (beta1, beta2) where the schedule sets them (OneCycle
  // with cycle_momentum); nullopt where the optimizer's own apply.
  struct Betas {
    float beta1, beta2;
  };
  std::optional<Betas> betas(std::int64_t step) const;
  std::optional<Betas> applied_betas(std::int64_t taken) const;
  // In words: "constant 0.001", "linear warm-up from 0 to 0.003 over 30
  // steps, then cosine down to 0.0003 at step 300", ...
  std::string describe() const;
  // The rate the schedule is built around: warmup_max_lr (the warm-up
  // schedulers), cycle_max_lr (OneCycle), lr_range_test_min_lr
  // (LRRangeTest), the base lr (none). Muon's halves take their shares of
  // it (optimizer.params.muon_lr, adam_lr).
  float peak() const;

 private:
  float warmup(std::int64_t step) const;
  double cycle_scale(std::int64_t step) const;  // OneCycle's, in [0, 1]
  std::int64_t cycle_steps() const;
  double decay_intervals(std::int64_t step) const;  // OneCycle's, past the cycle
  std::int64_t warmup_steps() const;
  config::SchedulerConfig s_;
  float base_lr_;
};

}  // namespace zero
