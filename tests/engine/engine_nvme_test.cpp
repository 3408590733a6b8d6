// NVMe offload (offload_optimizer.device "nvme", ZeRO-Infinity's optimizer
// tier) against the CPU offload it must equal: the same kernels step the same
// values, only where the master and moments live between steps differs, so
// every loss and every final parameter is bitwise the CPU offload's. Small
// sub_group_size values cut the partition into many pieces, so that the
// read-ahead / write-behind pipeline wraps its buffers many times in a step.
// Also: the state is in the file and not in host memory (ledger, file size,
// zero-estimate), checkpoints move between the two tiers, and bad folders
// are named.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint_memory.h"
#include "shared_temp_dir.h"
#include "train_loop.h"
#include "zero/comm/communicator.h"
#include "zero/core/log.h"
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
  bool decay_rule = false;  // EngineOptions' rules: below 2-D no decay, twice the rate
  const char* optimizer = nullptr;  // another optimizer.type than make_config's AdamW
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
  if (c.optimizer != nullptr) {
    cfg.optimizer.type = c.optimizer;
    cfg.optimizer.weight_decay = 0.1f;
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
  auto options = [&] {
    EngineOptions o;
    if (c.decay_rule) {
      o.weight_decay = no_decay_below_2d();
      o.lr_scale = scale_below_2d(2.0f);
    }
    return o;
  };
  const RunResult cpu = train(c.kind, make(c, comm.world_size(), "cpu", dir), comm, kSteps, [](int, Engine&) {},
                              options());
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
                               },
                               options());
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
                    NvmeCase{"stage3_bf16_dpu", ModelKind::kUnitMlp, 3, true, true, false, 1, 1000000000, 2},
                    // Settings per parameter: runs of equal settings cut across the swapped pieces.
                    NvmeCase{"stage2_bf16_dpu_decay_rule", ModelKind::kTransformer, 2, true, true, false, 1, 64, 2,
                             true},
                    // Lion: one moment per swapped piece, as Adagrad's, stepped by its own kernel.
                    NvmeCase{"stage2_lion_bf16_dpu", ModelKind::kTransformer, 2, true, true, false, 1, 64, 2, true,
                             "Lion"}),
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
  // async: the save is written while two more steps run in the same
  // engine, its writer held back (ZERO_TEST_CKPT_WRITE_DELAY_MS) so that
  // the first of them must wait for the state streamed from the swap file
  // that it rewrites.
  for (const SaveLoadWay& way : {SaveLoadWay{"nvme", "cpu", false}, SaveLoadWay{"cpu", "nvme", false}, SaveLoadWay{"nvme", "cpu", true}}) {
    SCOPED_TRACE(way.trace());
    expect_save_resume_like(c.kind, make(c, world, way.save_on, dir), make(c, world, way.load_on, dir), comm, kSteps,
                            (dir / "ckpt").string(), way.tag(), way.async, unbroken, 0.2);
  }
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

