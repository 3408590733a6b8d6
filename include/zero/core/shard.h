// How a flat buffer of `numel` elements is split over `world_size` ranks.
//
// Layout contract (every partitioned buffer in zerocpp follows it):
//   padded_numel = round_up(numel, world_size * align)
//   per_rank     = padded_numel / world_size          (a multiple of align)
//   rank r owns  [r * per_rank, (r + 1) * per_rank) of the padded buffer
//   valid        = the part of that range below numel (may be 0 for the last
//                  ranks of a tiny buffer); the rest is padding, kept at zero.
// So a reduce-scatter of the padded buffer leaves rank r its own range, and an
// all-gather of every rank's range rebuilds the padded buffer in place
// (output + r * per_rank == the rank's input). `align` (in elements) keeps
// every rank's range aligned for SIMD and for the collective's chunking.
#pragma once

#include <algorithm>
#include <cstddef>

#include "zero/core/error.h"

namespace zero {

struct ShardInfo {
  std::size_t numel = 0;         // elements in the unpadded buffer
  std::size_t padded_numel = 0;  // numel rounded up to world_size * align
  std::size_t per_rank = 0;      // elements each rank owns (valid + padding)
  std::size_t offset = 0;        // first element of this rank's range
  std::size_t valid = 0;         // elements of this rank's range below numel
};

inline std::size_t round_up(std::size_t n, std::size_t multiple) {
  return multiple == 0 ? n : (n + multiple - 1) / multiple * multiple;
}

inline ShardInfo shard_of(std::size_t numel, int world_size, int rank, std::size_t align = 1) {
  ZERO_INTERNAL_ASSERT(world_size > 0 && rank >= 0 && rank < world_size && align > 0,
                       "world_size=", world_size, " rank=", rank, " align=", align);
  ShardInfo s;
  s.numel = numel;
  s.padded_numel = round_up(numel, static_cast<std::size_t>(world_size) * align);
  s.per_rank = s.padded_numel / static_cast<std::size_t>(world_size);
  s.offset = s.per_rank * static_cast<std::size_t>(rank);
  s.valid = numel > s.offset ? std::min(s.per_rank, numel - s.offset) : 0;
  return s;
}

}  // namespace zero
