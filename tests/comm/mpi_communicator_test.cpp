// The MPI backend on 1, 2 and 4 ranks (ctest runs this binary under mpirun
// once per NP). Expected values are closed forms of rank and world size,
// chosen exactly representable in bf16 and fp16 so that every sum is exact.
#include "zero/comm/mpi_communicator.h"

#include "../support/resident_peak.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <unistd.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "typed_buffer.h"
#include "zero/comm/comm_errors.h"
#include "zero/comm/communicator.h"
#include "zero/comm/launcher_env.h"
#include "zero/comm/mpi_check.h"
#include "mpi_work.h"  // src/comm: the Work of the MPI backend
#include "zero/core/error.h"
#include "zero/core/shard.h"

namespace {

using namespace std::chrono_literals;
using zero::DType;
using zero::ShardInfo;
using zero::comm::CollectiveKind;
using zero::comm::Communicator;
using zero::comm::ReduceOp;
using zero::comm::testing::kAllDTypes;
using zero::comm::testing::TypedBuffer;

constexpr std::size_t kSizes[] = {0, 1, 7, 1000, 1001};

// Element i of rank r for sums: multiples of 1/4 below 4 in magnitude, so
// every partial sum over up to 4 ranks is exact in bf16 (8 significant bits).
float f(int r, std::size_t i) {
  return 0.5f * static_cast<float>(r + 1) + (static_cast<float>(i % 9) - 4.0f) * 0.25f;
}
float sum_f(int n, std::size_t i) {
  return 0.25f * static_cast<float>(n * (n + 1)) +
         static_cast<float>(n) * (static_cast<float>(i % 9) - 4.0f) * 0.25f;
}
// For max: not monotonic in r, so the winner changes with i.
float g(int r, std::size_t i) {
  return static_cast<float>((i * 7 + static_cast<std::size_t>(r) * 3) % 11) * 0.5f - 2.0f;
}
float max_g(int n, std::size_t i) {
  float m = g(0, i);
  for (int r = 1; r < n; ++r) m = std::max(m, g(r, i));
  return m;
}
// What rank r contributes at global index k of a gathered buffer.
float h(int r, std::size_t k) { return static_cast<float>(r) + static_cast<float>(k % 5) * 0.5f; }
// What root broadcasts.
float b(int root, std::size_t i) {
  return static_cast<float>(root * 2) + static_cast<float>(i % 7) * 0.25f - 1.0f;
}

std::string trace(DType dtype, std::size_t n) {
  return std::string(zero::dtype_name(dtype)) + " n=" + std::to_string(n);
}

class MpiCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = zero::comm::make_mpi_communicator();
    r_ = comm_->rank();
    n_ = comm_->world_size();
  }
  // Bytes the last ops added, to compare with the closed forms.
  std::uint64_t bytes_since(std::uint64_t before) const {
    return comm_->stats().total_bytes() - before;
  }
  std::uint64_t un() const { return static_cast<std::uint64_t>(n_); }

  std::unique_ptr<Communicator> comm_;
  int r_ = 0;
  int n_ = 1;
};

TEST_F(MpiCommunicatorTest, Identity) {
  int world_rank = -1, world_size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  EXPECT_EQ(r_, world_rank);
  EXPECT_EQ(n_, world_size);
  EXPECT_EQ(comm_->backend_name(), "mpi");
  // ctest runs every rank on this one node.
  EXPECT_EQ(comm_->local_rank(), r_);
  // mpirun tells the same through the environment (launcher_env.h).
  EXPECT_EQ(zero::comm::launcher_local_rank(), r_);
  EXPECT_EQ(zero::comm::launcher_local_size(), n_);
}

TEST_F(MpiCommunicatorTest, MakeCommunicatorPicksMpiUnderTheLauncher) {
  EXPECT_EQ(zero::comm::default_backend_name(), "mpi");
  auto comm = zero::comm::make_communicator();
  EXPECT_EQ(comm->backend_name(), "mpi");
  EXPECT_EQ(comm->world_size(), n_);
}

