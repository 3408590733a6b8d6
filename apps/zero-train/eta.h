// How long a run has taken and how long it has left, for zero-train's
// progress line: the rate is measured from the end of the first step this
// run trained (a resumed run's earlier steps, and the first step's start-up,
// are not counted), and includes what the run does between steps
// (evaluations, saves).
#pragma once

#include <cstdint>
#include <string>

namespace zero::train {

// "45s", "12m05s", "3h07m", "2d04h": whole seconds, two units at most.
std::string format_duration(double seconds);

class RemainingTime {
 public:
  // A step finished `now_s` seconds after the run began; `step` of `steps`.
  void observe(std::int64_t step, double now_s);
  // Seconds left at the rate since the first observed step; negative until
  // two steps were observed.
  double seconds_left(std::int64_t steps) const;

 private:
  std::int64_t first_step_ = -1, last_step_ = -1;
  double first_s_ = 0, last_s_ = 0;
};

// " elapsed 12m05s eta 3h07m" (" elapsed 45s" while the eta is unknown).
std::string elapsed_and_eta(double elapsed_s, double eta_s);

}  // namespace zero::train
