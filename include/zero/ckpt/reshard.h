// Where a saved parameter's elements are: the mapping from a target layout
// (the loading engine's partition, or a consolidated file) to the saved
// ranks' partitions, parameter by name. The same arithmetic serves loading
// on the same layout (one read per parameter chunk) and on another world
// size or stage.
#pragma once

#include <cstdint>
#include <vector>

#include "zero/ckpt/manifest.h"

namespace zero::ckpt {

// `n` elements at position `src` of saved rank `shard`'s partition go to
// position `dst` of the target.
struct ElementRun {
  int shard = 0;
  std::uint64_t src = 0, dst = 0, n = 0;
};

// Elements [first, first + n) of saved parameter `param`, to target
// positions dst, dst + 1, ...: the runs, in order.
void locate(const Manifest& saved, std::size_t param, std::uint64_t first, std::uint64_t n, std::uint64_t dst,
            std::vector<ElementRun>& out);

// The target: a flat layout like the saved one (its buckets, its
// parameters' slots), and the rank whose partition is wanted.
struct TargetParam {
  std::size_t saved_index = 0;  // the same parameter in the saved manifest
  std::uint64_t offset = 0, numel = 0;
  int bucket = 0;
};
// Every run that fills rank `shard_rank`'s partition of the target layout
// (positions in it as dst); padding gets none.
std::vector<ElementRun> plan_partition(const Manifest& saved, const std::vector<BucketRecord>& buckets,
                                       const std::vector<TargetParam>& params, int shard_rank);

}  // namespace zero::ckpt