TEST_F(MpiCommunicatorTest, AllReduceSum) {
  for (DType dtype : kAllDTypes) {
    for (std::size_t n : kSizes) {
      SCOPED_TRACE(trace(dtype, n));
      TypedBuffer buf(dtype, n);
      for (std::size_t i = 0; i < n; ++i) buf.set(i, f(r_, i));
      const auto before = comm_->stats().total_bytes();
      comm_->all_reduce(buf.data(), n, dtype)->wait();
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(buf.get(i), sum_f(n_, i)) << "i=" << i;
      EXPECT_EQ(bytes_since(before),
                2 * (un() - 1) * ((n + un() - 1) / un()) * element_size(dtype));
    }
  }
  EXPECT_EQ(comm_->stats().calls_of(CollectiveKind::kAllReduce),
            std::size(kAllDTypes) * std::size(kSizes));
}

TEST_F(MpiCommunicatorTest, AllReduceMax) {
  for (DType dtype : kAllDTypes) {
    for (std::size_t n : kSizes) {
      SCOPED_TRACE(trace(dtype, n));
      TypedBuffer buf(dtype, n);
      for (std::size_t i = 0; i < n; ++i) buf.set(i, g(r_, i));
      comm_->all_reduce(buf.data(), n, dtype, {ReduceOp::kMax})->wait();
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(buf.get(i), max_g(n_, i)) << "i=" << i;
    }
  }
}

TEST_F(MpiCommunicatorTest, AllReduceMaxPropagatesNaNFromAnyRank) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(zero::dtype_name(dtype));
    TypedBuffer buf(dtype, 4);
    for (std::size_t i = 0; i < 4; ++i) buf.set(i, g(r_, i));
    if (r_ == n_ - 1) buf.set(2, std::numeric_limits<float>::quiet_NaN());
    comm_->all_reduce(buf.data(), 4, dtype, {ReduceOp::kMax})->wait();
    EXPECT_TRUE(std::isnan(buf.get(2)));
    EXPECT_EQ(buf.get(3), max_g(n_, 3));
  }
}

// Sums that do round must still give every rank the same bits.
TEST_F(MpiCommunicatorTest, RoundedSixteenBitSumsAgreeOnEveryRank) {
  constexpr std::size_t n = 1001;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(zero::dtype_name(dtype));
    TypedBuffer buf(dtype, n);
    for (std::size_t i = 0; i < n; ++i)
      buf.set(i, 1.0f + 0.001f * static_cast<float>(i * (r_ + 3)));
    comm_->all_reduce(buf.data(), n, dtype)->wait();
    TypedBuffer everyone(dtype, n * static_cast<std::size_t>(n_));
    comm_->all_gather(buf.data(), everyone.data(), n, dtype)->wait();
    for (int q = 0; q < n_; ++q) {
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(everyone.bits(static_cast<std::size_t>(q) * n + i), buf.bits(i))
            << "rank " << q << " i=" << i;
    }
  }
}

// reduce_scatter of a buffer padded by shard_of: out of place, then in place
// (output == input + rank * per_rank), for sum and max.
TEST_F(MpiCommunicatorTest, ReduceScatterPaddedBuffer) {
  for (DType dtype : kAllDTypes) {
    for (std::size_t numel : kSizes) {
      for (bool in_place : {false, true}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          SCOPED_TRACE(trace(dtype, numel) + (in_place ? " in place" : " out of place") +
                       (op == ReduceOp::kSum ? " sum" : " max"));
          const ShardInfo s = zero::shard_of(numel, n_, r_);
          TypedBuffer input(dtype, s.padded_numel);
          for (std::size_t i = 0; i < numel; ++i)
            input.set(i, op == ReduceOp::kSum ? f(r_, i) : g(r_, i));
          TypedBuffer separate(dtype, s.per_rank);
          void* output = in_place ? input.at(s.offset) : separate.data();
          const auto before = comm_->stats().total_bytes();
          comm_
              ->reduce_scatter(input.data(), s.per_rank == 0 ? nullptr : output, s.per_rank, dtype,
                               {op})
              ->wait();
          EXPECT_EQ(bytes_since(before), (un() - 1) * s.per_rank * element_size(dtype));
          const TypedBuffer& result = in_place ? input : separate;
          const std::size_t base = in_place ? s.offset : 0;
          for (std::size_t j = 0; j < s.per_rank; ++j) {
            const std::size_t k = s.offset + j;
            const float want =
                k >= numel ? 0.0f : (op == ReduceOp::kSum ? sum_f(n_, k) : max_g(n_, k));
            ASSERT_EQ(result.get(base + j), want) << "j=" << j;
          }
        }
      }
    }
  }
}

