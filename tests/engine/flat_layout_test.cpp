#include "zero/zero/flat_layout.h"

#include <optional>

#include <gtest/gtest.h>

#include "zero/zero/partition_runs.h"

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

// A block's small parameters (no group: under the persistence threshold)
// between its matrices (group 0) go after the matrices, back to front: the
// unit is one bucket, and they one kept bucket with the parameters of no
// group that follow, not a bucket each.
TEST(FlatLayout, Stage3KeptParametersAmongAUnitsDoNotCutIt) {
  // Model order: ln.w ln.b | w1 b1 w2 b2 (block) | head.b; back to front:
  // head.b, b2, w2, b1, w1, ln.b, ln.w -> head.b b2 | w2 w1 | b1 ln.b ln.w.
  const std::vector<int> groups{-1, -1, 0, -1, 0, -1, -1};
  FlatLayout L({2, 2, 8, 3, 8, 3, 1}, 100, 1, 1, 1, groups);
  ASSERT_EQ(L.buckets().size(), 3u);
  EXPECT_EQ(L.buckets()[0].group, -1);
  EXPECT_EQ((L.buckets()[0].params), (std::vector<int>{6, 5}));
  EXPECT_EQ(L.buckets()[1].group, 0);
  EXPECT_EQ((L.buckets()[1].params), (std::vector<int>{4, 2}));
  EXPECT_EQ(L.buckets()[2].group, -1);
  EXPECT_EQ((L.buckets()[2].params), (std::vector<int>{3, 1, 0}));
  // Every parameter still has its own range, inside its bucket, and the
  // ranges tile the buffer.
  std::size_t covered = 0;
  for (std::size_t i = 0; i < L.params().size(); ++i) {
    const ParamSlot& p = L.params()[i];
    const Bucket& b = L.buckets()[static_cast<std::size_t>(p.bucket)];
    EXPECT_GE(p.offset, b.offset);
    EXPECT_LE(p.offset + p.numel, b.offset + b.numel);
    EXPECT_EQ(b.group, groups[i]);
    covered += p.numel;
  }
  EXPECT_EQ(covered, L.numel());
  // Two blocks (w b w b each): each unit whole, its kept parameters after
  // it, joined by the next block's last bias (which comes before that
  // block's matrices, back to front): two buckets a block, not four.
  FlatLayout M({8, 3, 8, 3, 8, 3, 8, 3}, 100, 1, 1, 1, {0, -1, 0, -1, 1, -1, 1, -1});
  ASSERT_EQ(M.buckets().size(), 5u);
  EXPECT_EQ((M.buckets()[0].params), (std::vector<int>{7}));
  EXPECT_EQ((M.buckets()[1].params), (std::vector<int>{6, 4}));
  EXPECT_EQ((M.buckets()[2].params), (std::vector<int>{5, 3}));
  EXPECT_EQ((M.buckets()[3].params), (std::vector<int>{2, 0}));
  EXPECT_EQ((M.buckets()[4].params), (std::vector<int>{1}));
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

// Each partition element's value found by brute force: the parameter whose
// flat range holds it, or none for padding.
std::vector<std::optional<int>> element_values(const FlatLayout& L, int rank, const std::vector<int>& v) {
  std::vector<std::optional<int>> out;
  for (const Bucket& b : L.buckets()) {
    for (std::size_t j = 0; j < b.chunk; ++j) {
      const std::size_t flat = b.offset + static_cast<std::size_t>(rank) * b.chunk + j;
      std::optional<int> value;
      for (std::size_t i = 0; i < L.params().size(); ++i) {
        const ParamSlot& s = L.params()[i];
        if (flat >= s.offset && flat < s.offset + s.numel) value = v[i];
      }
      out.push_back(value);
    }
  }
  return out;
}

TEST(PartitionRuns, EveryElementTakesItsParametersValueInFewestRuns) {
  // Decay, no decay, decay, no decay (a weight, a bias, ...); stage 0, and
  // 2 and 4 ranks, where buckets are padded and parameters cut by chunks.
  // Then a layout whose first bucket (parameters 2 and 1: 4 elements, padded
  // to 16) leaves ranks 2 and 3 of 4 a chunk of padding alone: their first
  // run starts at 0 all the same.
  for (const auto& [numels, values] : std::vector<std::pair<std::vector<std::size_t>, std::vector<int>>>{
           {{10, 20, 30, 5, 7, 1}, {1, 0, 1, 0, 0, 2}}, {{100, 3, 1}, {1, 2, 0}}}) {
    for (int world : {1, 2, 4}) {
      FlatLayout L(numels, 35, world, world, 2);
      for (int rank = 0; rank < world; ++rank) {
        SCOPED_TRACE("layout of " + std::to_string(numels.size()) + " parameters, world " + std::to_string(world) +
                     " rank " + std::to_string(rank));
        const PartitionRuns runs(L, rank, values);
        const auto expected = element_values(L, rank, values);
        ASSERT_EQ(expected.size(), L.partition_numel());
        ASSERT_FALSE(runs.empty());
        std::size_t at = 0;
        for (std::size_t k = 0; k < runs.runs().size(); ++k) {
          const PartitionRun& r = runs.runs()[k];
          EXPECT_EQ(r.begin, at) << "run " << k << " leaves a gap or overlaps";
          EXPECT_LT(r.begin, r.end);
          if (k > 0) {
            EXPECT_NE(r.value, runs.runs()[k - 1].value) << "runs " << k - 1 << " and " << k << " not merged";
          }
          for (std::size_t e = r.begin; e < r.end; ++e) {
            if (expected[e]) {
              EXPECT_EQ(r.value, *expected[e]) << "element " << e;
            }
          }
          at = r.end;
        }
        EXPECT_EQ(at, L.partition_numel());
        // within(): clipped to the range, in order, the same values.
        for (std::size_t begin = 0; begin < L.partition_numel(); begin += 3) {
          const std::size_t n = std::min<std::size_t>(7, L.partition_numel() - begin);
          std::size_t pos = begin;
          for (const PartitionRun& r : runs.within(begin, n)) {
            EXPECT_EQ(r.begin, pos);
            for (std::size_t e = r.begin; e < r.end; ++e) {
              if (expected[e]) {
                EXPECT_EQ(r.value, *expected[e]) << "element " << e;
              }
            }
            pos = r.end;
          }
          EXPECT_EQ(pos, begin + n);
        }
      }
    }
  }
}

TEST(PartitionRuns, OneValueIsOneRunAndNoValuesNone) {
  FlatLayout L({10, 20, 30}, 16, 2, 2, 1);
  const PartitionRuns same(L, 1, {3, 3, 3});
  ASSERT_EQ(same.runs().size(), 1u);
  EXPECT_EQ(same.runs()[0].end, L.partition_numel());
  EXPECT_EQ(same.runs()[0].value, 3);
  EXPECT_TRUE(PartitionRuns().empty());
  EXPECT_TRUE(PartitionRuns().within(0, 10).empty());
  EXPECT_THROW(PartitionRuns(L, 0, {3}), std::exception);
}

}  // namespace
}  // namespace zero
