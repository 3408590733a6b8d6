#include "zero/ckpt/reshard.h"

#include <algorithm>

#include "zero/core/error.h"

namespace zero::ckpt {

void locate(const Manifest& saved, std::size_t param, std::uint64_t first, std::uint64_t n, std::uint64_t dst,
            std::vector<ElementRun>& out) {
  const ParamRecord& p = saved.params.at(param);
  ZERO_INTERNAL_ASSERT(first + n <= p.numel, "elements past parameter ", p.name);
  std::uint64_t flat = p.offset + first;
  while (n > 0) {
    // The saved bucket holding `flat` (parse_manifest checked that each
    // parameter lies inside one bucket's values).
    auto it = std::upper_bound(saved.buckets.begin(), saved.buckets.end(), flat,
                               [](std::uint64_t f, const BucketRecord& b) { return f < b.offset; });
    const BucketRecord& b = *(it - 1);
    const std::uint64_t into = flat - b.offset;
    const std::uint64_t shard = into / b.chunk, within = into % b.chunk;
    const std::uint64_t run = std::min(n, b.chunk - within);
    ElementRun r{static_cast<int>(shard), b.partition_offset + within, dst, run};
    if (!out.empty()) {
      ElementRun& last = out.back();
      if (last.shard == r.shard && last.src + last.n == r.src && last.dst + last.n == r.dst) {
        last.n += r.n;
        r.n = 0;
      }
    }
    if (r.n > 0) out.push_back(r);
    flat += run;
    dst += run;
    n -= run;
  }
}

std::vector<ElementRun> plan_partition(const Manifest& saved, const std::vector<BucketRecord>& buckets,
                                       const std::vector<TargetParam>& params, int shard_rank) {
  std::vector<ElementRun> runs;
  for (const TargetParam& p : params) {
    const BucketRecord& b = buckets.at(static_cast<std::size_t>(p.bucket));
    const std::uint64_t lo = b.offset + static_cast<std::uint64_t>(shard_rank) * b.chunk, hi = lo + b.chunk;
    const std::uint64_t a = std::max(lo, p.offset), c = std::min(hi, p.offset + p.numel);
    if (a >= c) continue;
    locate(saved, p.saved_index, a - p.offset, c - a, b.partition_offset + (a - lo), runs);
  }
  return runs;
}

}  // namespace zero::ckpt
