#include "zero/core/cpu_cores.h"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace zero {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int cores_per_local_rank(int local_ranks) { return std::max(1, usable_cores() / std::max(1, local_ranks)); }

}  // namespace zero
