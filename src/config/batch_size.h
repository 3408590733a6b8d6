// The batch-size triple: train_batch_size = micro_batch * accumulation * world.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace zero::config::detail {

struct GivenBatchSizes {
  std::optional<std::int64_t> train_batch_size;
  std::optional<std::int64_t> micro_batch_per_gpu;
  std::optional<std::int64_t> gradient_accumulation_steps;
  bool any_auto = false;  // one of them was "auto" (read as not given)
};

struct BatchSizes {
  std::int64_t train_batch_size = 0;
  std::int64_t micro_batch_per_gpu = 0;
  std::int64_t gradient_accumulation_steps = 0;
};

// Any two of the three (positive) values give the third; train_batch_size or
// micro_batch alone take accumulation 1. Throws zero::Error, prefixed with
// source, that prints all three values and the world size and says how to
// fix them, when they are missing, inconsistent or do not divide.
BatchSizes resolve_batch_sizes(const GivenBatchSizes& given, int world_size,
                               std::string_view source);

}  // namespace zero::config::detail
