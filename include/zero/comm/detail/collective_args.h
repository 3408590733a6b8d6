// Internal to zerocpp (namespace detail: no stability promise to users):
// shared by zero_comm's backends and zero_cuda's NCCL backend, published here
// so that no library includes another's private sources.
//
// Argument checks shared by every backend, so that a bad call fails the same
// way (a zero::Error naming the op and the argument) whatever the backend.
#pragma once

#include <cstddef>

#include "zero/core/dtype.h"

namespace zero::comm::detail {

// count > 0 needs a pointer.
void check_buffer(const void* data, std::size_t count, const char* op, const char* what);

// a * b, or a zero::Error naming `op` if it overflows size_t.
std::size_t checked_mul(std::size_t a, std::size_t b, const char* op);

// For ops with a whole buffer (N * count_per_rank elements) and a part
// (count_per_rank elements) that may sit inside it at the rank's slot.
// Returns true if `part` is exactly at whole + rank * count_per_rank (in
// place), false if the two do not overlap; throws if they overlap otherwise.
bool is_in_place(const void* whole, const void* part, std::size_t count_per_rank, DType dtype,
                 int world_size, int rank, const char* op);

}  // namespace zero::comm::detail