// all_gather of every rank's shard rebuilds the padded buffer: out of place,
// then in place (input == output + rank * per_rank).
TEST_F(MpiCommunicatorTest, AllGatherPaddedBuffer) {
  for (DType dtype : kAllDTypes) {
    for (std::size_t numel : kSizes) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(trace(dtype, numel) + (in_place ? " in place" : " out of place"));
        const ShardInfo s = zero::shard_of(numel, n_, r_);
        TypedBuffer output(dtype, s.padded_numel);
        output.fill(-99.0f);  // what other ranks' slots hold before
        TypedBuffer separate(dtype, s.per_rank);
        TypedBuffer& shard_owner = in_place ? output : separate;
        const std::size_t base = in_place ? s.offset : 0;
        for (std::size_t j = 0; j < s.per_rank; ++j) {
          shard_owner.set(base + j, j < s.valid ? h(r_, s.offset + j) : 0.0f);
        }
        const void* input =
            s.per_rank == 0 ? nullptr : (in_place ? output.at(s.offset) : separate.data());
        const auto before = comm_->stats().total_bytes();
        comm_->all_gather(input, output.data(), s.per_rank, dtype)->wait();
        EXPECT_EQ(bytes_since(before), (un() - 1) * s.per_rank * element_size(dtype));
        for (std::size_t k = 0; k < s.padded_numel; ++k) {
          const int owner = static_cast<int>(k / s.per_rank);
          ASSERT_EQ(output.get(k), k < numel ? h(owner, k) : 0.0f) << "k=" << k;
        }
      }
    }
  }
}

TEST_F(MpiCommunicatorTest, BroadcastFromEveryRoot) {
  for (DType dtype : kAllDTypes) {
    for (std::size_t n : kSizes) {
      for (int root = 0; root < n_; ++root) {
        SCOPED_TRACE(trace(dtype, n) + " root=" + std::to_string(root));
        TypedBuffer buf(dtype, n);
        for (std::size_t i = 0; i < n; ++i) buf.set(i, r_ == root ? b(root, i) : -99.0f);
        const auto before = comm_->stats().total_bytes();
        comm_->broadcast(buf.data(), n, dtype, {root})->wait();
        EXPECT_EQ(bytes_since(before), (un() - 1) * ((n + un() - 1) / un()) * element_size(dtype));
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(buf.get(i), b(root, i)) << "i=" << i;
      }
    }
  }
}

TEST_F(MpiCommunicatorTest, BarrierCountsACallAndNoBytes) {
  comm_->barrier()->wait();
  comm_->barrier()->wait(10s);
  EXPECT_EQ(comm_->stats().calls_of(CollectiveKind::kBarrier), 2u);
  EXPECT_EQ(comm_->stats().total_bytes(), 0u);
  comm_->reset_stats();
  EXPECT_EQ(comm_->stats().total_calls(), 0u);
}

TEST_F(MpiCommunicatorTest, StatsFollowTheRingConventionForAZeroStep) {
  // One "step" of stage 2 on a padded buffer: reduce-scatter + all-gather
  // of per_rank elements each; ZeRO's 2 (N-1)/N Psi elements, plus padding.
  const std::size_t psi = 1001;
  const ShardInfo s = zero::shard_of(psi, n_, r_);
  TypedBuffer buf(DType::kBFloat16, s.padded_numel);
  comm_->reduce_scatter(buf.data(), buf.at(s.offset), s.per_rank, DType::kBFloat16)->wait();
  comm_->all_gather(buf.at(s.offset), buf.data(), s.per_rank, DType::kBFloat16)->wait();
  EXPECT_EQ(comm_->stats().total_bytes(), 2 * (un() - 1) * (s.padded_numel / un()) * 2);
  EXPECT_EQ(comm_->stats().total_bytes(),
            zero::comm::ring_bytes_sent(CollectiveKind::kAllReduce, s.padded_numel, 2, n_));
}

