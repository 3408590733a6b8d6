#include "zero/comm/comm_stats.h"

#include <numeric>

namespace zero::comm {

std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "?";
}

std::uint64_t CommStats::total_bytes() const {
  return std::accumulate(bytes_sent.begin(), bytes_sent.end(), std::uint64_t{0});
}

std::uint64_t CommStats::total_calls() const {
  return std::accumulate(calls.begin(), calls.end(), std::uint64_t{0});
}

}  // namespace zero::comm
