// Out-of-memory errors from LibTorch's allocators (host: c10::Error "not
// enough memory" / "can't allocate memory"; device: c10::OutOfMemoryError),
// the pinned allocator's PinnedHostOutOfMemory and std::bad_alloc, turned
// into a zero::Error that says what was being done, the bytes asked for and
// what zerocpp holds, by tier and kind.
#pragma once

#include <exception>
#include <string_view>

#include "zero/memory/memory_ledger.h"

namespace zero::detail {

bool is_out_of_memory(const std::exception& e);

// If `e` is an out-of-memory error, throws the zero::Error described above;
// otherwise returns (the caller rethrows `e`).
// `hint`: what needs less for this allocation in particular, said first
// among the ways to need less (empty: none).
void rethrow_if_out_of_memory(const std::exception& e, std::string_view during,
                              const memory::MemoryLedger& ledger, std::string_view hint = {});

}  // namespace zero::detail
