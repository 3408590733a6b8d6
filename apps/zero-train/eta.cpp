#include "eta.h"

#include <cmath>
#include <cstdio>

namespace zero::train {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long long>(std::llround(seconds));
  char text[48];
  if (s < 60) {
    std::snprintf(text, sizeof text, "%llds", s);
  } else if (s < 3600) {
    std::snprintf(text, sizeof text, "%lldm%02llds", s / 60, s % 60);
  } else if (s < 86400) {
    std::snprintf(text, sizeof text, "%lldh%02lldm", s / 3600, s % 3600 / 60);
  } else {
    std::snprintf(text, sizeof text, "%lldd%02lldh", s / 86400, s % 86400 / 3600);
  }
  return text;
}

void RemainingTime::observe(std::int64_t step, double now_s) {
  if (first_step_ < 0) {
    first_step_ = step;
    first_s_ = now_s;
  }
  last_step_ = step;
  last_s_ = now_s;
}

double RemainingTime::seconds_left(std::int64_t steps) const {
  const std::int64_t done = last_step_ - first_step_;
  if (first_step_ < 0 || done <= 0) return -1.0;
  const double per_step = (last_s_ - first_s_) / static_cast<double>(done);
  return per_step * static_cast<double>(steps > last_step_ ? steps - last_step_ : 0);
}

std::string elapsed_and_eta(double elapsed_s, double eta_s) {
  std::string text = " elapsed " + format_duration(elapsed_s);
  if (eta_s >= 0) text += " eta " + format_duration(eta_s);
  return text;
}

}  // namespace zero::train