// A save with the state on NVMe streams it from the swap file to the
// checkpoint's file, and a load back into a swap file: the process's peak
// resident memory grows by a few I/O blocks, not by the state (12 bytes per
// parameter of the partition); the file loads bitwise into an engine that
// keeps the state in host memory, whose next step is the same.
TEST(NvmeOffloadCheckpoint, StreamsTheStateWithoutHoldingIt) {
  comm::Communicator& comm = world_comm();
  const fs::path dir = job_dir(comm, "stream");
  const int world = comm.world_size();
  auto config = [&](const std::string& device) {
    config::Config cfg = make_config(2, true, false, world, 1, 1);
    cfg.zero_optimization.offload_optimizer.device = device;
    cfg.zero_optimization.offload_optimizer.nvme_path = device == "nvme" ? dir.string() : "";
    return cfg;
  };
  // 25M parameters: 300 MB of state on one rank, 150 MB on each of two.
  auto model = big_linear();
  Engine engine(model, config("nvme"), comm);
  big_linear_step(engine, *model, 8 + comm.rank());
  const std::int64_t state_bytes = 12 * (engine.num_parameters() + world - 1) / world;
  const std::int64_t grew = peak_rss_growth([&] { engine.save_checkpoint((dir / "ckpt").string(), "big"); });
  ASSERT_GE(grew, 0) << "cannot reset the peak RSS (/proc/self/clear_refs)";
  RecordProperty("save_peak_rss_growth", std::to_string(grew));
  if (kRssMeasures) {
    EXPECT_LT(grew, state_bytes / 2) << "the save held " << grew << " more bytes at its peak; the partition's state is "
                                     << state_bytes << " bytes";
  }
  // A load streams it back into another engine's swap file.
  {
    const fs::path second = dir / "second";
    if (comm.rank() == 0) fs::create_directories(second);
    comm.barrier()->wait();
    config::Config cfg = config("nvme");
    cfg.zero_optimization.offload_optimizer.nvme_path = second.string();
    auto again = big_linear();
    Engine loaded(again, cfg, comm);
    big_linear_step(loaded, *again, 8 + comm.rank());
    const std::int64_t load_grew = peak_rss_growth([&] { loaded.load_checkpoint((dir / "ckpt").string(), "big"); });
    RecordProperty("load_peak_rss_growth", std::to_string(load_grew));
    if (kRssMeasures) {
      EXPECT_LT(load_grew, state_bytes / 2) << "the load held " << load_grew << " more bytes at its peak";
    }
    const std::vector<at::Tensor> want = engine.gather_master_params(), got = loaded.gather_master_params();
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i].equal(want[i])) << "parameter " << i;
  }
  auto other = big_linear();
  Engine host(other, config("cpu"), comm);
  host.load_checkpoint((dir / "ckpt").string(), "big");
  // The master weights, and the moments through one more step of each.
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "loaded" : "one step later");
    const std::vector<at::Tensor> want = engine.gather_master_params(), got = host.gather_master_params();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i].equal(want[i])) << "parameter " << i;
    torch::manual_seed(9 + comm.rank());
    const at::Tensor x = torch::randn({1, 4096});
    engine.backward(model->forward(x).square().mean());
    engine.step();
    host.backward(other->forward(x).square().mean());
    host.step();
  }
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

// This process's optimizer swap files under `dir` (unlinked, reached through
// /proc/self/fd) set to `size` bytes; their sizes before.
std::vector<off_t> resize_optimizer_swap(const fs::path& dir, off_t size) {
  std::vector<off_t> before;
  for (const auto& fd : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = fs::read_symlink(fd.path(), ec).string();
    // (The file itself, unlinked: not its lock file beside it.)
    if (ec || target.rfind(dir.string(), 0) != 0 || target.find("zerocpp-optimizer-rank") == std::string::npos ||
        target.find(".swap (deleted)") == std::string::npos) {
      continue;
    }
    const int f = ::open(fd.path().c_str(), O_RDWR);
    if (f < 0) continue;
    before.push_back(::lseek(f, 0, SEEK_END));
    EXPECT_EQ(::ftruncate(f, size), 0) << target;
    ::close(f);
  }
  return before;
}

