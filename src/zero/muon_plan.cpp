#include "zero/zero/muon_plan.h"

#include <algorithm>

#include "zero/core/error.h"

namespace zero {

MuonMatrix muon_matrix(int param, const std::vector<std::int64_t>& shape) {
  const std::size_t d = shape.size();
  ZERO_CHECK(d >= 2, "Muon steps matrices; a parameter of ", d, " dimensions is not one");
  MuonMatrix m;
  m.param = param;
  if (d == 4) {
    m.rows = shape[0];
    m.cols = shape[1] * shape[2] * shape[3];
    return m;
  }
  for (std::size_t i = 0; i + 2 < d; ++i) m.batch *= shape[i];
  m.rows = shape[d - 2];
  m.cols = shape[d - 1];
  return m;
}

std::vector<std::pair<std::size_t, std::size_t>> MuonBucketPlan::gather_ranges(std::size_t chunk) const {
  if (head + tail >= chunk) return {{0, chunk}};
  std::vector<std::pair<std::size_t, std::size_t>> r;
  if (head > 0) r.emplace_back(0, head);
  if (tail > 0) r.emplace_back(chunk - tail, chunk);
  return r;
}

std::vector<MuonBucketPlan> plan_muon(const FlatLayout& layout, int shard_rank,
                                      const std::vector<MuonMatrix>& matrices) {
  std::vector<std::vector<std::size_t>> of_bucket(layout.buckets().size());
  for (std::size_t i = 0; i < matrices.size(); ++i) {
    if (matrices[i].numel() == 0) continue;  // (nothing to orthogonalize, nor to gather)
    const int p = matrices[i].param;
    ZERO_CHECK(p >= 0 && static_cast<std::size_t>(p) < layout.params().size(), "Muon matrix ", i,
               " names parameter ", p, ", which the layout does not have");
    ZERO_CHECK(matrices[i].numel() == layout.params()[static_cast<std::size_t>(p)].numel, "Muon matrix ", i,
               " has ", matrices[i].numel(), " elements, its parameter ", layout.params()[static_cast<std::size_t>(p)].numel);
    of_bucket[static_cast<std::size_t>(layout.params()[static_cast<std::size_t>(p)].bucket)].push_back(i);
  }
  const auto world = static_cast<std::size_t>(layout.shard_world());
  std::vector<MuonBucketPlan> plan;
  for (std::size_t k = 0; k < of_bucket.size(); ++k) {
    if (of_bucket[k].empty()) continue;
    const Bucket& b = layout.buckets()[k];
    MuonBucketPlan w;
    w.bucket = static_cast<int>(k);
    const std::size_t mine = b.offset + static_cast<std::size_t>(shard_rank) * b.chunk;
    for (std::size_t mi : of_bucket[k]) {
      const ParamSlot& s = layout.params()[static_cast<std::size_t>(matrices[mi].param)];
      const std::size_t end = s.offset + s.numel;
      const std::size_t first = (s.offset - b.offset) / b.chunk, last = (end - 1 - b.offset) / b.chunk;
      const bool shared = first != last;
      // Every chunk's head and tail, for the bucket's H and T.
      for (std::size_t q = first; shared && q <= last && q < world; ++q) {
        const std::size_t begin_q = b.offset + q * b.chunk, end_q = begin_q + b.chunk;
        if (s.offset < begin_q) w.head = std::max(w.head, std::min(end, end_q) - begin_q);
        if (end > end_q) w.tail = std::max(w.tail, end_q - std::max(s.offset, begin_q));
      }
      const std::size_t lo = std::max(s.offset, mine), hi = std::min(end, mine + b.chunk);
      if (lo >= hi) continue;
      w.parts.push_back(MuonPart{mi, lo - s.offset, lo - mine, hi - lo});
      (shared ? w.shared : w.local).push_back(mi);
    }
    plan.push_back(std::move(w));
  }
  return plan;
}

std::size_t muon_window_elements(const MuonBucketPlan& b, std::size_t chunk, int world, std::size_t window_bytes) {
  std::size_t longest = 0;
  for (const auto& [begin, end] : b.gather_ranges(chunk)) longest = std::max(longest, end - begin);
  const std::size_t per_rank = std::max<std::size_t>(1, window_bytes / sizeof(float) / static_cast<std::size_t>(world));
  return std::min(per_rank, longest);
}

std::size_t muon_ns_workspace_elements(const MuonMatrix& m, bool gram) {
  const std::size_t x = m.numel();
  const std::size_t n = static_cast<std::size_t>(std::min(m.rows, m.cols));
  const std::size_t s = static_cast<std::size_t>(m.batch) * n * n;
  const std::size_t standard = 3 * x + 2 * s;
  return gram && m.rows != m.cols ? std::max(standard, 2 * x + 5 * s) : standard;
}

std::size_t muon_work_elements(const FlatLayout& layout, const std::vector<MuonBucketPlan>& plan,
                               const std::vector<MuonMatrix>& matrices, std::size_t window_bytes, bool gram) {
  const int world = layout.shard_world();
  std::size_t most = 0;
  for (const MuonBucketPlan& w : plan) {
    const std::size_t chunk = layout.buckets()[static_cast<std::size_t>(w.bucket)].chunk;
    // The shared matrices whole, and the windows while they are gathered.
    std::size_t held = 0;
    for (std::size_t mi : w.shared) held += matrices[mi].numel();
    if (w.gathers()) {
      const std::size_t window = muon_window_elements(w, chunk, world, window_bytes);
      most = std::max(most, held + window * (1 + static_cast<std::size_t>(world)));
    }
    // Then each one orthogonalized beside those still held (itself included).
    for (std::size_t mi : w.shared) {
      most = std::max(most, held + muon_ns_workspace_elements(matrices[mi], gram));
      held -= matrices[mi].numel();
    }
    for (std::size_t mi : w.local) {
      most = std::max(most, matrices[mi].numel() + muon_ns_workspace_elements(matrices[mi], gram));
    }
  }
  return most;
}

}  // namespace zero
