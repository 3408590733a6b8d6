#include "zero/config/key_suggestion.h"

#include <array>
#include <string>

#include <gtest/gtest.h>

namespace {

using zero::config::closest_key;
using zero::config::edit_distance;

TEST(EditDistance, CountsEdits) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("stage3_prefech_bucket_size", "stage3_prefetch_bucket_size"), 1u);
}

TEST(EditDistance, AdjacentSwapCostsOne) {
  EXPECT_EQ(edit_distance("trian_batch_size", "train_batch_size"), 1u);
  EXPECT_EQ(edit_distance("ab", "ba"), 1u);
}

TEST(EditDistance, IsSymmetric) {
  const std::array<std::string, 4> words = {"offload_optimizer", "ofload_optimiser", "lr", "eps"};
  for (const auto& a : words) {
    for (const auto& b : words) EXPECT_EQ(edit_distance(a, b), edit_distance(b, a)) << a << " " << b;
  }
}

constexpr std::array<std::string_view, 5> kKeys = {
    "stage", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
    "reduce_bucket_size", "train_micro_batch_size_per_gpu"};

TEST(ClosestKey, FindsTypos) {
  EXPECT_EQ(closest_key("stage3_prefech_bucket_size", kKeys), "stage3_prefetch_bucket_size");
  EXPECT_EQ(closest_key("stgae", kKeys), "stage");
  EXPECT_EQ(closest_key("reduce_buckt_sise", kKeys), "reduce_bucket_size");
}

TEST(ClosestKey, IgnoresCase) { EXPECT_EQ(closest_key("Stage", kKeys), "stage"); }

TEST(ClosestKey, FindsAPartOfTheName) {
  EXPECT_EQ(closest_key("micro_batch_size", kKeys), "train_micro_batch_size_per_gpu");
}

TEST(ClosestKey, StaysQuietWhenNothingIsClose) {
  EXPECT_EQ(closest_key("learning_rate", kKeys), std::nullopt);
  EXPECT_EQ(closest_key("x", kKeys), std::nullopt);
  EXPECT_EQ(closest_key("", kKeys), std::nullopt);
  EXPECT_EQ(closest_key(std::string(10000, 'a'), kKeys), std::nullopt);
}

}  // namespace