// A step() that fails (here the optimizer state's swap file cut short under
// it: its reads fail) leaves the engine refusing to train, and its errors
// say to load a checkpoint. That load, in the same process, recovers it:
// training then goes on as after a fresh load, bit for bit. The failed
// delayed update (its failure was rethrown by every later call, the load's
// included) and the gradients the failed step left in the window (the next
// window added to them) go with the state they belonged to.
TEST(NvmeOffloadFailure, ALoadRecoversFromAFailedStep) {
  comm::Communicator& comm = world_comm();
  if (comm.world_size() != 1) GTEST_SKIP() << "the swap file is cut on one rank: one rank";
  const fs::path dir = job_dir(comm, "failed_step");
  for (const bool dpu : {false, true}) {
    SCOPED_TRACE(dpu ? "delayed update" : "no delayed update");
    const NvmeCase c{"failed_step", ModelKind::kMlp, 2, false, dpu, false, 1, 96, 2};
    const config::Config cfg = make(c, 1, "nvme", dir);
    auto one_step = [&](Engine& e, torch::nn::Module& m, int step) {
      const GlobalBatch gb = global_batch(c.kind, step);
      e.backward(micro_loss(c.kind, m, gb.x, gb.y, e.dtype()));
      e.step();
    };
    const std::string ck = (dir / "ck").string();
    constexpr int kSave = 3, kEnd = 7;
    std::vector<at::Tensor> want;  // a fresh engine's, loaded from the save
    {
      auto model = make_model(c.kind);
      Engine e(model, cfg, comm);
      for (int s = 0; s < kSave; ++s) one_step(e, *model, s);
      e.save_checkpoint(ck, "good");
    }
    {
      auto model = make_model(c.kind);
      Engine e(model, cfg, comm);
      e.load_checkpoint(ck, "good");
      for (int s = kSave; s < kEnd; ++s) one_step(e, *model, s);
      e.flush();
      want = e.gather_master_params();
    }
    auto model = make_model(c.kind);
    Engine e(model, cfg, comm);
    for (int s = 0; s < kSave; ++s) one_step(e, *model, s);
    const std::vector<off_t> sizes = resize_optimizer_swap(dir, 0);
    ASSERT_EQ(sizes.size(), 1u) << "not one optimizer swap file of this engine under " << dir;
    bool failed = false;
    for (int s = kSave; s < kEnd && !failed; ++s) {
      try {
        one_step(e, *model, s);
      } catch (const std::exception& err) {
        failed = true;
      }
    }
    ASSERT_TRUE(failed) << "no step failed with the swap file cut short";
    // The file whole again (zeros: the load rewrites the state in it).
    resize_optimizer_swap(dir, sizes[0]);
    e.load_checkpoint(ck, "good");
    for (int s = kSave; s < kEnd; ++s) one_step(e, *model, s);
    e.flush();
    const std::vector<at::Tensor> got = e.gather_master_params();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(got[i].equal(want[i])) << "parameter " << i << " max diff "
                                         << (got[i] - want[i]).abs().max().item<float>();
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
    expect_engine_error(c.kind, cfg, comm, needle);
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

// The note on the swap file's rounding (each piece's state rounded up to
// 4096 bytes) names what bounds the pieces: sub_group_size where it cuts
// them, else reduce_bucket_size (a piece is an eighth of a rank's chunk of a
// bucket), else the model's own size (nothing to change).
TEST(NvmeOffloadNotes, TheRoundingNoteNamesWhatBoundsThePieces) {
  comm::Communicator& comm = world_comm();
  const fs::path dir = job_dir(comm, "notes");
  auto note_of = [&](std::int64_t sub_group, std::int64_t bucket) {
    NvmeCase c{"notes", ModelKind::kMlp, 2};
    c.sub_group = sub_group;
    config::Config cfg = make(c, comm.world_size(), "nvme", dir);
    cfg.zero_optimization.reduce_bucket_size = bucket;
    std::string note;
    const LogSink before = set_log_sink([&](const LogRecord& r) {
      if (std::string_view(r.text).find("rounding of the optimizer pieces") != std::string_view::npos) {
        note = std::string(r.text);
      }
    });
    {
      auto model = make_model(c.kind);
      Engine engine(model, cfg, comm);
    }
    set_log_sink(before);
    comm.barrier()->wait();
    return note;
  };
  const std::string by_sub_group = note_of(100, 500000000), by_bucket = note_of(1000000000, 256),
                    by_model = note_of(1000000000, 500000000);
  if (comm.rank() == 0) {
    EXPECT_NE(by_sub_group.find("zero_optimization.sub_group_size 100 is small): raise it"), std::string::npos)
        << by_sub_group;
    EXPECT_NE(by_bucket.find("zero_optimization.reduce_bucket_size 256 is small): raise reduce_bucket_size"),
              std::string::npos) << by_bucket;
    EXPECT_EQ(by_bucket.find("sub_group_size"), std::string::npos) << by_bucket;
    EXPECT_NE(by_model.find("the model is small"), std::string::npos) << by_model;
    EXPECT_EQ(by_model.find("raise"), std::string::npos) << by_model;
  }
  if (comm.rank() == 0) rm_tree(dir);
}

}  // namespace
}  // namespace zero::test
