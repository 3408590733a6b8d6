// How much host memory this process may count on: the kernel's MemAvailable
// (/proc/meminfo), lowered by the memory limit of the process's cgroup (a
// container's, a batch scheduler's job: what the limit leaves beside what
// the cgroup uses, its inactive page cache counted as free; cgroup v1 and
// v2) and by ZERO_HOST_MEMORY_LIMIT when that is set (bytes, or with a
// K/M/G/T suffix of 1024s: for a node shared with other jobs, and for
// tests). The engine checks its host buffers against it before
// allocating, so that a configuration too large for the host fails with a
// clear error instead of meeting the kernel's OOM killer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zero {

// Bytes, or nullopt when neither source says (no /proc/meminfo, no variable).
// A malformed ZERO_HOST_MEMORY_LIMIT is a zero::Error naming it.
std::optional<std::int64_t> host_memory_available();

// Where the figure came from, for messages: "MemAvailable",
// "ZERO_HOST_MEMORY_LIMIT" or the cgroup's limit (naming its file).
std::string host_memory_source();

namespace detail {
// What the cgroup limits of the process described by `proc_self_cgroup` (a
// /proc/<pid>/cgroup file) leave, with cgroups mounted at `mount`
// (/sys/fs/cgroup): the smallest over every level of its v1 memory cgroup
// and of its v2 cgroup up to the mount's root (a level's limit less that
// level's usage, which counts its children), and the file of that limit;
// nullopt where none is limited. A path missing under the mount (a
// container that sees its own cgroup at the root) reads the root. (Paths
// given, for tests.)
struct CgroupMemory {
  std::int64_t available;
  std::string limit_file;
};
std::optional<CgroupMemory> cgroup_memory_available(const std::string& proc_self_cgroup, const std::string& mount);
}  // namespace detail

// This process's resident set (VmRSS, /proc/self/statm) in bytes, or nullopt
// where /proc does not say: for a run's memory over time (zero-train's
// metrics), beside the engine's own ledger.
std::optional<std::int64_t> resident_set_bytes();

}  // namespace zero
