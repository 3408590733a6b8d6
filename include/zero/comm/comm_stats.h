// Byte counters of a Communicator, and the convention they follow.
//
// Communication is counted as the ZeRO paper counts it: the bytes ONE rank
// sends under a ring algorithm, whatever algorithm the backend really uses,
// so the numbers are a property of the training step, not of the MPI build.
// With N = world_size and e = element_size(dtype):
//
//   all_reduce(count)            2 * (N-1) * ceil(count / N) * e
//                                (ring reduce-scatter + ring all-gather of
//                                 count elements padded to a multiple of N)
//   reduce_scatter(count_per_rank)  (N-1) * count_per_rank * e
//   all_gather(count_per_rank)      (N-1) * count_per_rank * e
//   broadcast(count)             (N-1) * ceil(count / N) * e
//                                (scatter from the root + ring all-gather)
//   barrier                      0
//
// N = 1 gives 0 for every op; count 0 gives 0 bytes but is still a call.
// Ops are counted when they are issued, identically on every rank.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zero::comm {

enum class CollectiveKind : std::uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier
};
inline constexpr std::size_t kNumCollectiveKinds = 5;

// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier".
std::string_view collective_name(CollectiveKind kind);

struct CommStats {
  // Indexed by static_cast<std::size_t>(CollectiveKind).
  std::array<std::uint64_t, kNumCollectiveKinds> bytes_sent{};
  std::array<std::uint64_t, kNumCollectiveKinds> calls{};

  std::uint64_t total_bytes() const;
  std::uint64_t total_calls() const;
  std::uint64_t bytes_of(CollectiveKind kind) const {
    return bytes_sent[static_cast<std::size_t>(kind)];
  }
  std::uint64_t calls_of(CollectiveKind kind) const {
    return calls[static_cast<std::size_t>(kind)];
  }
};

// The bytes one rank sends for one op, by the table above. `count` is the op's
// count argument: count for all_reduce and broadcast, count_per_rank for
// reduce_scatter and all_gather (ignored for barrier).
constexpr std::uint64_t ring_bytes_sent(CollectiveKind kind, std::size_t count,
                                        std::size_t element_bytes, int world_size) {
  if (world_size <= 1) return 0;
  const std::uint64_t n = static_cast<std::uint64_t>(world_size);
  const std::uint64_t c = count;
  const std::uint64_t e = element_bytes;
  const std::uint64_t chunk = (c + n - 1) / n;  // ceil(count / N)
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return 2 * (n - 1) * chunk * e;
    case CollectiveKind::kReduceScatter:
      return (n - 1) * c * e;
    case CollectiveKind::kAllGather:
      return (n - 1) * c * e;
    case CollectiveKind::kBroadcast:
      return (n - 1) * chunk * e;
    case CollectiveKind::kBarrier:
      return 0;
  }
  return 0;
}

}  // namespace zero::comm
