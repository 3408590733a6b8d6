// Which sequences each rank trains on.
//
// Global batch `step` has `global_batch` sequences of `seq_len + 1` bytes
// (inputs and next-byte targets), starting at offsets drawn from a
// counter-based generator seeded by (seed, step, index): the same on every
// rank, independent of the world size, and resumable from the step number
// alone (the data position is the step). Micro-batch j of rank r takes
// sequences [j * micro * world + r * micro, ... + micro) of the global batch,
// so N ranks with accumulation A see exactly the global batch one rank with
// micro * N and accumulation A would see.
#pragma once

#include <cstdint>
#include <vector>

namespace zero::data {

class BatchSampler {
 public:
  BatchSampler(std::int64_t data_len, std::int64_t seq_len, std::int64_t micro, std::int64_t accumulation,
               int world, int rank, std::uint64_t seed);
  // Start offsets of micro-batch `micro_index` (0 <= micro_index < accumulation) of step `step` for this rank.
  std::vector<std::int64_t> offsets(std::int64_t step, std::int64_t micro_index) const;

 private:
  std::int64_t data_len_, seq_len_, micro_, accumulation_;
  int world_, rank_;
  std::uint64_t seed_;
};

}  // namespace zero::data
