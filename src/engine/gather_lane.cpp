#include "gather_lane.h"

#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>

#include <c10/core/StreamGuard.h>

#include "zero/core/error.h"

namespace zero::detail {
namespace {

class StreamLane final : public GatherLane {
 public:
  explicit StreamLane(const DeviceContext& ctx) : ctx_(ctx), stream_(ctx.side_stream()) {}
  ~StreamLane() override {
    try {
      host_waits();  // the copies read the partition, which goes after this
    } catch (...) {
    }
  }

  void copy(const at::Tensor& dst, const at::Tensor& src, const at::Tensor&, std::size_t bucket,
            StepTimeline* timeline) override {
    // dst was just allocated on the compute stream: its memory may have
    // been another tensor's, still used by work queued there.
    ctx_.record_on(ctx_.current_stream())->block(stream_);
    const c10::StreamGuard on_lane(stream_);
    StepTimeline::on_stream(timeline, stream_, "gather", "bucket", bucket,
                            [&] { dst.copy_(src, /*non_blocking=*/true); });
  }

  Mark mark() override { return Mark{ctx_.record_on(stream_), 0}; }

  void compute_waits(const Mark& m) override { m.event->block(ctx_.current_stream()); }

  comm::WorkPtr issue_after(comm::Communicator& comm, const std::function<comm::WorkPtr()>& issue) override {
    // The collective follows the lane's stream instead of the compute one
    // (which it follows through the lane: every copy waited for it).
    void* const compute = comm.compute_stream();
    comm.set_compute_stream(stream_.native_handle());
    comm::WorkPtr w;
    try {
      w = issue();
    } catch (...) {
      comm.set_compute_stream(compute);
      throw;
    }
    comm.set_compute_stream(compute);
    return w;
  }

  void host_waits() override { stream_.synchronize(); }
  void host_waits(const Mark& m) override { m.event->synchronize(); }

 private:
  const DeviceContext& ctx_;
  c10::Stream stream_;
};

class DeferredLane final : public GatherLane {
 public:
  void copy(const at::Tensor& dst, const at::Tensor& src, const at::Tensor& owner, std::size_t bucket,
            StepTimeline*) override {
    ZERO_INTERNAL_ASSERT(dst.numel() == src.numel());
    // What a read before the wait sees.
    dst.fill_(std::numeric_limits<double>::quiet_NaN());
    queue_.push_back({dst, src, owner, bucket});
    ++queued_;
  }

  Mark mark() override { return Mark{nullptr, queued_}; }

  void compute_waits(const Mark& m) override { run_until(m.queued); }

  comm::WorkPtr issue_after(comm::Communicator&, const std::function<comm::WorkPtr()>& issue) override {
    host_waits();
    return issue();
  }

  void host_waits() override { run_until(queued_); }
  void host_waits(const Mark& m) override { run_until(m.queued); }

 private:
  struct Copy {
    at::Tensor dst, src, owner;
    std::size_t bucket;
  };
  void run_until(std::uint64_t n) {
    while (done_ < n) {
      Copy c = std::move(queue_.front());
      queue_.pop_front();
      // A bucket released (and maybe refilled elsewhere) before its copy
      // was waited for no longer holds dst's bytes.
      const auto* base = static_cast<const char*>(c.owner.storage().data());
      const auto* at = static_cast<const char*>(c.dst.data_ptr());
      ZERO_INTERNAL_ASSERT(base != nullptr && at >= base && at < base + c.owner.storage().nbytes(),
                           "stage 3: bucket ", c.bucket, " was released before its gather was waited for");
      c.dst.copy_(c.src);
      ++done_;
    }
  }
  std::deque<Copy> queue_;
  std::uint64_t queued_ = 0, done_ = 0;
};

}  // namespace

std::unique_ptr<GatherLane> make_stream_lane(const DeviceContext& ctx) { return std::make_unique<StreamLane>(ctx); }

std::unique_ptr<GatherLane> make_deferred_lane() { return std::make_unique<DeferredLane>(); }

bool deferred_gathers_requested() {
  const char* v = std::getenv("ZERO_TEST_DEFERRED_GATHERS");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace zero::detail
