#include "zero/zero/flat_layout.h"

#include <algorithm>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "zero/core/error.h"
#include "zero/core/shard.h"

namespace zero {
namespace {

// Back to front; at stage 3, a parameter of no group (under the persistence
// threshold: a bias, a norm's gain) that lies among the parameters of a
// group moves to just after the group's last one. A block's small
// parameters interleave its matrices, and in place they would cut the
// block's unit into a bucket per matrix, and themselves into as many tiny
// kept buckets; moved, the unit is whole buckets and they one kept bucket.
std::vector<int> packing_order(const std::vector<int>& groups, std::size_t count) {
  std::vector<int> back_to_front(count);
  for (std::size_t k = 0; k < count; ++k) back_to_front[k] = static_cast<int>(count - 1 - k);
  if (groups.empty()) return back_to_front;
  // Each group's last position in that order.
  std::map<int, std::size_t> last;
  for (std::size_t k = 0; k < count; ++k) {
    const int g = groups[static_cast<std::size_t>(back_to_front[k])];
    if (g >= 0) last[g] = k;
  }
  std::vector<int> order;
  order.reserve(count);
  std::deque<std::pair<std::size_t, int>> held;  // (emit after this position, parameter)
  std::size_t reach = 0;  // the furthest last position of a group begun so far
  bool begun = false;
  for (std::size_t k = 0; k < count; ++k) {
    const int i = back_to_front[k];
    const int g = groups[static_cast<std::size_t>(i)];
    if (g >= 0) {
      reach = begun ? std::max(reach, last[g]) : last[g];
      begun = true;
      order.push_back(i);
    } else if (begun && k < reach) {
      held.emplace_back(reach, i);  // (reach never decreases: held stays in order)
    } else {
      order.push_back(i);
    }
    while (!held.empty() && held.front().first == k) {
      order.push_back(held.front().second);
      held.pop_front();
    }
  }
  return order;
}

}  // namespace

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
  for (const int i : packing_order(groups, numels.size())) {
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
