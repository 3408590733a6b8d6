// How the kernel files pick their per-target function.
//
// Each kernel file is compiled once per SIMD target (Highway's
// foreach_target.h) and exports a table of those functions (HWY_EXPORT).
// HWY_DYNAMIC_DISPATCH would index that table with Highway's process-wide
// chosen target; we index it with our own active target instead, so that
// force_simd_target() / ZERO_SIMD_TARGET steer only zerocpp's kernels and
// never another library's use of Highway in the same process. With no target
// forced the two choose the same entry: the best compiled target the CPU
// supports.
#pragma once

#include <cstddef>
#include <cstdint>

#include <hwy/highway.h>

#include "zero/core/error.h"

namespace zero::optim::detail {

// The Highway target bit (HWY_AVX2, ...) the kernels use now. Resolves
// ZERO_SIMD_TARGET on first use.
std::int64_t active_target();

// Index of one target in a table made by HWY_EXPORT, in Highway 1.0.3's
// layout (hwy/highway.h, hwy/targets.h): entry 0 is the chooser that
// HWY_DYNAMIC_DISPATCH calls before the target is known; entries
// 1..HWY_MAX_DYNAMIC_TARGETS are the targets in ChosenTarget's bit order,
// i.e. ctz(HWY_CHOSEN_TARGET_SHIFT(target)); the last entry is the
// SCALAR/EMU128 fallback. A build with a single target gets a one-entry table.
inline std::size_t export_table_index(std::int64_t target) {
#if (HWY_TARGETS & (HWY_TARGETS - 1)) == 0
  (void)target;
  return 0;
#else
  if (target & (HWY_SCALAR | HWY_EMU128)) return HWY_MAX_DYNAMIC_TARGETS + 1;
  return hwy::Num0BitsBelowLS1Bit_Nonzero64(
      static_cast<std::uint64_t>(HWY_CHOSEN_TARGET_SHIFT(target)));
#endif
}

// The active target's entry of an HWY_EXPORT table.
template <typename Fn, std::size_t kSize>
Fn pick(Fn const (&table)[kSize]) {
  const std::size_t index = export_table_index(active_target());
  ZERO_INTERNAL_ASSERT(index < kSize && table[index] != nullptr,
                       "no kernel compiled for SIMD target index ", index);
  return table[index];
}

}  // namespace zero::optim::detail
