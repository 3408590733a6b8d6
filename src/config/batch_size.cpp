#include "batch_size.h"

#include <limits>
#include <string>

#include "zero/config/config.h"
#include "zero/core/error.h"

namespace zero::config::detail {
namespace {

std::string shown(const std::optional<std::int64_t>& v) {
  return v ? std::to_string(*v) : std::string("(not given)");
}

// "train_batch_size=30, train_micro_batch_size_per_gpu=4,
// gradient_accumulation_steps=(not given), world size 4"
std::string values(const GivenBatchSizes& g, int world) {
  return "train_batch_size=" + shown(g.train_batch_size) +
         ", train_micro_batch_size_per_gpu=" + shown(g.micro_batch_per_gpu) +
         ", gradient_accumulation_steps=" + shown(g.gradient_accumulation_steps) +
         ", world size " + std::to_string(world);
}

[[noreturn]] void fail(std::string_view source, const GivenBatchSizes& g, int world,
                       const std::string& problem) {
  throw Error(std::string(source) + ": batch sizes: " + problem + " (" + values(g, world) + ")");
}

std::int64_t multiply(std::string_view source, const GivenBatchSizes& g, int world,
                      std::int64_t a, std::int64_t b) {
  std::int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) {
    fail(source, g, world, "the product of the batch sizes does not fit in 64 bits; use smaller values");
  }
  return out;
}

// train = per_step * n must hold for a whole n >= 1; names `n_key`, which
// would be computed as train / per_step, in the message.
std::int64_t divide(std::string_view source, const GivenBatchSizes& g, int world, std::int64_t train,
                    std::int64_t per_step, const std::string& per_step_text,
                    const std::string& n_key) {
  if (train % per_step != 0 || train < per_step) {
    std::int64_t lower = train / per_step * per_step;
    std::int64_t upper;
    bool has_upper = !__builtin_add_overflow(lower, per_step, &upper);
    std::string near;
    if (lower > 0) near = std::to_string(lower);
    if (lower > 0 && has_upper) near += " or ";
    if (has_upper) near += std::to_string(upper);
    fail(source, g, world,
         "train_batch_size must be a multiple of " + per_step_text + " = " +
             std::to_string(per_step) + " so that " + n_key +
             " is a whole number; set train_batch_size to e.g. " + near +
             ", or change the other values");
  }
  return train / per_step;
}

}  // namespace

BatchSizes resolve_batch_sizes(const GivenBatchSizes& g, int world, std::string_view source) {
  ZERO_INTERNAL_ASSERT(world >= 1, "world size ", world);
  const auto& t = g.train_batch_size;
  const auto& m = g.micro_batch_per_gpu;
  const auto& a = g.gradient_accumulation_steps;
  BatchSizes out;
  if (t && m && a) {
    std::int64_t product = multiply(source, g, world, multiply(source, g, world, *m, *a), world);
    if (product != *t) {
      fail(source, g, world,
           "train_batch_size must equal train_micro_batch_size_per_gpu x "
           "gradient_accumulation_steps x world size = " +
               std::to_string(*m) + " x " + std::to_string(*a) + " x " + std::to_string(world) +
               " = " + std::to_string(product) + ", but it is " + std::to_string(*t) +
               "; set train_batch_size to " + std::to_string(product) +
               ", or leave out one of the three keys to have it computed from the other two");
    }
    out = {*t, *m, *a};
  } else if (t && m) {
    std::int64_t per_step = multiply(source, g, world, *m, world);
    out = {*t, *m,
           divide(source, g, world, *t, per_step, "train_micro_batch_size_per_gpu x world size",
                  "gradient_accumulation_steps")};
  } else if (t && a) {
    std::int64_t per_step = multiply(source, g, world, *a, world);
    out = {*t,
           divide(source, g, world, *t, per_step, "gradient_accumulation_steps x world size",
                  "train_micro_batch_size_per_gpu"),
           *a};
  } else if (m && a) {
    out = {multiply(source, g, world, multiply(source, g, world, *m, *a), world), *m, *a};
  } else if (t) {
    out = {*t, divide(source, g, world, *t, world, "the world size", "train_micro_batch_size_per_gpu"),
           1};
  } else if (m) {
    out = {multiply(source, g, world, *m, world), *m, 1};
  } else {
    fail(source, g, world,
         std::string(g.any_auto ? "the batch sizes are \"auto\" (a value the Hugging Face Trainer fills in; zerocpp "
                                  "reads it as not given): "
                                : "") +
             "set train_batch_size or train_micro_batch_size_per_gpu (or both) to a number; "
             "train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps "
             "x world size");
  }
  // The engine counts micro-batches and scales gradients with 32-bit ints.
  if (out.gradient_accumulation_steps > std::numeric_limits<std::int32_t>::max()) {
    fail(source, g, world,
         "gradient_accumulation_steps is " + std::to_string(out.gradient_accumulation_steps) +
             ", more than the 2147483647 micro-batches per step zerocpp counts: give a smaller "
             "gradient_accumulation_steps (or, deriving it, a larger train_micro_batch_size_per_gpu or more ranks)");
  }
  return out;
}

}  // namespace zero::config::detail

namespace zero::config {

std::string Config::batch_summary() const {
  return "train_batch_size=" + std::to_string(train_batch_size) + " = micro_batch " +
         std::to_string(train_micro_batch_size_per_gpu) + " x accumulation " +
         std::to_string(gradient_accumulation_steps) + " x world " + std::to_string(world_size);
}

}  // namespace zero::config
