// The NCCL communicator on one process and one device, bootstrapped over the
// single-process backend: every op on device memory, the byte counters, the
// ordering after a compute stream, Work semantics. Skips without a device.
#include "zero/cuda/nccl_communicator.h"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "zero/comm/communicator.h"
#include "zero/core/error.h"
#include "zero/cuda/device_buffer.h"
#include "zero/cuda/pinned_buffer.h"
#include "zero/cuda/stream.h"

namespace zero::cuda {
namespace {

using comm::CollectiveKind;

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZERO_SKIP_WITHOUT_CUDA_DEVICE();
    bootstrap_ = comm::make_single_process_communicator();
    nccl_ = make_nccl_communicator(*bootstrap_, 0);
  }

  std::unique_ptr<comm::Communicator> bootstrap_;
  std::unique_ptr<NcclCommunicator> nccl_;
};

TEST_F(NcclCommunicatorTest, BootstrapsFromTheSingleProcessBackend) {
  EXPECT_EQ(nccl_->backend_name(), "nccl");
  EXPECT_EQ(nccl_->rank(), 0);
  EXPECT_EQ(nccl_->world_size(), 1);
  EXPECT_EQ(nccl_->local_rank(), 0);
  EXPECT_EQ(nccl_->device(), 0);
  EXPECT_NE(nccl_->comm_stream(), nullptr);
  EXPECT_EQ(nccl_->compute_stream(), nullptr);
}

TEST_F(NcclCommunicatorTest, AllReduceOnDeviceMemory) {
  constexpr std::size_t kN = 1 << 20;
  std::vector<float> h(kN), back(kN);
  for (std::size_t i = 0; i < kN; ++i) h[i] = static_cast<float>(i % 1000) - 500.0f;
  DeviceBuffer d(kN * 4);
  copy_async(d.data(), h.data(), kN * 4, nullptr);  // on the compute stream (default)
  comm::WorkPtr w = nccl_->all_reduce(d.data(), kN, DType::kFloat32);
  w->wait(std::chrono::seconds(60));
  EXPECT_TRUE(w->is_completed());
  copy_async(back.data(), d.data(), kN * 4, nullptr);
  stream_synchronize(nullptr);
  EXPECT_EQ(back, h);  // the sum over one rank
  const comm::CommStats s = nccl_->stats_snapshot();
  EXPECT_EQ(s.calls_of(CollectiveKind::kAllReduce), 1u);
  EXPECT_EQ(s.total_bytes(), 0u);  // world 1 sends nothing (comm_stats.h)
}

// The compute stream's work before the op is visible to it, without a host
// synchronisation between: a copy on a non-blocking compute stream, then an
// out-of-place reduce_scatter; then wait_on_stream orders the read-back.
TEST_F(NcclCommunicatorTest, OrdersAfterTheComputeStreamAndBefore) {
  constexpr std::size_t kN = 4 << 20;
  CudaStream compute;
  nccl_->set_compute_stream(compute.handle());
  PinnedBuffer h(kN * 2), back(kN * 2);
  auto* hv = h.as<std::uint16_t>();
  for (std::size_t i = 0; i < kN; ++i) hv[i] = static_cast<std::uint16_t>(0x3f80 + (i % 64));
  DeviceBuffer in(kN * 2), out(kN * 2);
  copy_async(in.data(), h.data(), kN * 2, compute.handle());
  comm::WorkPtr w = nccl_->reduce_scatter(in.data(), out.data(), kN, DType::kBFloat16);
  wait_on_stream(*w, compute.handle());
  copy_async(back.data(), out.data(), kN * 2, compute.handle());
  compute.synchronize();
  EXPECT_EQ(std::memcmp(h.data(), back.data(), kN * 2), 0);
  w->wait();
}

TEST_F(NcclCommunicatorTest, EveryOpAndTheCounters) {
  constexpr std::size_t kN = 1000;
  std::vector<float> h(kN, 1.5f), back(kN, 0.0f);
  DeviceBuffer a(kN * 4), b(kN * 4);
  copy_async(a.data(), h.data(), kN * 4, nullptr);
  nccl_->all_gather(a.data(), b.data(), kN, DType::kFloat32)->wait();
  nccl_->broadcast(b.data(), kN, DType::kFloat32, {0})->wait();
  nccl_->all_reduce(b.data(), kN, DType::kFloat32, {comm::ReduceOp::kMax})->wait();
  nccl_->barrier()->wait(std::chrono::seconds(60));
  copy_async(back.data(), b.data(), kN * 4, nullptr);
  stream_synchronize(nullptr);
  EXPECT_EQ(back, h);
  // count 0: complete at once, pointers may be null, still counted.
  EXPECT_TRUE(nccl_->all_reduce(nullptr, 0, DType::kFloat16)->is_completed());
  const comm::CommStats s = nccl_->stats_snapshot();
  EXPECT_EQ(s.calls_of(CollectiveKind::kAllGather), 1u);
  EXPECT_EQ(s.calls_of(CollectiveKind::kBroadcast), 1u);
  EXPECT_EQ(s.calls_of(CollectiveKind::kAllReduce), 2u);
  EXPECT_EQ(s.calls_of(CollectiveKind::kBarrier), 1u);
  EXPECT_EQ(s.total_bytes(), 0u);
}

TEST_F(NcclCommunicatorTest, BadArgumentsThrowBeforeAnythingIsSent) {
  EXPECT_THROW(nccl_->all_reduce(nullptr, 4, DType::kFloat32), Error);
  EXPECT_THROW(nccl_->broadcast(nullptr, 0, DType::kFloat32, {1}), Error);
  DeviceBuffer d(64);
  // Overlapping but not in place (output != input + rank * count).
  EXPECT_THROW(nccl_->reduce_scatter(d.as<float>(), d.as<float>() + 1, 4, DType::kFloat32), Error);
  EXPECT_EQ(nccl_->stats_snapshot().total_calls(), 0u);
}

}  // namespace
}  // namespace zero::cuda
