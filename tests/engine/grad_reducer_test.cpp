// GradReducer's waits (zero/zero/grad_reducer.h): on a device backend the
// host never waits for a reduction inside backward (the stream waits on the
// device) and waits once for all of them at end_backward(); on a host
// backend every reduction is waited for on the host before its chunk is
// used. A fake backend stands in for NCCL: its ops stay in flight (not
// is_completed()) until a stream has been ordered after them, as GPU work
// does while the host runs ahead; a host backend's ops are done at once.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include "zero/comm/communicator.h"
#include "zero/core/error.h"
#include "zero/memory/memory_ledger.h"
#include "zero/zero/flat_layout.h"
#include "zero/zero/grad_reducer.h"

namespace {

using zero::DType;
using zero::comm::WorkPtr;

// What happened, in order: "device N" (a stream ordered after op N), "host
// N" (the host waited for op N), "consume B" (bucket B's chunk used).
using Log = std::vector<std::string>;

class FakeWork final : public zero::comm::Work {
 public:
  FakeWork(int id, bool device, std::shared_ptr<Log> log, std::shared_ptr<bool> drained)
      : id_(id), device_(device), log_(std::move(log)), drained_(std::move(drained)) {}
  void wait(std::chrono::milliseconds) override {
    EXPECT_TRUE(is_completed()) << "op " << id_ << ": the communicator waits only for what is done";
    if (!waited_) log_->push_back("host " + std::to_string(id_));
    waited_ = true;
  }
  bool is_completed() override { return !device_ || ordered_ || *drained_; }
  bool wait_on_device(void*) override {
    if (!device_) return false;
    log_->push_back("device " + std::to_string(id_));
    ordered_ = true;
    return true;
  }

 private:
  int id_;
  bool device_;
  bool ordered_ = false;
  bool waited_ = false;
  std::shared_ptr<Log> log_;
  std::shared_ptr<bool> drained_;  // the device has run everything queued
};

class FakeCommunicator final : public zero::comm::Communicator {
 public:
  FakeCommunicator(bool device, std::shared_ptr<Log> log) : device_(device), log_(std::move(log)) {}
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  int local_rank() const override { return 0; }
  std::string backend_name() const override { return device_ ? "fake-device" : "fake-host"; }
  int issued = 0;
  std::shared_ptr<bool> drained = std::make_shared<bool>(false);

 protected:
  WorkPtr next() { return std::make_shared<FakeWork>(issued++, device_, log_, drained); }
  WorkPtr do_all_reduce(void*, std::size_t, DType, const zero::comm::AllReduceOptions&) override { return next(); }
  WorkPtr do_reduce_scatter(const void*, void*, std::size_t, DType, const zero::comm::ReduceScatterOptions&) override {
    return next();
  }
  WorkPtr do_all_gather(const void*, void*, std::size_t, DType) override { return next(); }
  WorkPtr do_broadcast(void*, std::size_t, DType, const zero::comm::BroadcastOptions&) override { return next(); }
  WorkPtr do_barrier() override { return next(); }

