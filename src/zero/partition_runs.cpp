#include "zero/zero/partition_runs.h"

#include <algorithm>

#include "zero/core/error.h"

namespace zero {

PartitionRuns::PartitionRuns(const FlatLayout& layout, int shard_rank, const std::vector<int>& per_param) {
  const auto& params = layout.params();
  ZERO_CHECK(per_param.size() == params.size(), "PartitionRuns: ", per_param.size(), " values for ", params.size(),
             " parameters");
  if (layout.partition_numel() == 0) return;
  for (const Bucket& b : layout.buckets()) {
    const std::size_t c0 = b.offset + static_cast<std::size_t>(shard_rank) * b.chunk, c1 = c0 + b.chunk;
    std::vector<int> in_order = b.params;
    std::sort(in_order.begin(), in_order.end(),
              [&](int x, int y) { return params[static_cast<std::size_t>(x)].offset < params[static_cast<std::size_t>(y)].offset; });
    for (int i : in_order) {
      const ParamSlot& s = params[static_cast<std::size_t>(i)];
      const std::size_t lo = std::max(c0, s.offset), hi = std::min(c1, s.offset + s.numel);
      if (lo >= hi) continue;  // none of it in this rank's chunk
      const std::size_t p0 = b.partition_offset + (lo - c0), p1 = b.partition_offset + (hi - c0);
      const int v = per_param[static_cast<std::size_t>(i)];
      if (runs_.empty()) {
        runs_.push_back({0, p1, v});  // padding before it joins it
      } else if (runs_.back().value == v) {
        runs_.back().end = p1;
      } else {
        runs_.back().end = p0;  // padding between joins the run before
        runs_.push_back({p0, p1, v});
      }
    }
  }
  if (runs_.empty()) {
    // A partition of padding alone: any value will do.
    runs_.push_back({0, layout.partition_numel(), per_param.empty() ? 0 : per_param.front()});
  }
  runs_.back().end = layout.partition_numel();
}

std::vector<PartitionRun> PartitionRuns::within(std::size_t begin, std::size_t n) const {
  std::vector<PartitionRun> out;
  const std::size_t end = begin + n;
  // The first run that ends after `begin`.
  auto it = std::upper_bound(runs_.begin(), runs_.end(), begin,
                             [](std::size_t at, const PartitionRun& r) { return at < r.end; });
  for (; it != runs_.end() && it->begin < end; ++it) {
    out.push_back({std::max(begin, it->begin), std::min(end, it->end), it->value});
  }
  return out;
}

}  // namespace zero