TEST_F(MpiCommunicatorTest, ManyOpsInFlightWaitedInReverseOrder) {
  std::vector<TypedBuffer> bufs;
  std::vector<zero::comm::WorkPtr> works;
  for (int k = 0; k < 6; ++k) {
    const DType dtype = kAllDTypes[k % 3];
    bufs.emplace_back(dtype, 1000 + static_cast<std::size_t>(k));
  }
  for (auto& buf : bufs) {
    for (std::size_t i = 0; i < buf.size(); ++i) buf.set(i, f(r_, i));
    works.push_back(comm_->all_reduce(buf.data(), buf.size(), buf.dtype()));
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (auto& buf : bufs) {
    for (std::size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf.get(i), sum_f(n_, i));
  }
}

TEST_F(MpiCommunicatorTest, IsCompletedBecomesTrueWhileAnotherThreadWaits) {
  TypedBuffer buf(DType::kFloat32, 1000);
  for (std::size_t i = 0; i < buf.size(); ++i) buf.set(i, f(r_, i));
  auto work = comm_->all_reduce(buf.data(), buf.size(), DType::kFloat32);
  std::thread waiter([&] { work->wait(); });
  while (!work->is_completed()) std::this_thread::yield();
  waiter.join();
  for (std::size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf.get(i), sum_f(n_, i));
}

TEST_F(MpiCommunicatorTest, DroppedWorkCompletesAndWorkOutlivesItsCommunicator) {
  TypedBuffer a(DType::kBFloat16, 7), c(DType::kBFloat16, 7);
  for (std::size_t i = 0; i < 7; ++i) {
    a.set(i, f(r_, i));
    c.set(i, f(r_, i));
  }
  { auto dropped = comm_->all_reduce(a.data(), 7, DType::kBFloat16); }  // destructor completes it
  for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(a.get(i), sum_f(n_, i));
  auto work = comm_->all_reduce(c.data(), 7, DType::kBFloat16);
  comm_.reset();
  work->wait();
  for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(c.get(i), sum_f(n_, i));
}

// Rank 0 enters a barrier the others join only after a sleep: its short wait
// times out with an error naming the op, and the op stays usable.
TEST_F(MpiCommunicatorTest, WaitTimesOutAndTheOpCanStillBeWaited) {
  comm_->barrier()->wait();  // line everyone up
  if (r_ == 0) {
    auto work = comm_->barrier();
    if (n_ > 1) {
      EXPECT_FALSE(work->is_completed());
      try {
        work->wait(20ms);
        FAIL() << "expected a timeout";
      } catch (const zero::Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("barrier"), std::string::npos) << what;
        EXPECT_NE(what.find("20 ms"), std::string::npos) << what;
      }
    }
    work->wait(30s);
    EXPECT_TRUE(work->is_completed());
  } else {
    std::this_thread::sleep_for(500ms);
    comm_->barrier()->wait();
  }
}

// comm_timeout: rank 1 joins a barrier only after rank 0's timeout. Rank 0's
// error names the op and rank 1, alive (its watchdog answered) but behind;
// the flight recorder file exists. The communicator is failed afterwards.
TEST_F(MpiCommunicatorTest, TimeoutNamesTheRankThatHasNotJoined) {
  if (n_ < 2) GTEST_SKIP() << "needs two ranks";
  comm_->barrier()->wait();
  const std::string dir = "/tmp/zerocpp-comm-test-fr-" + std::to_string(::getpid());
  comm_->set_flight_recorder(64, dir);
  if (r_ == 0) {
    comm_->set_timeout(300ms);
    auto work = comm_->barrier();
    try {
      work->wait();
      FAIL() << "expected a timeout";
    } catch (const zero::comm::CollectiveTimeout& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("collective #1, barrier"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 1 has not joined it"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 1 has issued 1 ops"), std::string::npos) << what;
      EXPECT_EQ(e.seq(), 1u);
      EXPECT_TRUE(std::ifstream(comm_->flight_recorder_path()).good()) << comm_->flight_recorder_path();
    }
    EXPECT_THROW(comm_->barrier(), zero::Error);  // failed: no new op
  } else if (r_ == 1) {
    std::this_thread::sleep_for(4000ms);  // past rank 0's timeout and its 3 s query
  }
  // Line everyone up again on MPI's own barrier (rank 0's is abandoned but
  // still pending in MPI: rank 1 and the others complete it here).
  if (r_ != 0) comm_->barrier()->wait();
  MPI_Barrier(MPI_COMM_WORLD);
}