 private:
  bool device_;
  std::shared_ptr<Log> log_;
};

// Six parameters of 8 elements in buckets of 16 (three buckets), two ranks.
struct Rig {
  explicit Rig(bool device, int max_in_flight = 1, std::vector<std::size_t> numels = {8, 8, 8, 8, 8, 8})
      : log(std::make_shared<Log>()),
        comm(device, log),
        layout(numels, 16, /*pad_world=*/2, /*shard_world=*/2, /*align=*/1) {
    // A host wait for an op the device never gets to fails in 2 s, not 600.
    comm.set_timeout(std::chrono::seconds(2));
    comm.set_flight_recorder(16, testing::TempDir());
    zero::GradReducer::Options o;
    o.mode = zero::GradReduceMode::kReduceScatter;
    o.max_in_flight = max_in_flight;
    reducer = std::make_unique<zero::GradReducer>(
        layout, comm, ledger, o, at::Tensor(), at::zeros({0}),
        [this](int b, const at::Tensor& chunk) {
          log->push_back("consume " + std::to_string(b));
          EXPECT_EQ(chunk.numel(), static_cast<std::int64_t>(layout.buckets()[static_cast<std::size_t>(b)].chunk));
        });
  }
  // One backward: every parameter's gradient (but `unused`'s), in reverse
  // order (as autograd finishes them); returns the log up to end_backward().
  // `live_peak`: the most bucket bytes held at once inside it.
  Log backward(int unused = -1, std::int64_t* live_peak = nullptr) {
    reducer->begin_backward(true);
    std::int64_t peak = 0;
    for (int i = static_cast<int>(layout.params().size()) - 1; i >= 0; --i) {
      if (i == unused) continue;
      reducer->on_grad(i, at::ones({static_cast<std::int64_t>(layout.params()[static_cast<std::size_t>(i)].numel)}));
      peak = std::max(peak, ledger.snapshot().bytes(zero::memory::Tier::kDevice, zero::memory::Kind::kBuckets));
    }
    if (live_peak != nullptr) *live_peak = peak;
    Log during = *log;
    reducer->end_backward();
    return during;
  }
  std::shared_ptr<Log> log;
  FakeCommunicator comm;
  zero::memory::MemoryLedger ledger;
  zero::FlatLayout layout;
  std::unique_ptr<zero::GradReducer> reducer;
};

int count_prefix(const Log& log, const std::string& prefix) {
  int n = 0;
  for (const std::string& e : log) n += e.rfind(prefix, 0) == 0 ? 1 : 0;
  return n;
}

// The first backward ends with the launch order's broadcast (once): one op
// more, ordered on the device and waited for on the host like the others.
constexpr int kOrderBroadcast = 1;

TEST(GradReducerWaits, ADeviceBackendIsWaitedForOnTheDeviceInBackwardAndOnTheHostOnceAtItsEnd) {
  Rig s(/*device=*/true);
  ASSERT_EQ(s.layout.buckets().size(), 3u);
  const Log during = s.backward();
  // Inside backward: the host never waited; two of the three buckets were
  // consumed after their stream wait (max_in_flight 1: launching the next
  // bucket finishes the oldest), each right after it.
  EXPECT_EQ(count_prefix(during, "host "), 0) << testing::PrintToString(during);
  EXPECT_EQ(count_prefix(during, "device "), 2) << testing::PrintToString(during);
  for (std::size_t i = 0; i < during.size(); ++i) {
    if (during[i].rfind("consume ", 0) == 0) {
      ASSERT_GT(i, 0u);
      EXPECT_EQ(during[i - 1].rfind("device ", 0), 0u) << "consumed before its stream wait: "
                                                        << testing::PrintToString(during);
    }
  }
  // end_backward(): the last one ordered and consumed, then every op waited
  // for on the host, each once, after all were consumed.
  const Log& all = *s.log;
  EXPECT_EQ(count_prefix(all, "device "), 3 + kOrderBroadcast) << testing::PrintToString(all);
  EXPECT_EQ(count_prefix(all, "consume "), 3);
  EXPECT_EQ(count_prefix(all, "host "), 3 + kOrderBroadcast) << testing::PrintToString(all);
  for (int op = 0; op < 3; ++op) {
    const auto host = std::find(all.begin(), all.end(), "host " + std::to_string(op));
    EXPECT_GT(host - all.begin(), std::find(all.begin(), all.end(), "consume 2") - all.begin())
        << "op " << op << " waited for on the host inside backward: " << testing::PrintToString(all);
  }
  // The next backward starts clean: nothing left to confirm.
  s.log->clear();
  s.backward();
  EXPECT_EQ(count_prefix(*s.log, "host "), 3);
}

TEST(GradReducerWaits, AHostBackendIsWaitedForOnTheHostBeforeEachChunkIsUsed) {
  Rig s(/*device=*/false);
  s.backward();
  const Log& all = *s.log;
  EXPECT_EQ(count_prefix(all, "device "), 0);
  EXPECT_EQ(count_prefix(all, "host "), 3 + kOrderBroadcast);
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].rfind("consume ", 0) == 0) {
      ASSERT_GT(i, 0u);
      EXPECT_EQ(all[i - 1].rfind("host ", 0), 0u) << testing::PrintToString(all);
    }
  }
}

TEST(GradReducerWaits, AbortWaitsOnTheHostForWhatOnlyTheDeviceWaitedFor) {
  Rig s(/*device=*/true);
  s.reducer->begin_backward(true);
  for (int i = 5; i >= 2; --i) s.reducer->on_grad(i, at::ones({8}));  // buckets 0 and 1 full (packed back to front)
  ASSERT_EQ(count_prefix(*s.log, "host "), 0);
  *s.comm.drained = true;  // the device gets through what was queued
  s.reducer->abort();
  EXPECT_EQ(count_prefix(*s.log, "host "), s.comm.issued) << testing::PrintToString(*s.log);
  // Usable again.
  *s.comm.drained = false;
  s.log->clear();
  s.backward();
  EXPECT_EQ(count_prefix(*s.log, "host "), 3 + kOrderBroadcast);  // the first backward that ended
}

// Ten parameters in five buckets, packed back to front: parameter 9, the
// last registered, is in bucket 0, the first launched in layout order. It
// never gets a gradient (a spare head), so in the first backward bucket 0
// never completes and holds back every bucket after it: all five live at
// once. After it the launch order is the buckets' completion order with the
// incomplete one last, and the next backward holds at most max_in_flight + 1
// buckets, as ZeRO-R's constant-size buffers ask.
TEST(GradReducerOrder, AParameterWithoutAGradientHoldsBackNoOtherBucketAfterTheFirstBackward) {
  Rig s(/*device=*/false, /*max_in_flight=*/1, std::vector<std::size_t>(10, 8));
  ASSERT_EQ(s.layout.buckets().size(), 5u);
  ASSERT_EQ(s.layout.params()[9].bucket, 0);
  const std::int64_t bucket_bytes = 16 * 4;
  std::int64_t first = 0, second = 0, third = 0;
  s.backward(/*unused=*/9, &first);
  EXPECT_EQ(first, 5 * bucket_bytes) << "the first backward, in layout order, holds every bucket";
  s.log->clear();
  s.backward(/*unused=*/9, &second);
  EXPECT_LE(second, 2 * bucket_bytes) << "held back by the unused parameter's bucket after the order was agreed";
  // Every bucket still reduced and consumed, the unused one last, and no
  // second broadcast.
  EXPECT_EQ(count_prefix(*s.log, "consume "), 5) << testing::PrintToString(*s.log);
  EXPECT_EQ(s.log->back(), "consume 0") << testing::PrintToString(*s.log);
  EXPECT_EQ(count_prefix(*s.log, "host "), 5);
  // Using it again (a step where it has a gradient) changes nothing but when bucket 0 goes.
  s.log->clear();
  s.backward(/*unused=*/-1, &third);
  EXPECT_LE(third, 2 * bucket_bytes);
  EXPECT_EQ(count_prefix(*s.log, "consume "), 5);
}

}  // namespace
