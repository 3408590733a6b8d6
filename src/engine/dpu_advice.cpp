#include "dpu_advice.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace zero::detail {

std::optional<double> dpu_ratio_to_fit(const DpuTiming& t) {
  if (!(t.step_ms > 0) || !(t.cpu_ms > 0) || !(t.wait_ms >= 0) || !(t.ratio > 0)) return std::nullopt;
  if (t.wait_ms < 0.1 * t.step_ms || t.wait_ms > t.cpu_ms) return std::nullopt;
  // Forward and backward ran beside the CPU step until the wait began. The
  // CPU's share r0 took cpu_ms; a share r takes about r / r0 of it.
  const double compute_ms = t.cpu_ms - t.wait_ms;
  const double fit = t.ratio * compute_ms / t.cpu_ms;
  const double rounded = std::floor(fit * 20.0 + 1e-9) / 20.0;
  return std::clamp(rounded, 0.05, std::min(t.ratio, 1.0));
}

std::optional<std::string> dpu_bound_note(const DpuTiming& t) {
  const std::optional<double> r = dpu_ratio_to_fit(t);
  if (!r || *r >= t.ratio) return std::nullopt;
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "zerocpp: note: the delayed update's CPU optimizer step (%.0f ms) outlasts forward and backward "
                "(%.0f ms): each step waits %.0f ms (%.0f%%) for it. offload_optimizer.ratio %.2f (now %.2f) would "
                "step the rest of the optimizer state on the device beside it, so that the CPU's share fits; "
                "zero-estimate --gpu --offload --dpu --offload-ratio %.2f says the device memory that takes "
                "(docs/engine.md, \"Twin-Flow\")",
                t.cpu_ms, t.cpu_ms - t.wait_ms, t.wait_ms, 100.0 * t.wait_ms / t.step_ms, *r,
                t.ratio, *r);
  return std::string(buf);
}

}  // namespace zero::detail
