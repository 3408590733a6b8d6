// What every part of the engine does with a buffer of the memory plan once
// it is allocated, and the one integer conversion they all need.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/Tensor.h>

#include "zero/memory/memory_ledger.h"
#include "zero/zero/memory_plan.h"

namespace zero::detail {

inline std::int64_t i64(std::size_t n) { return static_cast<std::int64_t>(n); }

// Registers an allocated buffer of the plan by what was allocated: the
// tensor's own nbytes(), of which the plan's `valid` elements are its kind
// and the rest padding. A buffer allocated at the wrong size therefore shows
// in the ledger (and in every figure built on it), instead of the ledger
// repeating the sizes the allocation was meant to have.
inline void register_planned(memory::MemoryLedger& ledger, std::vector<memory::MemoryLedger::Registration>& regs,
                             const PlannedBuffer& planned, const at::Tensor& t) {
  const std::int64_t total = i64(t.nbytes());
  const std::int64_t used = std::min(total, i64(planned.valid * t.element_size()));
  regs.push_back(ledger.add(planned.tier, planned.kind, used, planned.what));
  regs.push_back(ledger.add(planned.tier, memory::Kind::kPadding, total - used, planned.what));
}

}  // namespace zero::detail
