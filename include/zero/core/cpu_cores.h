// The cores this process may run on: its CPU affinity mask (a launcher's
// binding, taskset, a container's cpuset), not the machine's count.
#pragma once

namespace zero {

// CPUs in this process's affinity mask; std::thread::hardware_concurrency()
// where the mask cannot be read; at least 1.
int usable_cores();

// A share of the usable cores for one of `local_ranks` processes on this
// node (they usually share one mask under `--bind-to none`): usable_cores()
// / local_ranks, at least 1.
int cores_per_local_rank(int local_ranks);

}  // namespace zero
