#include "zero/zero/flat_layout.h"

#include <algorithm>

#include "zero/core/error.h"
#include "zero/core/shard.h"

namespace zero {

FlatLayout::FlatLayout(const std::vector<std::size_t>& numels, std::size_t bucket_numel,
                       int pad_world, int shard_world, std::size_t align, const std::vector<int>& groups)
    : params_(numels.size()), shard_world_(shard_world) {
  ZERO_INTERNAL_ASSERT(pad_world >= 1 && shard_world >= 1 && pad_world % shard_world == 0 &&
                       align >= 1 && bucket_numel >= 1 && (groups.empty() || groups.size() == numels.size()));
  const std::size_t quantum = static_cast<std::size_t>(pad_world) * align;
  std::size_t offset = 0;
  auto close_bucket = [&](Bucket& b) {
    b.padded = round_up(b.numel, quantum);
    b.chunk = b.padded / static_cast<std::size_t>(shard_world);
    b.partition_offset = partition_numel_;
    partition_numel_ += b.chunk;
    offset = b.offset + b.padded;
    buckets_.push_back(std::move(b));
  };
  Bucket current;
  current.offset = 0;
  for (int i = static_cast<int>(numels.size()) - 1; i >= 0; --i) {
    const std::size_t n = numels[static_cast<std::size_t>(i)];
    const int group = groups.empty() ? -1 : groups[static_cast<std::size_t>(i)];
    if (!current.params.empty() && (current.numel + n > bucket_numel || group != current.group)) {
      close_bucket(current);
      current = Bucket{};
      current.offset = offset;
    }
    current.group = group;
    params_[static_cast<std::size_t>(i)] = {current.offset + current.numel, n,
                                             static_cast<int>(buckets_.size())};
    current.params.push_back(i);
    current.numel += n;
    numel_ += n;
  }
  if (!current.params.empty()) close_bucket(current);
  padded_numel_ = offset;
}

std::size_t FlatLayout::partition_valid(int rank) const {
  std::size_t valid = 0;
  for (const Bucket& b : buckets_) {
    const std::size_t begin = b.chunk * static_cast<std::size_t>(rank);
    if (b.numel > begin) valid += std::min(b.chunk, b.numel - begin);
  }
  return valid;
}

}  // namespace zero

namespace zero {

std::vector<int> FlatLayout::group_buckets(int g) const {
  std::vector<int> out;
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    if (buckets_[i].group == g) out.push_back(static_cast<int>(i));
  }
  return out;
}

}  // namespace zero