// A communicator without a side channel of its own (as NCCL's is) borrows
// one carried by an MPI communicator over the same ranks: its timeouts name
// the rank that has not joined, and its sequence check works.
TEST_F(MpiCommunicatorTest, AttachedHealthChannelServesAnotherCommunicator) {
  auto owner = zero::comm::make_mpi_communicator(zero::comm::MpiCommunicatorOptions{.health_channel = false});
  EXPECT_EQ(owner->health_channel(), nullptr);
  zero::comm::attach_mpi_health_channel(*comm_, *owner);
  if (n_ < 2) {
    EXPECT_EQ(owner->health_channel(), nullptr);  // one rank: nothing to ask
    return;
  }
  ASSERT_NE(owner->health_channel(), nullptr);
  EXPECT_THROW(zero::comm::attach_mpi_health_channel(*comm_, *owner), zero::Error);  // has one
  // The sequence check on the owner's ops (none of the transport's).
  float v = 1.0f;
  owner->all_reduce(&v, 1, DType::kFloat32)->wait();
  owner->check_sequence();
  const std::string dir = "/tmp/zerocpp-comm-test-attached-" + std::to_string(::getpid());
  owner->set_flight_recorder(64, dir);
  owner->barrier()->wait();
  if (r_ == 0) {
    owner->set_timeout(300ms);
    auto work = owner->barrier();
    try {
      work->wait();
      FAIL() << "expected a timeout";
    } catch (const zero::comm::CollectiveTimeout& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("collective #2, barrier"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 1 has not joined it"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 1 has issued 2 ops"), std::string::npos) << what;
    }
  } else if (r_ == 1) {
    std::this_thread::sleep_for(4000ms);  // past rank 0's timeout and its 3 s query
  }
  if (r_ != 0) owner->barrier()->wait();
  MPI_Barrier(MPI_COMM_WORLD);
}

// A failure announced by one rank ends the others' waits at once.
TEST_F(MpiCommunicatorTest, AnnouncedFailureEndsTheOthersWaits) {
  if (n_ < 2) GTEST_SKIP() << "needs two ranks";
  comm_->barrier()->wait();
  if (r_ == 1) {
    comm_->health_channel()->announce_failure("key", "rank 1 broke", 1000ms);
    std::this_thread::sleep_for(2000ms);  // the others notice before this rank joins their barrier
  } else {
    const auto start = std::chrono::steady_clock::now();
    try {
      comm_->barrier()->wait();
      FAIL() << "expected a remote failure";
    } catch (const zero::comm::RemoteFailure& e) {
      EXPECT_EQ(e.origin_rank(), 1);
      EXPECT_NE(std::string(e.what()).find("rank 1 failed: rank 1 broke"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
  }
  if (r_ == 1) comm_->barrier()->wait();  // completes the others' abandoned barrier
  MPI_Barrier(MPI_COMM_WORLD);
}

// Ops MPI completes although they differ (sum vs max) are caught by
// check_sequence on every rank, naming the op and both sides.
TEST_F(MpiCommunicatorTest, SequenceCheckNamesTheDivergentOp) {
  float v = 1.0f;
  comm_->all_reduce(&v, 1, DType::kFloat32)->wait();
  comm_->check_sequence();  // the same so far
  zero::comm::AllReduceOptions o;
  o.op = r_ == n_ - 1 && n_ > 1 ? ReduceOp::kMax : ReduceOp::kSum;
  comm_->all_reduce(&v, 1, DType::kFloat32, o)->wait();
  if (n_ < 2) {
    comm_->check_sequence();
    return;
  }
  try {
    comm_->check_sequence();
    FAIL() << "expected a sequence mismatch";
  } catch (const zero::comm::SequenceMismatch& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("diverge at op #1"), std::string::npos) << what;
    EXPECT_NE(what.find("issued all_reduce max fp32 x 1"), std::string::npos) << what;
    EXPECT_NE(what.find("issued all_reduce sum fp32 x 1"), std::string::npos) << what;
  }
}

// Large enough (>= 64 KiB) that on 4 ranks Open MPI's ring is used when the
// backend stages the input; the result must not depend on it.
// A failure is stored in the Work and rethrown by every wait(): here one of
// the backend's completion step (the copy-out of an out-of-place
// reduce-scatter runs there), after the transport itself completed. Open MPI
// reports no transport error this test could provoke on demand (a truncated
// receive on MPI_COMM_SELF completes with MPI_SUCCESS from MPI_Wait).
TEST(MpiWork, FailedCompletionStepIsRethrownByEveryWait) {
  MPI_Request req = MPI_REQUEST_NULL;
  ASSERT_EQ(MPI_Ibarrier(MPI_COMM_SELF, &req), MPI_SUCCESS);
  zero::comm::detail::MpiOpInfo info;
  zero::comm::detail::MpiWork work(info, {req}, {},
                                   [] { throw zero::Error("the completion step failed"); });
  for (int attempt = 0; attempt < 2; ++attempt) {
    EXPECT_THROW(work.wait(std::chrono::milliseconds(10000)), zero::Error) << attempt;
  }
  EXPECT_TRUE(work.is_completed());
}

TEST(MpiCommunicatorStaging, LargeAllReduceWithAndWithoutStaging) {
  for (std::size_t staging_max : {std::size_t{0}, std::size_t{64} << 20}) {
    zero::comm::MpiCommunicatorOptions options;
    options.all_reduce_staging_max_bytes = staging_max;
    auto comm = zero::comm::make_mpi_communicator(options);
    const int r = comm->rank(), n = comm->world_size();
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        constexpr std::size_t size = 40000;  // 80 KiB in 16 bits
        SCOPED_TRACE(trace(dtype, size) + " staging_max=" + std::to_string(staging_max));
        TypedBuffer buf(dtype, size);
        for (std::size_t i = 0; i < size; ++i) buf.set(i, op == ReduceOp::kSum ? f(r, i) : g(r, i));
        comm->all_reduce(buf.data(), size, dtype, {op})->wait();
        for (std::size_t i = 0; i < size; ++i) {
          ASSERT_EQ(buf.get(i), op == ReduceOp::kSum ? sum_f(n, i) : max_g(n, i)) << "i=" << i;
        }
      }
    }
  }
}

