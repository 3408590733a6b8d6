// The most bytes of CPU tensor memory allocated at once while a scope runs,
// measured through c10's memory-reporting hook (the one the profiler's
// profile_memory uses): c10's CPU allocator reports each allocation and
// free to the thread's PROFILER_STATE debug info, which LibTorch carries to
// its intra-op threads. Only allocations made inside the scope count, and
// their frees.
//
//   auto peak = std::make_shared<CpuAllocationPeak>();
//   { c10::DebugInfoGuard on(c10::DebugInfoKind::PROFILER_STATE, peak); work(); }
//   peak->bytes();
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

namespace zero::test {

class CpuAllocationPeak : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void* /*ptr*/, std::int64_t alloc_size, std::size_t /*total_allocated*/,
                         std::size_t /*total_reserved*/, c10::Device device) override {
    if (!device.is_cpu()) return;
    std::lock_guard<std::mutex> lock(mu_);
    current_ += alloc_size;
    peak_ = std::max(peak_, current_);
  }
  bool memoryProfilingEnabled() const override { return true; }
  std::int64_t bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }

 private:
  mutable std::mutex mu_;
  std::int64_t current_ = 0, peak_ = 0;
};

}  // namespace zero::test
