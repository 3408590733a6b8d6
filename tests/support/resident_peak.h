// The process's resident set and its peak from /proc/self/status (VmRSS,
// VmHWM, in KiB), and the peak's reset (/proc/self/clear_refs "5": VmHWM :=
// VmRSS), for tests that hold a scope to a bound on real memory.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace zero::test {

// A /proc/self/status field ("VmRSS:", "VmHWM:") in KiB; -1 when absent.
inline std::int64_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::string(key).size()));
  }
  return -1;
}

inline void reset_resident_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace zero::test