// MPI counts are ints: all_reduce, reduce_scatter and broadcast split a
// larger buffer into several MPI calls; all_gather refuses it.
TEST(MpiCommunicatorChunking, SplitsAllReduceAndBroadcast) {
  auto comm = zero::comm::make_mpi_communicator(
      zero::comm::MpiCommunicatorOptions{.max_elements_per_call = 3});
  const int r = comm->rank(), n = comm->world_size();
  for (DType dtype : kAllDTypes) {
    for (std::size_t size : kSizes) {
      SCOPED_TRACE(trace(dtype, size));
      TypedBuffer buf(dtype, size);
      for (std::size_t i = 0; i < size; ++i) buf.set(i, f(r, i));
      comm->all_reduce(buf.data(), size, dtype)->wait();
      for (std::size_t i = 0; i < size; ++i) ASSERT_EQ(buf.get(i), sum_f(n, i));
      const int root = n - 1;
      for (std::size_t i = 0; i < size; ++i) buf.set(i, r == root ? b(root, i) : 0.0f);
      comm->broadcast(buf.data(), size, dtype, {root})->wait();
      for (std::size_t i = 0; i < size; ++i) ASSERT_EQ(buf.get(i), b(root, i));
    }
  }
  // One op each, whatever the number of MPI calls.
  EXPECT_EQ(comm->stats().calls_of(CollectiveKind::kAllReduce),
            std::size(kAllDTypes) * std::size(kSizes));
  std::vector<float> in(4 * static_cast<std::size_t>(n)), out(4);
  // reduce_scatter goes in pieces (MpiCommunicatorOptions::piece_bytes),
  // none larger than an MPI call carries.
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = f(r, i);
  comm->reduce_scatter(in.data(), out.data(), 4, DType::kFloat32)->wait();
  for (std::size_t j = 0; j < 4; ++j) ASSERT_EQ(out[j], sum_f(n, static_cast<std::size_t>(r) * 4 + j)) << j;
  try {
    comm->all_gather(out.data(), in.data(), 4, DType::kFloat32);
    FAIL() << "expected an error";
  } catch (const zero::Error& e) {
    EXPECT_NE(std::string(e.what()).find("smaller buckets"), std::string::npos) << e.what();
  }
  comm->all_gather(out.data(), in.data(), 3, DType::kFloat32)->wait();  // still in step
}

