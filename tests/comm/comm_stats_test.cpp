#include "zero/comm/comm_stats.h"

#include <gtest/gtest.h>

namespace {

using zero::comm::CollectiveKind;
using zero::comm::CommStats;
using zero::comm::ring_bytes_sent;

// The closed forms of comm_stats.h, written out for a few points.
static_assert(ring_bytes_sent(CollectiveKind::kAllReduce, 1000, 4, 4) == 2 * 3 * 250 * 4);
static_assert(ring_bytes_sent(CollectiveKind::kAllReduce, 1001, 2, 4) == 2 * 3 * 251 * 2);
static_assert(ring_bytes_sent(CollectiveKind::kReduceScatter, 251, 2, 4) == 3 * 251 * 2);
static_assert(ring_bytes_sent(CollectiveKind::kAllGather, 7, 4, 2) == 1 * 7 * 4);
static_assert(ring_bytes_sent(CollectiveKind::kBroadcast, 7, 4, 4) == 3 * 2 * 4);
static_assert(ring_bytes_sent(CollectiveKind::kBarrier, 100, 4, 4) == 0);
static_assert(ring_bytes_sent(CollectiveKind::kAllReduce, 1000, 4, 1) == 0);
static_assert(ring_bytes_sent(CollectiveKind::kAllReduce, 0, 4, 8) == 0);

TEST(CommStats, RingVolumeMatchesThePaperForAReduceScatterPlusAllGather) {
  // ZeRO counts an all-reduce of Psi elements as 2 (N-1)/N Psi: a
  // reduce-scatter plus an all-gather of Psi/N elements per rank.
  constexpr std::size_t psi = 1 << 20;
  for (int n : {2, 4, 8, 64}) {
    const std::size_t per_rank = psi / static_cast<std::size_t>(n);
    EXPECT_EQ(ring_bytes_sent(CollectiveKind::kAllReduce, psi, 2, n),
              ring_bytes_sent(CollectiveKind::kReduceScatter, per_rank, 2, n) +
                  ring_bytes_sent(CollectiveKind::kAllGather, per_rank, 2, n));
    EXPECT_EQ(ring_bytes_sent(CollectiveKind::kAllReduce, psi, 2, n),
              2u * static_cast<std::uint64_t>(n - 1) * psi / static_cast<std::uint64_t>(n) * 2);
  }
}

TEST(CommStats, Totals) {
  CommStats s;
  s.bytes_sent = {1, 2, 3, 4, 0};
  s.calls = {1, 1, 2, 1, 5};
  EXPECT_EQ(s.total_bytes(), 10u);
  EXPECT_EQ(s.total_calls(), 10u);
  EXPECT_EQ(s.bytes_of(CollectiveKind::kAllGather), 3u);
  EXPECT_EQ(s.calls_of(CollectiveKind::kBarrier), 5u);
}

TEST(CommStats, Names) {
  EXPECT_EQ(zero::comm::collective_name(CollectiveKind::kAllReduce), "all_reduce");
  EXPECT_EQ(zero::comm::collective_name(CollectiveKind::kReduceScatter), "reduce_scatter");
  EXPECT_EQ(zero::comm::collective_name(CollectiveKind::kAllGather), "all_gather");
  EXPECT_EQ(zero::comm::collective_name(CollectiveKind::kBroadcast), "broadcast");
  EXPECT_EQ(zero::comm::collective_name(CollectiveKind::kBarrier), "barrier");
}

}  // namespace
