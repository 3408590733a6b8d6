// The process's resident memory, and its peak since a reset: what the
// streamed checkpoints of the NVMe tiers must not grow by the state they
// stream (engine_nvme_test, engine_param_nvme_test). Linux only.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace zero::test {

// A "<key>: N kB" line of /proc/self/status, in bytes (-1: none).
inline std::int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  }
  return -1;
}
// Under a sanitizer the resident memory holds its shadow of every page
// touched (and ASan's quarantine of freed blocks): no measure of what the
// engine holds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kRssMeasures = false;
#else
constexpr bool kRssMeasures = true;
#endif

// Peak resident memory of the process since the last reset_peak_rss().
inline std::int64_t peak_rss_bytes() { return status_bytes("VmHWM"); }
inline std::int64_t rss_bytes() { return status_bytes("VmRSS"); }
inline bool reset_peak_rss() {  // Linux >= 4.0: VmHWM back to VmRSS
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace zero::test