// all_reduce and reduce_scatter in pieces (piece_bytes of 40: a few elements
// a piece), several ops of both kinds issued before any is waited for and
// waited for in reverse: every rank issues every piece in the same order,
// whichever Work is polled, and each result is the whole op's.
TEST(MpiCommunicatorPieces, ManyOpsInPiecesWaitedForInAnyOrder) {
  auto comm = zero::comm::make_mpi_communicator(zero::comm::MpiCommunicatorOptions{.piece_bytes = 40});
  const int r = comm->rank(), n = comm->world_size();
  for (DType dtype : kAllDTypes) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(trace(dtype, 0) + (in_place ? " in place" : " out of place"));
      std::vector<std::unique_ptr<TypedBuffer>> buffers, outputs;
      std::vector<zero::comm::WorkPtr> works;
      std::vector<std::size_t> sizes;
      for (std::size_t size : kSizes) {
        // A reduce-scatter of `size` per rank, then an all-reduce of `size`.
        auto& rs = buffers.emplace_back(std::make_unique<TypedBuffer>(dtype, size * static_cast<std::size_t>(n)));
        for (std::size_t i = 0; i < size * static_cast<std::size_t>(n); ++i) rs->set(i, f(r, i));
        auto& out = outputs.emplace_back(std::make_unique<TypedBuffer>(dtype, size));
        void* to = in_place ? rs->at(static_cast<std::size_t>(r) * size) : out->data();
        works.push_back(comm->reduce_scatter(rs->data(), size == 0 ? nullptr : to, size, dtype));
        auto& ar = buffers.emplace_back(std::make_unique<TypedBuffer>(dtype, size));
        for (std::size_t i = 0; i < size; ++i) ar->set(i, f(r, i));
        outputs.emplace_back(nullptr);
        works.push_back(comm->all_reduce(ar->data(), size, dtype));
        sizes.push_back(size);
      }
      for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const std::size_t size = sizes[k];
        const TypedBuffer& rs = in_place ? *buffers[2 * k] : *outputs[2 * k];
        const std::size_t base = in_place ? static_cast<std::size_t>(r) * size : 0;
        for (std::size_t j = 0; j < size; ++j) {
          ASSERT_EQ(rs.get(base + j), sum_f(n, static_cast<std::size_t>(r) * size + j)) << "size " << size << " j=" << j;
        }
        for (std::size_t i = 0; i < size; ++i) ASSERT_EQ(buffers[2 * k + 1]->get(i), sum_f(n, i)) << "size " << size;
      }
    }
  }
}

// Ranks that wait for their ops in different orders, across the two kinds:
// rank 0 waits for an all-reduce and then a reduce-scatter, the others the
// other way round, each op in several pieces. Every wait drives both kinds,
// so no rank waits for a piece another rank has not issued.
TEST(MpiCommunicatorPieces, RanksWaitInDifferentOrders) {
  auto comm = zero::comm::make_mpi_communicator(zero::comm::MpiCommunicatorOptions{.piece_bytes = 64});
  const int r = comm->rank(), n = comm->world_size();
  constexpr std::size_t size = 1000;
  std::vector<float> ar(size), rs(size * static_cast<std::size_t>(n)), out(size);
  for (std::size_t i = 0; i < size; ++i) ar[i] = f(r, i);
  for (std::size_t i = 0; i < rs.size(); ++i) rs[i] = f(r, i);
  zero::comm::WorkPtr a = comm->all_reduce(ar.data(), size, DType::kFloat32);
  zero::comm::WorkPtr b = comm->reduce_scatter(rs.data(), out.data(), size, DType::kFloat32);
  if (r == 0) {
    a->wait(std::chrono::milliseconds(20000));
    b->wait(std::chrono::milliseconds(20000));
  } else {
    b->wait(std::chrono::milliseconds(20000));
    a->wait(std::chrono::milliseconds(20000));
  }
  for (std::size_t i = 0; i < size; ++i) ASSERT_EQ(ar[i], sum_f(n, i)) << i;
  for (std::size_t j = 0; j < size; ++j) ASSERT_EQ(out[j], sum_f(n, static_cast<std::size_t>(r) * size + j)) << j;
}

// An op abandoned while the job fails (comm_monitor's abandon: its buffers
// may be gone) ends the queue on that rank: no more of its pieces are
// issued, it and every op of the two kinds after it fail, naming why. (Every
// rank abandons here; a piece already in flight stays MPI's.)
TEST(MpiCommunicatorPieces, AnAbandonedOpEndsTheQueue) {
  auto comm = zero::comm::make_mpi_communicator(zero::comm::MpiCommunicatorOptions{.piece_bytes = 16});
  const int n = comm->world_size();
  if (n < 2) GTEST_SKIP() << "one rank: the ops complete without MPI";
  // The piece in flight stays MPI's, as in a failing job: later MPI calls
  // may still progress it, so its buffers are never freed (the Work keeps
  // its own and the MPI communicator: MpiPieceWork's destructor).
  static std::deque<std::vector<float>> kept;  // (reachable: not a leak to LeakSanitizer; never moved)
  auto& rs = kept.emplace_back(64 * static_cast<std::size_t>(n), 1.0f);
  auto& out = kept.emplace_back(64);
  auto& ar = kept.emplace_back(64, 1.0f);
  zero::comm::WorkPtr a = comm->reduce_scatter(rs.data(), out.data(), 64, DType::kFloat32);
  zero::comm::WorkPtr b = comm->all_reduce(ar.data(), 64, DType::kFloat32);
  ASSERT_NE(a->wrapped(), nullptr);
  ASSERT_NE(b->wrapped(), nullptr);
  a->wrapped()->abandon();
  for (zero::comm::Work* w : {a->wrapped(), b->wrapped()}) {
    try {
      w->wait(std::chrono::milliseconds(20000));
      ADD_FAILURE() << "an op of the ended queue completed";
    } catch (const zero::Error& e) {
      EXPECT_NE(std::string(e.what()).find("an earlier collective was abandoned"), std::string::npos) << e.what();
    }
  }
}

