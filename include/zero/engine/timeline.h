// A timeline of the engine's work, for seeing what overlaps what in a step
// (Engine::trace(true), then Engine::take_timeline()): the module's forward
// and backward and the engine's step on the compute stream, each gradient
// chunk's copy down and each parameter chunk's copy up (offload on a GPU),
// each bucket's gather from an offloaded stage-3 partition (offload_param
// on a GPU), each bucket of the CPU optimizer step on the host, and where the main
// thread waited for the delayed update. Device intervals come from timing
// events (their clock is aligned to the host's once, when tracing starts);
// on the CPU, where the compute is synchronous, from the host clock.
// Tracing adds events and, at take_timeline(), a device synchronisation:
// for benchmarks and diagnosis, not for every step of a long run.
#pragma once

#include <cstdint>
#include <string>

namespace zero {

struct TimelineInterval {
  std::string lane;  // "compute", "gather", "copy down", "copy up", "cpu step", "host wait"
  std::string what;  // "forward", "backward", "step", "bucket 3", ...
  std::int64_t step = 0;  // optimizer steps taken when the interval began
  double start_ms = 0.0;  // since tracing started
  double end_ms = 0.0;
};

}  // namespace zero
