// NVMe offload (offload_optimizer.device "nvme", ZeRO-Infinity's optimizer
// tier) against the CPU offload it must equal: the same kernels step the same
// values, only where the master and moments live between steps differs, so
// every loss and every final parameter is bitwise the CPU offload's. Small
// sub_group_size values cut the partition into many pieces, so that the
// read-ahead / write-behind pipeline wraps its buffers many times in a step.
// Also: the state is in the file and not in host memory (ledger, file size,
// zero-estimate), checkpoints move between the two tiers, and bad folders
// are named.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "shared_temp_dir.h"
#include "train_loop.h"
#include "zero/comm/communicator.h"
#include "zero/engine/engine.h"
#include "zero/zero/memory_estimate.h"

namespace zero::test {
namespace fs = std::filesystem;
namespace {

constexpr int kSteps = 8;

// A folder of this job's own, the same on every rank.
fs::path job_dir(comm::Communicator& comm, const std::string& what) {
  return shared_temp_dir(comm, "zero_nvme_", what);
}

struct NvmeCase {
  const char* name;
  ModelKind kind;
  int stage;
  bool bf16 = false, dpu = false, adagrad = false;
  int accumulation = 1;
  std::int64_t sub_group = 100;  // elements per piece at most
  int buffers = 2;
};

config::Config make(const NvmeCase& c, int world, const std::string& device, const fs::path& dir) {
  config::Config cfg = make_config(c.stage, true, c.bf16, world, kGlobalBatch / c.accumulation / world, c.accumulation);
  auto& oo = cfg.zero_optimization.offload_optimizer;
  oo.device = device;
  oo.nvme_path = device == "nvme" ? dir.string() : "";
  oo.buffer_count = c.buffers;
  oo.delayed_param_update = c.dpu;
  oo.delayed_param_update_warmup_steps = 2;
  cfg.zero_optimization.sub_group_size = c.sub_group;
  if (c.adagrad) {
    cfg.optimizer.type = "Adagrad";
    cfg.optimizer.weight_decay = 0.0f;
    cfg.optimizer.initial_accumulator_value = 0.1f;  // (the swap file's initial sum is checked too)
  }
  return cfg;
}

void expect_bitwise(const RunResult& got, const RunResult& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (std::size_t i = 0; i < got.losses.size(); ++i) EXPECT_EQ(got.losses[i], want.losses[i]) << "step " << i;
  ASSERT_EQ(got.params.size(), want.params.size());
  for (std::size_t i = 0; i < got.params.size(); ++i) {
    EXPECT_TRUE(got.params[i].equal(want.params[i]))
        << "parameter " << i << " max diff " << (got.params[i] - want.params[i]).abs().max().item<float>();
  }
}

class NvmeOffload : public testing::TestWithParam<NvmeCase> {};

TEST_P(NvmeOffload, TrainsBitwiseLikeTheCpuOffload) {
  const NvmeCase& c = GetParam();
  comm::Communicator& comm = world_comm();
  const fs::path dir = job_dir(comm, c.name);
  const RunResult cpu = train(c.kind, make(c, comm.world_size(), "cpu", dir), comm, kSteps);
  const RunResult nvme = train(c.kind, make(c, comm.world_size(), "nvme", dir), comm, kSteps,
                               [&](int step, Engine& engine) {
                                 if (step != 1) return;
                                 // The state is in this rank's swap file, not in host memory.
                                 const auto s = engine.ledger().snapshot();
                                 EXPECT_EQ(s.bytes(memory::Tier::kHost, memory::Kind::kFp32Master), 0);
                                 EXPECT_EQ(s.bytes(memory::Tier::kHost, memory::Kind::kMoments), 0);
                                 EXPECT_GT(s.bytes(memory::Tier::kNvme, memory::Kind::kFp32Master), 0);
                                 // Unlinked at once; its lock is there while the engine lives.
                                 const fs::path file =
                                     dir / ("zerocpp-optimizer-rank" + std::to_string(comm.rank()) + ".swap");
                                 EXPECT_FALSE(fs::exists(file));
                                 EXPECT_TRUE(fs::exists(file.string() + ".lock"));
                               });
  expect_bitwise(nvme, cpu);
  comm.barrier()->wait();
  // The engine removed its lock when it went.
  EXPECT_FALSE(fs::exists(dir / ("zerocpp-optimizer-rank" + std::to_string(comm.rank()) + ".swap.lock")));
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, NvmeOffload,
    testing::Values(NvmeCase{"stage1_mlp", ModelKind::kMlp, 1},
                    NvmeCase{"stage2_transformer", ModelKind::kTransformer, 2, false, false, false, 2, 64, 3},
                    NvmeCase{"stage2_bf16_dpu", ModelKind::kMlp, 2, true, true},
                    NvmeCase{"stage2_fp32_dpu_accum", ModelKind::kTransformer, 2, false, true, false, 2, 200, 4},
                    NvmeCase{"stage2_adagrad", ModelKind::kMlp, 2, false, false, true},
                    NvmeCase{"stage3_units", ModelKind::kUnitMlp, 3, false, false, false, 1, 64, 2},
                    NvmeCase{"stage3_bf16_dpu", ModelKind::kUnitMlp, 3, true, true, false, 1, 1000000000, 2}),
    [](const testing::TestParamInfo<NvmeCase>& i) { return std::string(i.param.name); });

// zero-estimate's plan for NVMe is what the engine holds, tier by tier.
TEST(NvmeOffloadMemory, MatchesTheEstimate) {
  comm::Communicator& comm = world_comm();
  const fs::path dir = job_dir(comm, "estimate");
  NvmeCase c{"estimate", ModelKind::kTransformer, 2, true, true, false, 1, 300, 3};
  const config::Config cfg = make(c, comm.world_size(), "nvme", dir);
  auto model = make_model(c.kind);
  std::vector<std::int64_t> numels;
  for (const auto& p : model->parameters()) numels.push_back(p.numel());
  Engine engine(model, cfg, comm);
  EstimateInput in;
  in.params = engine.num_parameters();
  in.param_numels = numels;
  in.world = comm.world_size();
  in.stage = 2;
  in.offload = in.nvme = in.dpu = true;
  in.nvme_buffers = 3;
  in.sub_group_elements = 300;
  in.bucket_numel = cfg.zero_optimization.reduce_bucket_size;
  const MemoryEstimate e = estimate_memory(in);
  const auto s = engine.ledger().snapshot();
  if (comm.rank() == comm.world_size() - 1) {  // the estimate is the last rank's
    EXPECT_EQ(s.tier_current[static_cast<int>(memory::Tier::kNvme)], e.nvme_total());
    EXPECT_EQ(s.bytes(memory::Tier::kNvme, memory::Kind::kFp32Master), e.nvme_master);
    EXPECT_EQ(s.bytes(memory::Tier::kHost, memory::Kind::kStaging), e.host_staging);
    EXPECT_EQ(s.bytes(memory::Tier::kHost, memory::Kind::kGrads), e.host_grads);
  }
  EXPECT_EQ(s.bytes(memory::Tier::kHost, memory::Kind::kFp32Master), 0);
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);  // (the engine lives on a moment: its lock goes with the folder)
}

// A checkpoint does not say where the state lived: a run saved with the
// state on NVMe resumes with it in host memory and the other way round,
// bitwise like the unbroken run.
TEST(NvmeOffloadCheckpoint, MovesBetweenNvmeAndHostMemory) {
  comm::Communicator& comm = world_comm();
  const fs::path dir = job_dir(comm, "ckpt");
  const int world = comm.world_size();
  NvmeCase c{"ckpt", ModelKind::kMlp, 2, false, true, false, 1, 96, 2};
  const RunResult unbroken = train(c.kind, make(c, world, "cpu", dir), comm, kSteps);
  for (const auto& [save_on, load_on] : {std::pair<std::string, std::string>{"nvme", "cpu"}, {"cpu", "nvme"}}) {
    SCOPED_TRACE("saved with " + save_on + ", loaded with " + load_on);
    const std::string tag = "from_" + save_on;
    // The first half, saving at its end.
    {
      auto model = make_model(c.kind);
      Engine engine(model, make(c, world, save_on, dir), comm);
      for (int step = 0; step < kSteps / 2; ++step) {
        GlobalBatch gb = global_batch(c.kind, step);
        const int micro = kGlobalBatch / world;
        at::Tensor loss = micro_loss(c.kind, *model, gb.x.narrow(0, comm.rank() * micro, micro),
                                     gb.y.narrow(0, comm.rank() * micro, micro), engine.dtype());
        engine.backward(loss);
        engine.step();
      }
      engine.save_checkpoint((dir / "ckpt").string(), tag);
    }
    RunResult second = train(c.kind, make(c, world, load_on, dir), comm, kSteps / 2, [&](int step, Engine& engine) {
      if (step == 0) engine.load_checkpoint((dir / "ckpt").string(), tag);
    });
    for (int i = 0; i < kSteps / 2; ++i) {
      EXPECT_EQ(second.losses[static_cast<std::size_t>(i)], unbroken.losses[static_cast<std::size_t>(i + kSteps / 2)])
          << "step " << i + kSteps / 2;
    }
    for (std::size_t i = 0; i < unbroken.params.size(); ++i) {
      EXPECT_TRUE(second.params[i].equal(unbroken.params[i])) << "parameter " << i;
    }
  }
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

TEST(NvmeOffloadErrors, BadFoldersAreNamed) {
  comm::Communicator& comm = world_comm();
  const fs::path dir = job_dir(comm, "errors");
  NvmeCase c{"errors", ModelKind::kMlp, 2};
  auto expect_error = [&](const config::Config& cfg, const std::string& needle) {
    auto model = make_model(c.kind);
    try {
      Engine engine(model, cfg, comm);
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // A folder that does not exist.
  expect_error(make(c, comm.world_size(), "nvme", dir / "missing"), "mkdir -p");
  // A file where the folder should be.
  if (comm.rank() == 0) {
    std::FILE* f = std::fopen((dir / "a_file").c_str(), "w");
    std::fclose(f);
  }
  comm.barrier()->wait();
  expect_error(make(c, comm.world_size(), "nvme", dir / "a_file"), "is a file, not a folder");
  // Two engines given one folder: the second is refused, the first's state
  // is untouched.
  {
    auto model = make_model(c.kind);
    Engine first(model, make(c, comm.world_size(), "nvme", dir), comm);
    expect_error(make(c, comm.world_size(), "nvme", dir), "in use by another");
  }
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

}  // namespace
}  // namespace zero::test