// What MPI holds for a reduce-scatter or an all-reduce stays about a piece,
// whatever the op's size: 64 MiB reduced in 1 MiB pieces raises no rank's
// peak resident set by more than 8 MiB (whole, Open MPI's libnbc held two
// 64 MiB copies on rank 0, and one on the tree's inner ranks for an
// all-reduce). The kernel's peak (VmHWM) is reset before each op.
TEST(MpiCommunicatorPieces, ScratchStaysAboutAPiece) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer keeps freed memory in quarantine: the resident set is not the program's";
#endif
  auto comm = zero::comm::make_mpi_communicator(zero::comm::MpiCommunicatorOptions{.piece_bytes = 1 << 20});
  const int n = comm->world_size();
  if (n < 2) GTEST_SKIP() << "one rank: no reduction";
  const std::size_t total = (std::size_t{64} << 20) / sizeof(float);
  std::vector<float> buf(total, 1.0f), out(total / static_cast<std::size_t>(n));
  for (int kind = 0; kind < 2; ++kind) {
    comm->barrier()->wait();
    zero::test::reset_resident_peak();
    const long before = static_cast<long>(zero::test::status_kib("VmRSS:"));
    if (kind == 0) {
      comm->reduce_scatter(buf.data(), out.data(), out.size(), DType::kFloat32)->wait();
    } else {
      comm->all_reduce(buf.data(), total, DType::kFloat32)->wait();
    }
    const long grew_kib = static_cast<long>(zero::test::status_kib("VmHWM:")) - before;
    EXPECT_LT(grew_kib, 8 * 1024) << (kind == 0 ? "reduce_scatter" : "all_reduce") << " of 64 MiB raised rank "
                                  << comm->rank() << "'s peak by " << grew_kib / 1024 << " MiB";
  }
  EXPECT_EQ(out[0], static_cast<float>(n));
}

TEST_F(MpiCommunicatorTest, BadArgumentsThrowBeforeAnythingIsSent) {
  std::vector<float> v(4 * static_cast<std::size_t>(n_) + 4);
  EXPECT_THROW(comm_->broadcast(v.data(), 4, DType::kFloat32, {n_}), zero::Error);
  EXPECT_THROW(comm_->broadcast(v.data(), 4, DType::kFloat32, {-1}), zero::Error);
  EXPECT_THROW(comm_->all_reduce(nullptr, 4, DType::kFloat32), zero::Error);
  // Overlapping, but not at this rank's slot.
  EXPECT_THROW(comm_->reduce_scatter(v.data(), v.data() + 4 * r_ + 1, 4, DType::kFloat32),
               zero::Error);
  EXPECT_THROW(comm_->all_gather(v.data() + 4 * r_ + 1, v.data(), 4, DType::kFloat32), zero::Error);
  EXPECT_EQ(comm_->stats().total_calls(), 0u);
  comm_->barrier()->wait();  // every rank is still in step
}

TEST(MpiCheck, TurnsAnErrorCodeIntoZeroErrorWithCallAndLocation) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int x = 0;
  try {
    ZERO_MPI_CHECK(MPI_Send(&x, -1, MPI_INT, 0, 0, comm));  // a negative count fails locally
    FAIL() << "expected an error";
  } catch (const zero::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("MPI_Send(&x, -1, MPI_INT, 0, 0, comm)"), std::string::npos) << what;
    EXPECT_NE(what.find("MPI_ERR_COUNT"), std::string::npos) << what;
    EXPECT_NE(what.find("mpi_communicator_test.cpp:"), std::string::npos) << what;
  }
  MPI_Comm_free(&comm);
}

}  // namespace
