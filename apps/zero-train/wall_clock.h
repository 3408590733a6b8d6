// zero-train's answer to the config's `wall_clock_breakdown`: the time of
// each phase of a step, averaged over the steps since the last report, from
// the engine's timeline (Engine::trace, zero/engine/timeline.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero/engine/timeline.h"

namespace zero::train {

// "forward 12.3 ms, backward 25.1 ms, step 8.0 ms, cpu step 20.1 ms" over
// `steps` steps: the compute lane by phase, every other lane (gather, copy
// down, copy up, cpu step, host wait) summed whole, in the order first seen.
std::string wall_clock_breakdown(const std::vector<TimelineInterval>& intervals, std::int64_t steps);

}  // namespace zero::train
