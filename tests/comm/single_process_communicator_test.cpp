#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "typed_buffer.h"
#include "zero/comm/communicator.h"
#include "zero/comm/launcher_env.h"
#include "zero/core/error.h"
#include "zero/core/shard.h"

namespace {

using zero::DType;
using zero::comm::CollectiveKind;
using zero::comm::make_single_process_communicator;
using zero::comm::ReduceOp;
using zero::comm::testing::kAllDTypes;
using zero::comm::testing::TypedBuffer;

constexpr std::size_t kSizes[] = {0, 1, 7, 1000, 1001};

float value(std::size_t i) { return static_cast<float>(i % 9) * 0.25f - 1.0f; }

TEST(SingleProcessCommunicator, Identity) {
  auto comm = make_single_process_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(comm->local_rank(), 0);
  EXPECT_EQ(comm->backend_name(), "single");
}

TEST(SingleProcessCommunicator, EveryOpIsTheIdentityAndCountsZeroBytes) {
  auto comm = make_single_process_communicator();
  for (DType dtype : kAllDTypes) {
    for (std::size_t n : kSizes) {
      SCOPED_TRACE(std::string(zero::dtype_name(dtype)) + " n=" + std::to_string(n));
      TypedBuffer a(dtype, n);
      for (std::size_t i = 0; i < n; ++i) a.set(i, value(i));

      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        auto work = comm->all_reduce(a.data(), n, dtype, {op});
        EXPECT_TRUE(work->is_completed());
        work->wait();
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(a.get(i), value(i));
      }

      // Out of place and in place (output == input + 0 * n).
      TypedBuffer out(dtype, n);
      comm->reduce_scatter(a.data(), out.data(), n, dtype)->wait();
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out.get(i), value(i));
      comm->reduce_scatter(a.data(), a.data(), n, dtype, {ReduceOp::kMax})->wait();
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(a.get(i), value(i));

      TypedBuffer gathered(dtype, n);
      comm->all_gather(a.data(), gathered.data(), n, dtype)->wait();
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(gathered.get(i), value(i));
      comm->all_gather(gathered.data(), gathered.data(), n, dtype)->wait();
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(gathered.get(i), value(i));

      comm->broadcast(a.data(), n, dtype)->wait();
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(a.get(i), value(i));
    }
  }
  comm->barrier()->wait(std::chrono::milliseconds(0));
  const auto& s = comm->stats();
  const std::uint64_t per_kind = std::size(kAllDTypes) * std::size(kSizes);
  EXPECT_EQ(s.calls_of(CollectiveKind::kAllReduce), 2 * per_kind);
  EXPECT_EQ(s.calls_of(CollectiveKind::kReduceScatter), 2 * per_kind);
  EXPECT_EQ(s.calls_of(CollectiveKind::kAllGather), 2 * per_kind);
  EXPECT_EQ(s.calls_of(CollectiveKind::kBroadcast), per_kind);
  EXPECT_EQ(s.calls_of(CollectiveKind::kBarrier), 1u);
  EXPECT_EQ(s.total_bytes(), 0u);
  comm->reset_stats();
  EXPECT_EQ(comm->stats_snapshot().total_calls(), 0u);
}

TEST(SingleProcessCommunicator, PaddedShardRoundTrip) {
  // With one rank the shard is the whole padded buffer; align pads it.
  auto comm = make_single_process_communicator();
  const zero::ShardInfo s = zero::shard_of(1001, 1, 0, /*align=*/16);
  ASSERT_EQ(s.padded_numel, 1008u);
  TypedBuffer buf(DType::kBFloat16, s.padded_numel);
  for (std::size_t i = 0; i < s.numel; ++i) buf.set(i, value(i));
  comm->reduce_scatter(buf.data(), buf.at(s.offset), s.per_rank, DType::kBFloat16)->wait();
  comm->all_gather(buf.at(s.offset), buf.data(), s.per_rank, DType::kBFloat16)->wait();
  for (std::size_t i = 0; i < s.padded_numel; ++i)
    ASSERT_EQ(buf.get(i), i < s.numel ? value(i) : 0.0f);
}

TEST(SingleProcessCommunicator, BadArgumentsAreErrors) {
  auto comm = make_single_process_communicator();
  std::vector<float> v(8);
  EXPECT_THROW(comm->broadcast(v.data(), 8, DType::kFloat32, {/*root=*/1}), zero::Error);
  EXPECT_THROW(comm->all_reduce(nullptr, 8, DType::kFloat32), zero::Error);
  // Overlapping but not in place.
  EXPECT_THROW(comm->reduce_scatter(v.data(), v.data() + 1, 4, DType::kFloat32), zero::Error);
  EXPECT_THROW(comm->all_gather(v.data() + 2, v.data(), 4, DType::kFloat32), zero::Error);
  // Null with nothing to move is fine.
  comm->all_reduce(nullptr, 0, DType::kFloat32)->wait();
  comm->all_gather(nullptr, nullptr, 0, DType::kBFloat16)->wait();
}

