// When the delayed parameter update (DPU) cannot hide the CPU optimizer
// step: the step of step t runs on the CPU while the device does forward and
// backward of step t+1, and when the CPU step takes longer, every step waits
// for it. On a GPU a share of the optimizer state stepped on the device
// (offload_optimizer.ratio < 1, DeepSpeed's Twin-Flow) shortens the CPU
// step; this says which ratio would fit it within forward and backward.
// Measured on an H200 at 4.54B: the CPU step 0.89 s against 0.49 s of
// forward and backward, 0.65 of plain PyTorch's speed; with ratio 0.7, 0.86
// (docs/PERFORMANCE.md).
#pragma once

#include <optional>
#include <string>

namespace zero::detail {

struct DpuTiming {
  double step_ms = 0;  // between two step() calls: forward, backward and the step
  double wait_ms = 0;  // of it, the wait for the CPU step of the step before, from the end of backward
                       // on the device (the engine synchronizes the device once, for this)
  double cpu_ms = 0;   // how long that CPU step ran
  double ratio = 1;    // offload_optimizer.ratio now: the share the CPU steps
};

// The note to print, or nothing when the wait is under a tenth of the step
// (the CPU step is hidden, or near enough), longer than the CPU step itself
// (then it is not the CPU step's), or the timing says nothing. The CPU step
// began with forward (it is submitted at the end of step()), so forward and
// backward took about cpu_ms - wait_ms; the ratio named is the CPU's share
// that would take about that long, rounded down to 0.05 (at least 0.05).
std::optional<std::string> dpu_bound_note(const DpuTiming& t);

// That ratio alone (the note's), or nothing in the same cases.
std::optional<double> dpu_ratio_to_fit(const DpuTiming& t);

}  // namespace zero::detail
