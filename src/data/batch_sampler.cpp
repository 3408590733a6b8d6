#include "zero/data/batch_sampler.h"

#include "zero/core/error.h"

namespace zero::data {

namespace {

// SplitMix64: a counter-based generator, so any (step, index) is one call.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

BatchSampler::BatchSampler(std::int64_t data_len, std::int64_t seq_len, std::int64_t micro,
                           std::int64_t accumulation, int world, int rank, std::uint64_t seed)
    : data_len_(data_len), seq_len_(seq_len), micro_(micro), accumulation_(accumulation),
      world_(world), rank_(rank), seed_(seed) {
  ZERO_CHECK(data_len_ > seq_len_ + 1, "the data (", data_len_, " bytes) is shorter than one sequence of ",
             seq_len_ + 1, " bytes: use a shorter sequence or more text");
}

std::vector<std::int64_t> BatchSampler::offsets(std::int64_t step, std::int64_t micro_index) const {
  std::vector<std::int64_t> out;
  const std::uint64_t range = static_cast<std::uint64_t>(data_len_ - seq_len_ - 1);
  for (std::int64_t i = 0; i < micro_; ++i) {
    const std::int64_t index = micro_index * micro_ * world_ + rank_ * micro_ + i;
    const std::uint64_t h = mix(seed_ ^ mix(static_cast<std::uint64_t>(step) * 0x100000001b3ull +
                                            static_cast<std::uint64_t>(index)));
    out.push_back(static_cast<std::int64_t>(h % range));
  }
  return out;
}

}  // namespace zero::data
