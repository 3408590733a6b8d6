// Communicator::set_abort_hook: a backend's way to stop its transport's
// pending ops (NCCL's ncclCommAbort) when the communicator fails. Here a
// backend whose ops never complete until aborted stands in for NCCL's
// kernels waiting for a peer that is gone.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "zero/comm/comm_errors.h"
#include "zero/comm/communicator.h"
#include "zero/core/error.h"

namespace {

using namespace std::chrono_literals;
using zero::DType;
using zero::comm::WorkPtr;

// Done once `released` is set (by the abort), as NCCL's ops end once the
// communicator is aborted.
class StuckWork final : public zero::comm::Work {
 public:
  explicit StuckWork(std::shared_ptr<std::atomic<bool>> released) : released_(std::move(released)) {}
  void wait(std::chrono::milliseconds timeout) override {
    const auto end = std::chrono::steady_clock::now() + std::min(timeout, std::chrono::milliseconds(60'000));
    while (!released_->load()) {
      if (std::chrono::steady_clock::now() >= end) throw zero::Error("stuck op: timeout");
      std::this_thread::sleep_for(1ms);
    }
    throw zero::Error("stuck op: aborted");
  }
  bool is_completed() override { return released_->load(); }

 private:
  std::shared_ptr<std::atomic<bool>> released_;
};

class StuckCommunicator final : public zero::comm::Communicator {
 public:
  StuckCommunicator() {
    set_abort_hook([this] {
      aborts.fetch_add(1);
      released->store(true);
    });
  }
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  int local_rank() const override { return 0; }
  std::string backend_name() const override { return "stuck"; }

  std::atomic<int> aborts{0};
  std::shared_ptr<std::atomic<bool>> released = std::make_shared<std::atomic<bool>>(false);

 protected:
  WorkPtr stuck() { return std::make_shared<StuckWork>(released); }
  WorkPtr do_all_reduce(void*, std::size_t, DType, const zero::comm::AllReduceOptions&) override { return stuck(); }
  WorkPtr do_reduce_scatter(const void*, void*, std::size_t, DType, const zero::comm::ReduceScatterOptions&) override {
    return stuck();
  }
  WorkPtr do_all_gather(const void*, void*, std::size_t, DType) override { return stuck(); }
  WorkPtr do_broadcast(void*, std::size_t, DType, const zero::comm::BroadcastOptions&) override { return stuck(); }
  WorkPtr do_barrier() override { return stuck(); }
};

TEST(AbortHook, ATimeoutAbortsTheTransportOnce) {
  StuckCommunicator comm;
  comm.set_timeout(100ms);
  comm.set_flight_recorder(16, ::testing::TempDir());
  float v = 1.0f;
  WorkPtr first = comm.all_reduce(&v, 1, DType::kFloat32);
  WorkPtr second = comm.barrier();
  EXPECT_EQ(comm.aborts.load(), 0);
  EXPECT_THROW(first->wait(), zero::comm::CollectiveTimeout);
  EXPECT_EQ(comm.aborts.load(), 1);
  // The other pending op ends (the transport was stopped) instead of
  // waiting out its own timeout, and nothing aborts twice.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(second->wait(), zero::Error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_THROW(comm.barrier(), zero::Error);  // failed: no new op
  EXPECT_EQ(comm.aborts.load(), 1);
}

// A wait with a finite timeout of its own leaves the op pending: no abort.
TEST(AbortHook, AFiniteWaitDoesNotAbort) {
  StuckCommunicator comm;
  WorkPtr w = comm.barrier();
  EXPECT_THROW(w->wait(50ms), zero::Error);
  EXPECT_EQ(comm.aborts.load(), 0);
  comm.released->store(true);  // let the destructor's wait end
}

}  // namespace
