// Parameters on NVMe (offload_param.device "nvme", ZeRO-Infinity's
// parameter tier) against the parameter offload to host memory it must
// equal: the same values go through a swap file instead of a host tensor,
// so every loss and every final parameter is bitwise offload_param "cpu"'s.
// The cases gather units of every shape (a unit called twice, a parameter
// of two units, a model with no unit), publish through the delayed update,
// accumulation and a device share (Twin-Flow: a bucket's chunk written in two
// parts), with two buffers (every gather evicts) and with the deferred
// gather lane (a buffer reused before the lane's copy out of it would read
// the next chunk). Also: the partition is in the file and not in host
// memory (the ledger; zero-estimate's figures are in estimate_test), the gathers are read ahead, checkpoints
// move between NVMe and host memory (streamed: a save or load does not hold
// the partition), and a bad folder is named.
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ops/randn.h>
#include <torch/nn/modules/linear.h>

#include <gtest/gtest.h>

#include "checkpoint_memory.h"
#include "shared_temp_dir.h"
#include "train_loop.h"
#include "zero/ckpt/shard_io.h"
#include "zero/comm/communicator.h"
#include "zero/engine/engine.h"

namespace zero::test {
namespace fs = std::filesystem;
namespace {

constexpr int kSteps = 6;

struct ParamNvmeCase {
  const char* name;
  ModelKind kind;
  bool bf16 = false, dpu = false;
  std::string optimizer = "cpu";  // offload_optimizer.device
  int accumulation = 1;
  int buffers = 2;       // offload_param.buffer_count
  float ratio = 1.0f;    // offload_optimizer.ratio
  bool deferred = false;  // ZERO_TEST_DEFERRED_GATHERS
};

config::Config make(const ParamNvmeCase& c, int world, const std::string& params, const fs::path& dir) {
  config::Config cfg = make_config(3, true, c.bf16, world, kGlobalBatch / c.accumulation / world, c.accumulation);
  auto& oo = cfg.zero_optimization.offload_optimizer;
  oo.device = c.optimizer;
  oo.nvme_path = c.optimizer == "nvme" ? (dir / "optimizer").string() : "";
  oo.delayed_param_update = c.dpu;
  oo.delayed_param_update_warmup_steps = 1;
  oo.ratio = c.ratio;
  cfg.zero_optimization.sub_group_size = 64;
  auto& op = cfg.zero_optimization.offload_param;
  op.device = params;
  op.nvme_path = params == "nvme" ? dir.string() : "";
  op.buffer_count = c.buffers;
  return cfg;
}

fs::path swap_path(const fs::path& dir, int rank) {
  return dir / ("zerocpp-params-rank" + std::to_string(rank) + ".swap");
}

class ParamNvme : public testing::TestWithParam<ParamNvmeCase> {};

TEST_P(ParamNvme, TrainsBitwiseLikeTheHostPartition) {
  const ParamNvmeCase& c = GetParam();
  comm::Communicator& comm = world_comm();
  const fs::path dir = shared_temp_dir(comm, "zero_param_nvme_", c.name);
  if (comm.rank() == 0) fs::create_directories(dir / "optimizer");
  comm.barrier()->wait();
  if (c.deferred) ::setenv("ZERO_TEST_DEFERRED_GATHERS", "1", 1);
  const RunResult host = train(c.kind, make(c, comm.world_size(), "cpu", dir), comm, kSteps);
  const RunResult nvme = train(c.kind, make(c, comm.world_size(), "nvme", dir), comm, kSteps,
                               [&](int step, Engine& engine) {
                                 if (step != 1) return;
                                 // The partition is in this rank's swap file, not in host memory.
                                 const auto s = engine.ledger().snapshot();
                                 EXPECT_EQ(s.bytes(memory::Tier::kHost, memory::Kind::kHalfParams), 0);
                                 EXPECT_GT(s.bytes(memory::Tier::kNvme, memory::Kind::kHalfParams), 0);
                                 EXPECT_FALSE(fs::exists(swap_path(dir, comm.rank())));  // unlinked at once
                                 EXPECT_TRUE(fs::exists(swap_path(dir, comm.rank()).string() + ".lock"));
                                 // Frozen weights of units: partitioned in host memory, not in the file.
                                 if (c.kind == ModelKind::kLoraMlp) {
                                   EXPECT_GT(s.bytes(memory::Tier::kHost, memory::Kind::kFrozen), 0);
                                 }
                               });
  ::unsetenv("ZERO_TEST_DEFERRED_GATHERS");
  ASSERT_EQ(nvme.losses.size(), host.losses.size());
  for (std::size_t i = 0; i < host.losses.size(); ++i) EXPECT_EQ(nvme.losses[i], host.losses[i]) << "step " << i;
  ASSERT_EQ(nvme.params.size(), host.params.size());
  for (std::size_t i = 0; i < host.params.size(); ++i) {
    EXPECT_TRUE(nvme.params[i].equal(host.params[i]))
        << "parameter " << i << " max diff " << (nvme.params[i] - host.params[i]).abs().max().item<float>();
  }
  // Units are gathered every step: chunks are read, and from the second
  // step on they follow the first's order and are read ahead (with two
  // buffers, at least one). (Without units every bucket stays gathered, and
  // the buffers may hold them all: nothing to read.)
  const bool units = c.kind == ModelKind::kUnitMlp || c.kind == ModelKind::kLoraMlp;
  for (int step = 1; step < kSteps && units; ++step) {
    const StepStats& s = nvme.stats[static_cast<std::size_t>(step)];
    EXPECT_GT(s.param_chunks_read, 0) << "step " << step;
    EXPECT_GT(s.param_chunks_read_ahead, 0) << "step " << step;
    EXPECT_LE(s.param_chunks_read_ahead, s.param_chunks_read);
  }
  EXPECT_EQ(host.stats.back().param_chunks_read, 0);
  comm.barrier()->wait();
  EXPECT_FALSE(fs::exists(swap_path(dir, comm.rank()).string() + ".lock"));  // removed with the engine
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ParamNvme,
    testing::Values(ParamNvmeCase{"units_fp32", ModelKind::kUnitMlp},
                    ParamNvmeCase{"units_bf16_dpu_all_on_nvme", ModelKind::kUnitMlp, true, true, "nvme", 1, 3},
                    ParamNvmeCase{"tied_accumulation", ModelKind::kTiedMlp, false, false, "cpu", 2, 5},
                    ParamNvmeCase{"no_units_transformer_dpu", ModelKind::kTransformer, false, true, "cpu", 1, 2},
                    ParamNvmeCase{"units_device_share", ModelKind::kUnitMlp, false, false, "cpu", 1, 2, 0.5f},
                    ParamNvmeCase{"units_deferred_lane", ModelKind::kUnitMlp, true, false, "cpu", 1, 2, 1.0f, true},
                    ParamNvmeCase{"adapters_bf16_dpu_deferred_lane", ModelKind::kLoraMlp, true, true, "cpu", 1, 2,
                                  1.0f, true}),
    [](const testing::TestParamInfo<ParamNvmeCase>& i) { return std::string(i.param.name); });

// A checkpoint does not say where the partition lived: saved with the
// parameters on NVMe and a delayed update pending, resumed with them in host
// memory, and the other way round, and saved asynchronously with steps
// after it, bitwise like the unbroken run. With the optimizer's state in
// host memory an async save reads the chunks into copies of its own (the
// steps' publishes must not reach them); with it on NVMe too the chunks
// stream from the swap file like the state, and the next step waits for
// them before its publish rewrites the file.
TEST(ParamNvmeCheckpoint, MovesBetweenNvmeAndHostMemory) {
  comm::Communicator& comm = world_comm();
  const fs::path dir = shared_temp_dir(comm, "zero_param_nvme_", "ckpt");
  if (comm.rank() == 0) fs::create_directories(dir / "optimizer");
  comm.barrier()->wait();
  const int world = comm.world_size();
  for (const std::string optimizer : {"cpu", "nvme"}) {
    SCOPED_TRACE("optimizer on " + optimizer);
    const ParamNvmeCase c{"ckpt", ModelKind::kUnitMlp, true, true, optimizer, 1, 2};
    const RunResult unbroken = train(c.kind, make(c, world, "cpu", dir), comm, kSteps);
    for (const SaveLoadWay& way : {SaveLoadWay{"nvme", "cpu", false}, SaveLoadWay{"cpu", "nvme", false}, SaveLoadWay{"nvme", "nvme", true}}) {
      SCOPED_TRACE(way.trace());
      expect_save_resume_like(c.kind, make(c, world, way.save_on, dir), make(c, world, way.load_on, dir), comm, kSteps,
                              (dir / "ckpt").string(), way.tag() + "_" + optimizer, way.async, unbroken,
                              optimizer == "nvme" ? 0.5 : 0.0, 1500);
    }
  }
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

// Saved in fp32, loaded in bf16: the parameters come from the master
// weights, read from the optimizer's swap file a chunk at a time into the
// parameters' swap file; the run goes on bitwise like one that loaded the
// same checkpoint with both in host memory.
TEST(ParamNvmeCheckpoint, AnotherPrecisionLoadsFromTheMasterWeights) {
  comm::Communicator& comm = world_comm();
  const fs::path dir = shared_temp_dir(comm, "zero_param_nvme_", "precision");
  if (comm.rank() == 0) fs::create_directories(dir / "optimizer");
  comm.barrier()->wait();
  const int world = comm.world_size();
  const ParamNvmeCase fp32{"fp32", ModelKind::kUnitMlp, false, false, "nvme", 1, 2};
  save_after(fp32.kind, make(fp32, world, "nvme", dir), comm, kSteps / 2, (dir / "ckpt").string(), "fp32", false);
  ParamNvmeCase bf16 = fp32;
  bf16.bf16 = true;
  const RunResult nvme = resume_from(bf16.kind, make(bf16, world, "nvme", dir), comm, kSteps / 2, (dir / "ckpt").string(), "fp32");
  bf16.optimizer = "cpu";
  const RunResult host = resume_from(bf16.kind, make(bf16, world, "cpu", dir), comm, kSteps / 2, (dir / "ckpt").string(), "fp32");
  expect_resumed_like(nvme, host, 0);
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

// A save streams the partition from the swap file into the checkpoint's
// file, and a load streams it back into another engine's swap file: the
// process's peak resident memory grows by the save's I/O blocks (the file's
// ring, and the two blocks streamed sections go through: 48 MiB whatever
// the model), not by the partition; the loaded engine computes what the
// saved one does, bitwise.
TEST(ParamNvmeCheckpoint, StreamsThePartitionWithoutHoldingIt) {
  comm::Communicator& comm = world_comm();
  const fs::path dir = shared_temp_dir(comm, "zero_param_nvme_", "stream");
  const int world = comm.world_size();
  auto config = [&](const fs::path& swap) {
    config::Config cfg = make_config(3, true, false, world, 1, 1);
    cfg.zero_optimization.reduce_bucket_size = 1 << 21;  // (no unit: buckets of this many elements)
    auto& op = cfg.zero_optimization.offload_param;
    op.device = "nvme";
    op.nvme_path = swap.string();
    op.buffer_count = 2;
    return cfg;
  };
  // 25M parameters: a 100 MB partition on one rank, 50 MB on each of two.
  auto model = big_linear();
  Engine engine(model, config(dir), comm);
  big_linear_step(engine, *model, 8 + comm.rank());
  const std::int64_t partition_bytes = 4 * (engine.num_parameters() + world - 1) / world;
  const auto io_blocks = static_cast<std::int64_t>((ckpt::kIoRing + 2) * ckpt::kIoBlock);
  const std::int64_t grew = peak_rss_growth([&] { engine.save_checkpoint((dir / "ckpt").string(), "big"); });
  ASSERT_GE(grew, 0) << "cannot reset the peak RSS (/proc/self/clear_refs)";
  RecordProperty("save_peak_rss_growth", std::to_string(grew));
  if (kRssMeasures) {
    EXPECT_LT(grew, io_blocks + partition_bytes / 4) << "the save held " << grew << " more bytes at its peak; the "
                                                     << "partition is " << partition_bytes << " bytes";
  }
  const fs::path second = dir / "second";
  if (comm.rank() == 0) fs::create_directories(second);
  comm.barrier()->wait();
  auto again = big_linear();
  Engine loaded(again, config(second), comm);
  big_linear_step(loaded, *again, 8 + comm.rank());
  const std::int64_t load_grew = peak_rss_growth([&] { loaded.load_checkpoint((dir / "ckpt").string(), "big"); });
  RecordProperty("load_peak_rss_growth", std::to_string(load_grew));
  if (kRssMeasures) {
    // Its read ring (kIoRing blocks) is first touched here or reused from
    // the save's, as the allocator pleases: allowed for, like the save's.
    EXPECT_LT(load_grew, io_blocks + partition_bytes / 4) << "the load held " << load_grew << " more bytes at its peak";
  }
  torch::manual_seed(9);
  const at::Tensor x = torch::randn({2, 4096});
  const at::Tensor want = model->forward(x), got = again->forward(x);
  EXPECT_TRUE(got.equal(want)) << "the loaded parameters compute otherwise: max diff "
                               << (got - want).abs().max().item<float>();
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

TEST(ParamNvmeErrors, AreNamed) {
  comm::Communicator& comm = world_comm();
  const fs::path dir = shared_temp_dir(comm, "zero_param_nvme_", "errors");
  const ParamNvmeCase c{"errors", ModelKind::kUnitMlp};
  auto expect_error = [&](const config::Config& cfg, const std::string& needle) {
    expect_engine_error(c.kind, cfg, comm, needle);
  };
  // The folder's errors name the parameters' key, not the optimizer's.
  expect_error(make(c, comm.world_size(), "nvme", dir / "missing"), "or name another in offload_param.nvme_path");
  config::Config no_offload = make(c, comm.world_size(), "nvme", dir);
  no_offload.zero_optimization.offload_optimizer.device = "none";
  expect_error(no_offload, "offload_param.device=\"nvme\" needs the optimizer on the CPU");
  // Two engines given one folder: the second is refused.
  {
    auto model = make_model(c.kind);
    Engine first(model, make(c, comm.world_size(), "nvme", dir), comm);
    expect_error(make(c, comm.world_size(), "nvme", dir), "in use by another");
  }
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

// offload_param.pin_memory on the CPU is named as having no effect (rank 0).
TEST(ParamNvmeConfig, PinMemoryOnTheCpuIsNamed) {
  comm::Communicator& comm = world_comm();
  const fs::path dir = shared_temp_dir(comm, "zero_param_nvme_", "pin");
  const ParamNvmeCase c{"pin", ModelKind::kUnitMlp};
  config::Config cfg = make(c, comm.world_size(), "nvme", dir);
  cfg.zero_optimization.offload_param.pin_memory = true;
  testing::internal::CaptureStderr();
  {
    auto model = make_model(c.kind);
    Engine engine(model, cfg, comm);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  if (comm.rank() == 0) {
    EXPECT_NE(err.find("offload_param.pin_memory has no effect on the CPU"), std::string::npos) << err;
  }
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

}  // namespace
}  // namespace zero::test
