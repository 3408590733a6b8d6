#include "zero/comm/detail/collective_args.h"

#include <cstdint>
#include <limits>

#include "zero/core/error.h"

namespace zero::comm::detail {

void check_buffer(const void* data, std::size_t count, const char* op, const char* what) {
  ZERO_CHECK(data != nullptr || count == 0, op, ": ", what, " is null but count is ", count);
}

std::size_t checked_mul(std::size_t a, std::size_t b, const char* op) {
  ZERO_CHECK(b == 0 || a <= std::numeric_limits<std::size_t>::max() / b, op, ": buffer size ", a,
             " x ", b, " overflows size_t");
  return a * b;
}

bool is_in_place(const void* whole, const void* part, std::size_t count_per_rank, DType dtype,
                 int world_size, int rank, const char* op) {
  if (count_per_rank == 0) return whole == part;
  const std::size_t part_bytes = checked_mul(count_per_rank, element_size(dtype), op);
  const std::size_t whole_bytes = checked_mul(part_bytes, static_cast<std::size_t>(world_size), op);
  // Compare as integers: the pointers may belong to different allocations.
  const auto w = reinterpret_cast<std::uintptr_t>(whole);
  const auto p = reinterpret_cast<std::uintptr_t>(part);
  if (p == w + static_cast<std::size_t>(rank) * part_bytes) return true;
  const bool overlap = p < w + whole_bytes && w < p + part_bytes;
  ZERO_CHECK(!overlap, op, ": the ", count_per_rank,
             "-element per-rank buffer overlaps the whole buffer but is not at this rank's slot "
             "(whole + rank * count_per_rank, rank ",
             rank, "); pass that exact pointer for in place, or non-overlapping buffers");
  return false;
}

}  // namespace zero::comm::detail
