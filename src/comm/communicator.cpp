#include "zero/comm/communicator.h"

#include "comm_monitor.h"
#include "tracked_work.h"
#include "zero/core/error.h"

namespace zero::comm {

Communicator::Communicator() : monitor_(std::make_shared<detail::CommMonitor>()) {}

Communicator::~Communicator() = default;

CommStats Communicator::stats_snapshot() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

void Communicator::reset_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_ = CommStats{};
}

template <typename Issue>
WorkPtr Communicator::tracked(const OpSignature& sig, Issue issue) {
  detail::CommMonitor& m = *monitor_;
  m.check_usable();
  m.set_identity(rank(), world_size());
  const std::uint64_t bytes =
      ring_bytes_sent(sig.kind, static_cast<std::size_t>(sig.count), element_size(sig.dtype), world_size());
  WorkPtr work = issue();  // throws on bad arguments: then nothing is recorded or counted
  {
    const auto i = static_cast<std::size_t>(sig.kind);
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.bytes_sent[i] += bytes;
    stats_.calls[i] += 1;
  }
  const std::uint64_t seq = m.recorder().issue(sig, bytes);
  if (work->is_completed()) {
    bool failed = false;
    try {
      work->wait(std::chrono::milliseconds::max());  // done: returns at once or rethrows
    } catch (...) {
      failed = true;  // the wrapper's wait() reports it, with the other ranks' view
    }
    if (!failed) {
      // Nothing left to wait for (count 0, one rank): no wrapper needed.
      m.recorder().finish(seq, OpState::kCompleted);
      return work;
    }
  }
  return std::make_shared<detail::TrackedWork>(std::move(work), seq, monitor_);
}

WorkPtr Communicator::all_reduce(void* data, std::size_t count, DType dtype,
                                 const AllReduceOptions& options) {
  return tracked(OpSignature{CollectiveKind::kAllReduce, options.op, dtype, count, -1, options.tag},
                 [&] { return do_all_reduce(data, count, dtype, options); });
}

WorkPtr Communicator::reduce_scatter(const void* input, void* output, std::size_t count_per_rank,
                                     DType dtype, const ReduceScatterOptions& options) {
  return tracked(OpSignature{CollectiveKind::kReduceScatter, options.op, dtype, count_per_rank, -1, options.tag},
                 [&] { return do_reduce_scatter(input, output, count_per_rank, dtype, options); });
}

WorkPtr Communicator::all_gather(const void* input, void* output, std::size_t count_per_rank,
                                 DType dtype, const AllGatherOptions& options) {
  return tracked(OpSignature{CollectiveKind::kAllGather, ReduceOp::kSum, dtype, count_per_rank, -1, options.tag},
                 [&] { return do_all_gather(input, output, count_per_rank, dtype); });
}

WorkPtr Communicator::broadcast(void* data, std::size_t count, DType dtype,
                                const BroadcastOptions& options) {
  return tracked(OpSignature{CollectiveKind::kBroadcast, ReduceOp::kSum, dtype, count, options.root, options.tag},
                 [&] { return do_broadcast(data, count, dtype, options); });
}

WorkPtr Communicator::barrier() {
  return tracked(OpSignature{CollectiveKind::kBarrier, ReduceOp::kSum, DType::kFloat32, 0, -1},
                 [&] { return do_barrier(); });
}

void Communicator::set_timeout(std::chrono::milliseconds timeout) { monitor_->set_timeout(timeout); }

std::chrono::milliseconds Communicator::timeout() const { return monitor_->timeout(); }

void Communicator::set_flight_recorder(std::size_t entries, const std::string& dir) {
  monitor_->recorder().set_capacity(entries);
  monitor_->set_dump_dir(dir);
}

const FlightRecorder& Communicator::flight_recorder() const { return monitor_->recorder(); }

std::string Communicator::flight_recorder_path() const {
  monitor_->set_identity(rank(), world_size());
  return monitor_->dump_path();
}

std::string Communicator::dump_flight_recorder(const std::string& reason) {
  monitor_->set_identity(rank(), world_size());
  return monitor_->dump(reason);
}

void Communicator::check_sequence() {
  monitor_->set_identity(rank(), world_size());
  monitor_->check_sequence();
}

HealthChannel* Communicator::health_channel() const { return monitor_->channel(); }

void Communicator::set_health_channel(std::shared_ptr<HealthChannel> channel) {
  monitor_->set_channel(std::move(channel));
}

void Communicator::adopt_health_channel(std::shared_ptr<HealthChannel> channel) {
  ZERO_CHECK(monitor_->channel() == nullptr, "this ", backend_name(), " communicator has a health channel already");
  monitor_->set_channel(std::move(channel));
}

void Communicator::set_abort_hook(std::function<void()> abort) { monitor_->set_abort_hook(std::move(abort)); }

FlightRecorder& Communicator::mutable_flight_recorder() { return monitor_->recorder(); }

}  // namespace zero::comm
