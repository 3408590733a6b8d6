#include "zero/zero/flat_layout.h"

#include <gtest/gtest.h>

namespace zero {
namespace {

TEST(FlatLayout, PacksBackToFrontIntoPaddedBuckets) {
  // Params of 10, 20, 30 and 5 elements; buckets of at most 35 elements.
  FlatLayout L({10, 20, 30, 5}, 35, /*pad_world=*/4, /*shard_world=*/4, /*align=*/2);
  ASSERT_EQ(L.buckets().size(), 2u);
  // Bucket 0 holds the last parameters first: 5 + 30 = 35.
  EXPECT_EQ(L.buckets()[0].numel, 35u);
  EXPECT_EQ(L.buckets()[0].padded, 40u);  // multiple of 4 * 2
  EXPECT_EQ(L.buckets()[0].chunk, 10u);
  EXPECT_EQ((L.buckets()[0].params), (std::vector<int>{3, 2}));
  EXPECT_EQ(L.params()[3].offset, 0u);
  EXPECT_EQ(L.params()[2].offset, 5u);
  // Bucket 1: 20 + 10 = 30 -> padded 32, starting after bucket 0's padding.
  EXPECT_EQ(L.buckets()[1].offset, 40u);
  EXPECT_EQ(L.buckets()[1].padded, 32u);
  EXPECT_EQ(L.params()[1].offset, 40u);
  EXPECT_EQ(L.params()[0].offset, 60u);
  EXPECT_EQ(L.padded_numel(), 72u);
  EXPECT_EQ(L.numel(), 65u);
  // Partition: chunk r of every bucket, in bucket order.
  EXPECT_EQ(L.partition_numel(), 10u + 8u);
  EXPECT_EQ(L.buckets()[1].partition_offset, 10u);
  // Valid elements of each rank's partition add up to the model.
  std::size_t valid = 0;
  for (int r = 0; r < 4; ++r) valid += L.partition_valid(r);
  EXPECT_EQ(valid, 65u);
  EXPECT_EQ(L.partition_valid(3), 5u + 6u);  // bucket 0: 35-30; bucket 1: 30-24
}

TEST(FlatLayout, LargeParameterGetsItsOwnBucketAndStage0OwnsAll) {
  FlatLayout L({100, 3}, 10, 2, 1, 1);
  ASSERT_EQ(L.buckets().size(), 2u);
  EXPECT_EQ(L.buckets()[1].numel, 100u);
  EXPECT_EQ(L.partition_numel(), L.padded_numel());
  EXPECT_EQ(L.partition_valid(0), 103u);
}

TEST(FlatLayout, Stage3GroupsAreWholeBuckets) {
  // Groups -1, 0, 0, 1, -1 (back to front: -1, 1, 0 0, -1); 0's two fit one bucket.
  FlatLayout L({4, 3, 3, 5, 2}, 100, 2, 2, 1, {-1, 0, 0, 1, -1});
  ASSERT_EQ(L.buckets().size(), 4u);
  EXPECT_EQ(L.buckets()[0].group, -1);
  EXPECT_EQ((L.buckets()[0].params), (std::vector<int>{4}));
  EXPECT_EQ(L.buckets()[1].group, 1);
  EXPECT_EQ(L.buckets()[2].group, 0);
  EXPECT_EQ((L.buckets()[2].params), (std::vector<int>{2, 1}));
  EXPECT_EQ(L.buckets()[3].group, -1);
  EXPECT_EQ(L.group_buckets(0), (std::vector<int>{2}));
  EXPECT_EQ(L.group_buckets(-1), (std::vector<int>{0, 3}));
  // A group larger than a bucket spans several, still of its own.
  FlatLayout M({6, 6, 6}, 7, 1, 1, 1, {0, 0, -1});
  EXPECT_EQ(M.group_buckets(0).size(), 2u);
  EXPECT_EQ(M.group_buckets(-1).size(), 1u);
}

}  // namespace
}  // namespace zero
