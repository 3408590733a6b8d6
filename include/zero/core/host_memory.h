// How much host memory this process may count on: the kernel's MemAvailable
// (/proc/meminfo), lowered by ZERO_HOST_MEMORY_LIMIT when that is set (bytes,
// or with a K/M/G/T suffix of 1024s: for a node shared with other jobs, and
// for tests). The engine checks its host buffers against it before
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

// Where the figure came from, for messages: "MemAvailable" or
// "ZERO_HOST_MEMORY_LIMIT".
std::string host_memory_source();

// This process's resident set (VmRSS, /proc/self/statm) in bytes, or nullopt
// where /proc does not say: for a run's memory over time (zero-train's
// metrics), beside the engine's own ledger.
std::optional<std::int64_t> resident_set_bytes();

}  // namespace zero
