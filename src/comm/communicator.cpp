#include "zero/comm/communicator.h"

#include "zero/core/error.h"

namespace zero::comm {

CommStats Communicator::stats_snapshot() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

void Communicator::reset_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_ = CommStats{};
}

void Communicator::count(CollectiveKind kind, std::uint64_t bytes) {
  const auto i = static_cast<std::size_t>(kind);
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.bytes_sent[i] += bytes;
  stats_.calls[i] += 1;
}

}  // namespace zero::comm