// Sets or clears environment variables for one test, restoring them after.
class ScopedEnv {
 public:
  void set(const char* name, const char* value) {
    remember(name);
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    for (auto& [name, old] : saved_) {
      if (old) {
        setenv(name.c_str(), old->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  void remember(const char* name) {
    const char* old = std::getenv(name);
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

constexpr const char* kLauncherVars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                         "SLURM_PROCID", "ZERO_COMM_BACKEND"};

TEST(MakeCommunicator, WithoutALauncherPicksTheSingleProcessBackend) {
  ScopedEnv env;
  for (const char* var : kLauncherVars) env.set(var, nullptr);
  EXPECT_EQ(zero::comm::default_backend_name(), "single");
  EXPECT_EQ(zero::comm::make_communicator()->backend_name(), "single");
}

TEST(MakeCommunicator, LauncherVariablesPickMpi) {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"}) {
    ScopedEnv env;
    for (const char* v : kLauncherVars) env.set(v, nullptr);
    env.set(var, "1");
    EXPECT_EQ(zero::comm::default_backend_name(), "mpi") << var;
  }
}

TEST(MakeCommunicator, EnvironmentOverride) {
  ScopedEnv env;
  for (const char* v : kLauncherVars) env.set(v, nullptr);
  env.set("OMPI_COMM_WORLD_SIZE", "1");
  env.set("SLURM_PROCID", "0");  // (an sbatch script's own shell)
  env.set("ZERO_COMM_BACKEND", "single");
  EXPECT_EQ(zero::comm::make_communicator()->backend_name(), "single");
  // One of several processes a launcher started: "single" would make each a
  // job of its own.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    ScopedEnv launched;
    launched.set("OMPI_COMM_WORLD_SIZE", nullptr);
    launched.set(var, "3");
    try {
      zero::comm::default_backend_name();
      ADD_FAILURE() << "ZERO_COMM_BACKEND=single under a launcher of 3 (" << var << ") was accepted";
    } catch (const zero::Error& e) {
      EXPECT_NE(std::string(e.what()).find("ZERO_COMM_BACKEND=single, but the launcher started this process as one of "
                                           "3 (" + std::string(var) + "=3)"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("Unset ZERO_COMM_BACKEND"), std::string::npos) << e.what();
    }
  }
  env.set("ZERO_COMM_BACKEND", "nccl");
  try {
    zero::comm::default_backend_name();
    FAIL() << "expected an error";
  } catch (const zero::Error& e) {
    EXPECT_NE(std::string(e.what()).find("ZERO_COMM_BACKEND"), std::string::npos) << e.what();
  }
}

constexpr const char* kLocalRankVars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                           "MPI_LOCALRANKID", "LOCAL_RANK"};

TEST(LauncherEnv, LocalRankFromEachLauncherInOrder) {
  ScopedEnv env;
  for (const char* v : kLocalRankVars) env.set(v, nullptr);
  EXPECT_FALSE(zero::comm::launcher_local_rank().has_value());
  int expected = 7;
  for (const char* var : kLocalRankVars) {
    ScopedEnv one;
    one.set(var, std::to_string(expected).c_str());
    EXPECT_EQ(zero::comm::launcher_local_rank(), expected) << var;
    ++expected;
  }
  // The first one set wins: Open MPI's over SLURM's.
  env.set("SLURM_LOCALID", "3");
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  EXPECT_EQ(zero::comm::launcher_local_rank(), 1);
}

TEST(LauncherEnv, LocalSize) {
  ScopedEnv env;
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MPI_LOCALNRANKS",
                        "LOCAL_WORLD_SIZE"}) {
    env.set(v, nullptr);
  }
  EXPECT_FALSE(zero::comm::launcher_local_size().has_value());
  env.set("SLURM_NTASKS_PER_NODE", "4");
  EXPECT_EQ(zero::comm::launcher_local_size(), 4);
}

TEST(LauncherEnv, GarbageIsAnErrorNamingTheVariable) {
  ScopedEnv env;
  for (const char* v : kLocalRankVars) env.set(v, nullptr);
  for (const char* bad : {"x", "-1", "1.5", "2(x2)", "99999999999"}) {
    env.set("SLURM_LOCALID", bad);
    try {
      zero::comm::launcher_local_rank();
      FAIL() << "expected an error for " << bad;
    } catch (const zero::Error& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_LOCALID"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
