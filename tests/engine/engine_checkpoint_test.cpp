// Checkpoints of the engine (docs/checkpoints.md):
//  - Resume: train k steps, save, destroy the engine; a new engine on a fresh
//    module loads and trains on: its losses and final weights equal, bit for
//    bit, those of a run that never stopped (stages 0-3, offload, the delayed
//    update with its update pending at the save, bf16, Adagrad, async save).
//  - Reshard (two jobs, see CMakeLists.txt): a job on A ranks saves, a job on
//    B ranks (and another stage) loads: the master weights equal the saved
//    ones bitwise, and training on matches the saving job's own continuation.
//  - Bad input: a damaged, truncated or missing shard, another model's
//    checkpoint, a newer format, an unwritable folder, a full disk: a clear
//    error, the engine unchanged, the earlier checkpoint still loadable.
#include <algorithm>
#include <cmath>
#include <sys/resource.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include "shared_temp_dir.h"
#include "train_loop.h"
#include "zero/ckpt/checkpoint_dir.h"
#include "zero/ckpt/manifest.h"
#include "zero/core/error.h"
#include "zero/core/log.h"
#include "zero/engine/param_rules.h"
#include "zero/version.h"

namespace zero::test {
namespace {

namespace fs = std::filesystem;

fs::path shared_temp_dir(comm::Communicator& comm, const std::string& what) {
  return test::shared_temp_dir(comm, "zero_ckpt_", what);
}

struct Trainer {
  ModelKind kind;
  config::Config cfg;
  EngineOptions options = {};
  std::shared_ptr<torch::nn::Module> model = make_model(kind);
  std::unique_ptr<Engine> engine = std::make_unique<Engine>(model, cfg, world_comm(), options);

  // Steps [from, to) of the fixed-batch loop (train_loop.h), each step's
  // global mean loss appended to `losses`.
  void steps(int from, int to, std::vector<float>& losses) {
    comm::Communicator& comm = world_comm();
    const int accum = static_cast<int>(cfg.gradient_accumulation_steps);
    const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
    for (int step = from; step < to; ++step) {
      engine->set_lr(cfg.optimizer.lr * (1.0f + 0.1f * static_cast<float>(step)));  // a schedule
      GlobalBatch gb = global_batch(kind, step);
      float sum = 0.0f;
      for (int j = 0; j < accum; ++j) {
        const int begin = j * (kGlobalBatch / accum) + comm.rank() * micro;
        at::Tensor loss = micro_loss(kind, *model, gb.x.narrow(0, begin, micro), gb.y.narrow(0, begin, micro),
                                     engine->dtype());
        engine->backward(loss);
        engine->step();
        sum += loss.item<float>();
      }
      comm.all_reduce(&sum, 1, DType::kFloat32)->wait();
      losses.push_back(sum / static_cast<float>(comm.world_size() * accum));
    }
  }
  std::vector<at::Tensor> final_params() {
    engine->flush();
    return engine->gather_master_params();
  }
};

// Each tensor bit for bit equal to its counterpart (and as many of them).
void expect_bitwise_equal(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << "param " << i;
}

// The master weights a fresh engine of `cfg` holds after loading <dir>/<tag>.
std::vector<at::Tensor> loaded_master(const config::Config& cfg, const fs::path& dir, const std::string& tag) {
  Trainer u{ModelKind::kUnitMlp, cfg};
  u.engine->load_checkpoint(dir.string(), tag);
  return u.engine->gather_master_params();
}

// A full disk on the last rank while this lives: its file size limit at
// `bytes` (write() then fails with EFBIG, as it fails with ENOSPC on a full
// disk; SIGXFSZ ignored), restored when it goes.
class LastRankFileSizeLimit {
 public:
  LastRankFileSizeLimit(comm::Communicator& comm, rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old_;
    lim.rlim_cur = bytes;
    if (comm.rank() == comm.world_size() - 1) setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~LastRankFileSizeLimit() { setrlimit(RLIMIT_FSIZE, &old_); }
  LastRankFileSizeLimit(const LastRankFileSizeLimit&) = delete;
  LastRankFileSizeLimit& operator=(const LastRankFileSizeLimit&) = delete;

 private:
  struct rlimit old_ {};
};

struct ResumeCase {
  const char* name;
  int stage;
  bool offload = false, dpu = false, bf16 = false, param_offload = false, adagrad = false, async = false;
  int accumulation = 1;
  bool fp16 = false;  // dynamic loss scaling, its window short enough to move during the run
  // offload_optimizer.ratio of the saving run, and of the loading one (-1:
  // the same). Another split sums each bucket's gradient norm in two parts:
  // the continuation then equals the unbroken run within rounding, not bit
  // for bit.
  float ratio = 1.0f, load_ratio = -1.0f;
  const char* optimizer = nullptr;  // another optimizer.type than make_config's AdamW
  bool published = false;           // offload_optimizer.publish_in_backward
};

// `rows` of the fixed global batch are trained on: a number every world size
// of the test divides.
config::Config case_config(const ResumeCase& c, int world, int rows = kGlobalBatch) {
  const int micro = rows / (world * c.accumulation);
  config::Config cfg = make_config(c.stage, c.offload, c.bf16, world, micro, c.accumulation);
  if (c.dpu) {
    cfg.zero_optimization.offload_optimizer.delayed_param_update = true;
    cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = 1;
  }
  if (c.param_offload) cfg.zero_optimization.offload_param.device = "cpu";
  if (c.published) cfg.zero_optimization.offload_optimizer.publish_in_backward = true;
  cfg.zero_optimization.offload_optimizer.ratio = c.ratio;
  if (c.fp16) {
    cfg.fp16.enabled = true;
    cfg.fp16.initial_scale_power = 8;
    cfg.fp16.loss_scale_window = 2;
  }
  if (c.adagrad) {
    cfg.optimizer.type = "Adagrad";
    cfg.optimizer.weight_decay = 0.0f;
  }
  if (c.optimizer != nullptr) {
    cfg.optimizer.type = c.optimizer;
    cfg.optimizer.weight_decay = 0.1f;
  }
  return cfg;
}

class Resume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(Resume, ContinuesBitwiseLikeAnUnbrokenRun) {
  const ResumeCase& c = GetParam();
  comm::Communicator& comm = world_comm();
  const config::Config cfg = case_config(c, comm.world_size());
  const ModelKind kind = ModelKind::kUnitMlp;
  constexpr int kSave = 3, kSteps = 6;

  std::vector<float> unbroken;
  std::vector<at::Tensor> unbroken_params;
  float unbroken_scale_at_save = 0.0f;
  StepStats unbroken_final;
  {
    Trainer t{kind, cfg};
    t.steps(0, kSave, unbroken);
    unbroken_scale_at_save = t.engine->stats().loss_scale;
    t.steps(kSave, kSteps, unbroken);
    unbroken_params = t.final_params();
    unbroken_final = t.engine->stats();
  }
  const fs::path dir = shared_temp_dir(comm, c.name);
  std::vector<float> resumed;
  {
    Trainer t{kind, cfg};
    t.steps(0, kSave, resumed);
    if (c.async) setenv("ZERO_TEST_CKPT_WRITE_DELAY_MS", "1500", 1);
    t.engine->save_checkpoint(dir.string(), "step-3", {{"step", kSave}}, c.async);
    if (c.async) {
      unsetenv("ZERO_TEST_CKPT_WRITE_DELAY_MS");
      // Training goes on while the files are written (held back 1.5 s: a
      // file written from the live state instead of the snapshot would hold
      // these steps); the commit comes at a later step or here.
      std::vector<float> after;
      t.steps(kSave, kSave + 2, after);
      EXPECT_TRUE(t.engine->checkpoint_in_flight()) << "the write was not held back";
      t.engine->wait_checkpoint();
    }
  }  // the engine and its module are gone, the DPU update pending at the save dropped
  config::Config load_cfg = cfg;
  const bool resplit = c.load_ratio >= 0.0f && c.load_ratio != c.ratio;
  if (resplit) load_cfg.zero_optimization.offload_optimizer.ratio = c.load_ratio;
  Trainer t{kind, load_cfg};
  const nlohmann::json client = t.engine->load_checkpoint(dir.string(), "latest");
  EXPECT_EQ(client.at("step").get<int>(), kSave);
  EXPECT_EQ(t.engine->stats().step, kSave);
  EXPECT_EQ(t.engine->stats().loss_scale, unbroken_scale_at_save);
  t.steps(kSave, kSave + 1, resumed);
  if (c.published && comm.world_size() == 1) {
    // The update loaded pending is whole (no job runs for it): the first
    // backward after the load takes its pieces in as their buckets are
    // reduced, never waiting for a job.
    EXPECT_GT(t.engine->stats().published_in_backward, 0) << "the loaded pending update waited for a job";
  }
  t.steps(kSave + 1, kSteps, resumed);
  const std::vector<at::Tensor> params = t.final_params();
  // The step counters and the loss scaler went on as in the unbroken run
  // (with power-of-two scales the losses cannot tell a wrong scale).
  EXPECT_EQ(t.engine->stats().step, unbroken_final.step);
  EXPECT_EQ(t.engine->stats().skipped, unbroken_final.skipped);
  EXPECT_EQ(t.engine->stats().loss_scale, unbroken_final.loss_scale);
  ASSERT_EQ(resumed.size(), unbroken.size());
  ASSERT_EQ(params.size(), unbroken_params.size());
  if (resplit) {
    for (int s = kSave; s < kSteps; ++s) {
      EXPECT_NEAR(resumed[s], unbroken[s], 1e-5f * std::abs(unbroken[s])) << "step " << s + 1;
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(at::allclose(params[i], unbroken_params[i], 1e-5, 1e-6)) << "param " << i;
    }
  } else {
    for (int s = kSave; s < kSteps; ++s) EXPECT_EQ(resumed[s], unbroken[s]) << "step " << s + 1;
    expect_bitwise_equal(params, unbroken_params);
  }
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Resume,
    ::testing::Values(ResumeCase{"stage0", 0}, ResumeCase{"stage1", 1}, ResumeCase{"stage2_accum", 2, false, false, false, false, false, false, 2},
                      ResumeCase{"stage2_offload", 2, true}, ResumeCase{"stage2_offload_dpu", 2, true, true},
                      ResumeCase{"stage2_offload_dpu_bf16_async", 2, true, true, true, false, false, true},
                      ResumeCase{"stage1_bf16", 1, false, false, true}, ResumeCase{"stage3", 3},
                      ResumeCase{"stage3_offload_dpu_async", 3, true, true, false, true, false, true},
                      ResumeCase{"stage2_adagrad_offload", 2, true, false, false, false, true},
                      // Lion (one moment, not Adagrad's): stage 3 with the parameters in host
                      // memory and its delayed update pending at an async save.
                      ResumeCase{"stage3_lion_offload_dpu_async", 3, true, true, false, true, false, true, 1, false,
                                 1.0f, -1.0f, "Lion"},
                      ResumeCase{"stage2_fp16_offload", 2, true, false, false, false, false, false, 1, true},
                      // A device share (offload_optimizer.ratio < 1), its update pending at the save,
                      // loaded into the same split and into another.
                      ResumeCase{"stage2_offload_dpu_bf16_share", 2, true, true, true, false, false, false, 1, false, 0.5f},
                      ResumeCase{"stage3_offload_dpu_share_async", 3, true, true, false, true, false, true, 1, false, 0.4f},
                      ResumeCase{"stage2_offload_dpu_share_to_whole", 2, true, true, false, false, false, false, 1, false, 0.5f, 1.0f},
                      ResumeCase{"stage2_offload_dpu_whole_to_share", 2, true, true, false, false, false, false, 1, false, 1.0f, 0.3f},
                      // publish_in_backward, its update pending at the save (on several ranks it is off).
                      ResumeCase{"stage2_offload_dpu_bf16_published", 2, true, true, true, false, false, false, 1, false,
                                 1.0f, -1.0f, nullptr, true}),
    [](const ::testing::TestParamInfo<ResumeCase>& i) { return std::string(i.param.name); });

// A load replaces the whole training state, a delayed update pending in the
// loading engine included: an engine that trained on after the save (its
// own update pending), or that loaded a checkpoint with one pending before,
// continues from the loaded checkpoint exactly as a fresh engine does. (The
// update it had pending used to survive the load and go in over the loaded
// weights: bf16 parameters then no longer matched the master weights.)
TEST(Resume, ALoadDropsTheUpdateTheEngineHadPending) {
  comm::Communicator& comm = world_comm();
  const ResumeCase c{"replace_pending", 2, true, true, true};  // offload, DPU, bf16
  const config::Config cfg = case_config(c, comm.world_size());
  const fs::path dir = shared_temp_dir(comm, c.name);
  {
    Trainer t{ModelKind::kUnitMlp, cfg};
    std::vector<float> losses;
    t.steps(0, 3, losses);
    t.engine->save_checkpoint(dir.string(), "pending");  // its update pending
    t.engine->flush();
    t.engine->save_checkpoint(dir.string(), "clean");  // nothing pending
  }
  std::vector<float> fresh_losses;
  std::vector<at::Tensor> fresh_params;
  {
    Trainer t{ModelKind::kUnitMlp, cfg};
    t.engine->load_checkpoint(dir.string(), "clean");
    t.steps(3, 6, fresh_losses);
    fresh_params = t.final_params();
  }
  // Trained on past the save, then loaded; and loaded twice.
  for (const bool load_twice : {false, true}) {
    Trainer t{ModelKind::kUnitMlp, cfg};
    std::vector<float> losses;
    if (load_twice) {
      t.engine->load_checkpoint(dir.string(), "pending");
    } else {
      t.steps(0, 5, losses);  // an update of its own pending
    }
    t.engine->load_checkpoint(dir.string(), "clean");
    losses.clear();
    t.steps(3, 6, losses);
    EXPECT_EQ(losses, fresh_losses) << (load_twice ? "loaded twice" : "trained past the save");
    expect_bitwise_equal(t.final_params(), fresh_params);
  }
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

// nonfinite.policy "stop" ends a run after stop_after skipped steps in a
// row, and its error says to resume from a checkpoint: loaded into the same
// engine, the count starts again (a single skip after the load does not stop
// it), as in a fresh process.
TEST(Resume, ALoadStartsTheCountOfSkippedStepsAgain) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  config::Config cfg = case_config(ResumeCase{"stop_after", 2}, world);
  cfg.nonfinite.policy = "stop";
  cfg.nonfinite.stop_after = 2;
  const fs::path dir = shared_temp_dir(comm, "stop_after");
  Trainer t{ModelKind::kUnitMlp, cfg};
  std::vector<float> losses;
  t.steps(0, 2, losses);
  t.engine->save_checkpoint(dir.string(), "good");
  auto nan_step = [&](int step) {
    const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
    GlobalBatch gb = global_batch(t.kind, step);
    at::Tensor loss = micro_loss(t.kind, *t.model, gb.x.narrow(0, comm.rank() * micro, micro),
                                 gb.y.narrow(0, comm.rank() * micro, micro), t.engine->dtype());
    t.engine->backward(loss * std::numeric_limits<float>::quiet_NaN());
    return t.engine->step();
  };
  EXPECT_FALSE(nan_step(2));  // skipped, 1 in a row
  try {
    nan_step(3);
    ADD_FAILURE() << "two skipped steps in a row did not stop the run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in 2 consecutive step(s)"), std::string::npos) << e.what();
  }
  t.engine->load_checkpoint(dir.string(), "good");
  EXPECT_EQ(t.engine->stats().consecutive_skipped, 0);
  EXPECT_FALSE(nan_step(2));  // one skip after the load: the run goes on
  t.steps(3, 4, losses);
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

// A checkpoint saved with the delayed update's step pending, loaded into an
// engine without the delayed update: the update is applied at load (read in
// place of the saved parameters, no partition-sized temporary), so the
// module holds what the saving engine holds once it has applied it
// (flush()), bit for bit, at stages 2 and 3, fp32 and bf16.
TEST(Resume, PendingUpdateIsAppliedWhereTheLoadingEngineHasNone) {
  comm::Communicator& comm = world_comm();
  for (const ResumeCase& c : {ResumeCase{"dpu_to_none_s2", 2, true, true}, ResumeCase{"dpu_to_none_s2_bf16", 2, true, true, true},
                              ResumeCase{"dpu_to_none_s3", 3, true, true, false, true}}) {
    const config::Config cfg = case_config(c, comm.world_size());
    const fs::path dir = shared_temp_dir(comm, c.name);
    auto module_values = [](Trainer& t) {
      GatheredParameters all = t.engine->gather_parameters();
      std::vector<at::Tensor> v;
      for (const at::Tensor& p : t.model->parameters()) v.push_back(p.detach().clone());
      return v;
    };
    std::vector<at::Tensor> applied, master;
    {
      Trainer t{ModelKind::kUnitMlp, cfg};
      std::vector<float> losses;
      t.steps(0, 3, losses);
      t.engine->save_checkpoint(dir.string(), "step-3");
      t.engine->flush();  // the pending update applied
      applied = module_values(t);
      master = t.engine->gather_master_params();
    }
    config::Config none = cfg;
    none.zero_optimization.offload_optimizer.delayed_param_update = false;
    Trainer t{ModelKind::kUnitMlp, none};
    testing::internal::CaptureStderr();
    t.engine->load_checkpoint(dir.string());
    const std::string said = testing::internal::GetCapturedStderr();
    if (comm.rank() == 0) {
      EXPECT_NE(said.find("had a delayed update pending; applied at load, as this engine has no delayed update"),
                std::string::npos)
          << c.name << ": " << said;
    }
    expect_bitwise_equal(module_values(t), applied);
    expect_bitwise_equal(t.engine->gather_master_params(), master);
    std::vector<float> losses;
    t.steps(3, 5, losses);
    for (float l : losses) EXPECT_TRUE(std::isfinite(l)) << c.name;
    comm.barrier()->wait();
    if (comm.rank() == 0) rm_tree(dir);
  }
}

// fp16's loss scale is fp16's alone: a checkpoint saved in fp32 or bf16
// (whose scale no overflow moved: 1) loads into a dynamic fp16 engine at the
// config's initial scale, as a fresh run starts (it used to resume at 1, and
// fp16 gradients underflowed until loss_scale_window clean steps raised
// it); the load line says the precision changed and from which scale. An
// fp16 checkpoint's scale still carries over (the Resume cases' fp16 rows).
TEST(Resume, AnotherPrecisionsCheckpointLeavesFp16ItsInitialScale) {
  comm::Communicator& comm = world_comm();
  for (const bool bf16 : {false, true}) {
    const ResumeCase saving{bf16 ? "bf16_to_fp16" : "fp32_to_fp16", 2, false, false, bf16};
    const fs::path dir = shared_temp_dir(comm, saving.name);
    {
      Trainer t{ModelKind::kUnitMlp, case_config(saving, comm.world_size())};
      std::vector<float> losses;
      t.steps(0, 2, losses);
      t.engine->save_checkpoint(dir.string(), "step-2");
    }
    ResumeCase loading = saving;
    loading.bf16 = false;
    loading.fp16 = true;  // initial_scale_power 8
    Trainer t{ModelKind::kUnitMlp, case_config(loading, comm.world_size())};
    testing::internal::CaptureStderr();
    t.engine->load_checkpoint(dir.string());
    const std::string said = testing::internal::GetCapturedStderr();
    EXPECT_EQ(t.engine->stats().loss_scale, 256.0f) << saving.name;
    if (comm.rank() == 0) {
      EXPECT_NE(said.find(std::string(", in ") + (bf16 ? "bf16" : "fp32") + "; now training in fp16 from the loss scale 256"),
                std::string::npos)
          << saving.name << ": " << said;
    }
    std::vector<float> losses;
    t.steps(2, 3, losses);
    for (float l : losses) EXPECT_TRUE(std::isfinite(l)) << saving.name;
    EXPECT_EQ(t.engine->stats().skipped, 0) << saving.name;
    comm.barrier()->wait();
    if (comm.rank() == 0) rm_tree(dir);
  }
}

// ---- Bad input --------------------------------------------------------------

struct Saved {
  fs::path dir;
  std::vector<at::Tensor> master;  // at the save
};

Saved save_one(const config::Config& cfg, const std::string& what) {
  comm::Communicator& comm = world_comm();
  Saved s;
  s.dir = shared_temp_dir(comm, what);
  Trainer t{ModelKind::kUnitMlp, cfg};
  std::vector<float> losses;
  t.steps(0, 2, losses);
  t.engine->save_checkpoint(s.dir.string(), "good");
  s.master = t.engine->gather_master_params();
  return s;
}

// Expects load_checkpoint to fail with a message containing `needle`, and
// the engine to be unchanged. A load that fails only once it has read into
// the engine (a file damaged inside) changes it: then the error says so, the
// engine refuses to train, and a good load (of tag `good`) mends it.
void expect_load_fails(const fs::path& dir, const std::string& tag, const std::string& needle,
                       bool fails_while_reading = false) {
  comm::Communicator& comm = world_comm();
  Trainer t{ModelKind::kUnitMlp, make_config(2, false, false, comm.world_size(), kGlobalBatch / comm.world_size(), 1)};
  const std::vector<at::Tensor> before = t.engine->gather_master_params();
  try {
    t.engine->load_checkpoint(dir.string(), tag);
    ADD_FAILURE() << "load of " << tag << " did not fail (expected: " << needle << ")";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("partly that checkpoint's") != std::string::npos, fails_while_reading)
        << e.what();
  }
  EXPECT_EQ(t.engine->stats().step, 0);
  if (!fails_while_reading) {
    expect_bitwise_equal(t.engine->gather_master_params(), before);
    return;
  }
  std::vector<float> losses;
  try {
    t.steps(0, 1, losses);
    ADD_FAILURE() << "the engine trained on after the failed load of " << tag;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("load a good checkpoint first"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.engine->save_checkpoint(dir.string(), "from_damaged"), Error);
  t.engine->load_checkpoint(dir.string(), "good");
  t.steps(0, 1, losses);
  EXPECT_TRUE(std::isfinite(losses.back()));
}

void on_rank0(const std::function<void()>& fn) {
  comm::Communicator& comm = world_comm();
  comm.barrier()->wait();
  if (comm.rank() == 0) fn();
  comm.barrier()->wait();
}

void copy_tag(const fs::path& dir, const std::string& from, const std::string& to) {
  rm_tree(dir / to);
  fs::copy(dir / from, dir / to, fs::copy_options::recursive);
}

std::string shard0(const fs::path& dir, const std::string& tag) {
  return (dir / tag / ckpt::shard_file_name(0, world_comm().world_size())).string();
}

TEST(BadInput, DamagedTruncatedMissingShardsAreNamed) {
  comm::Communicator& comm = world_comm();
  const config::Config cfg = make_config(2, false, false, comm.world_size(), kGlobalBatch / comm.world_size(), 1);
  const Saved s = save_one(cfg, "bad_shard");
  on_rank0([&] {
    copy_tag(s.dir, "good", "flipped");
    {
      std::fstream f(shard0(s.dir, "flipped"), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      char b = 0;
      f.read(&b, 1);
      f.seekp(100);
      b = static_cast<char>(b ^ 0x10);
      f.write(&b, 1);
    }
    copy_tag(s.dir, "good", "short");
    fs::resize_file(shard0(s.dir, "short"), fs::file_size(shard0(s.dir, "short")) - 7);
    copy_tag(s.dir, "good", "missing");
    fs::remove(shard0(s.dir, "missing"));
  });
  expect_load_fails(s.dir, "flipped", "is damaged: its CRC-32C", /*fails_while_reading=*/true);
  expect_load_fails(s.dir, "short", "truncated");
  expect_load_fails(s.dir, "missing", "a shard is missing");
  expect_load_fails(s.dir, "nosuchtag", "no checkpoint 'nosuchtag'");
  expect_load_fails(s.dir, "../good", "not a plain name");
  // The good one still loads.
  expect_bitwise_equal(loaded_master(cfg, s.dir, "good"), s.master);
  on_rank0([&] { rm_tree(s.dir); });
}

// The state of another optimizer: Adagrad's sum and Lion's momentum are
// one moment each, Adam's two; each is refused by the others, naming both.
// AdamW and Adam keep the same state, and load into each other.
TEST(BadInput, StateOfAnotherOptimizerIsRefused) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const fs::path dir = shared_temp_dir(comm, "other_optimizer");
  auto cfg_of = [&](const char* type) {
    config::Config cfg = make_config(2, true, false, world, kGlobalBatch / world, 1);
    cfg.optimizer.type = type;
    return cfg;
  };
  for (const char* type : {"AdamW", "Adagrad", "Lion", "Muon"}) {
    Trainer t{ModelKind::kUnitMlp, cfg_of(type)};
    std::vector<float> losses;
    t.steps(0, 1, losses);
    t.engine->save_checkpoint(dir.string(), type);
  }
  for (const auto& [saved, loading] : std::vector<std::pair<std::string, std::string>>{
           {"Adagrad", "Lion"}, {"Lion", "Adagrad"}, {"AdamW", "Lion"}, {"Lion", "AdamW"}, {"Muon", "AdamW"},
           {"AdamW", "Muon"}}) {
    SCOPED_TRACE(saved + " into " + loading);
    Trainer t{ModelKind::kUnitMlp, cfg_of(loading.c_str())};
    const std::vector<at::Tensor> before = t.engine->gather_master_params();
    try {
      t.engine->load_checkpoint(dir.string(), saved);
      ADD_FAILURE() << "the load did not fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("holds the state of optimizer " + saved + ", this engine's is " + loading +
                                           ": use the optimizer it was saved with"),
                std::string::npos)
          << e.what();
    }
    expect_bitwise_equal(t.engine->gather_master_params(), before);
  }
  {
    Trainer t{ModelKind::kUnitMlp, cfg_of("Adam")};
    EXPECT_NO_THROW(t.engine->load_checkpoint(dir.string(), "AdamW"));
  }
  on_rank0([&] { rm_tree(dir); });
}

TEST(BadInput, ManifestOfAnotherModelOrNewerFormatIsRefused) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const fs::path dir = shared_temp_dir(comm, "other_model");
  {
    // A checkpoint of another model: the plain MLP.
    auto model = make_model(ModelKind::kMlp);
    Engine e(model, make_config(2, false, false, world, kGlobalBatch / world, 1), comm);
    e.save_checkpoint(dir.string(), "mlp");
  }
  expect_load_fails(dir, "mlp", "is of another model");
  const config::Config cfg = make_config(2, false, false, world, kGlobalBatch / world, 1);
  {
    Trainer t{ModelKind::kUnitMlp, cfg};
    t.engine->save_checkpoint(dir.string(), "good");
  }
  auto edit_manifest = [&](const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
    on_rank0([&] {
      copy_tag(dir, "good", tag);
      const fs::path p = dir / tag / ckpt::kManifestName;
      nlohmann::json j = nlohmann::json::parse(ckpt::read_text(p));
      edit(j);
      if (j.is_object()) ckpt::sign_manifest(j);  // re-signed: the field checks are what is tested
      std::ofstream(p) << j.dump();
    });
  };
  // A byte changed in the manifest (a name, a shape, the step count: each
  // would load as another model or state) fails its checksum.
  for (const auto& [tag, from, to] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"renamed", "\"l1.weight\"", "\"l1.weighs\""}, {"step", "\"optimizer_step\": ", "\"optimizer_step\": 1"}}) {
    on_rank0([&, tag = tag, from = from, to = to] {
      copy_tag(dir, "good", tag);
      const fs::path p = dir / tag / ckpt::kManifestName;
      std::string text = ckpt::read_text(p);
      const auto at = text.find(from);
      ASSERT_NE(at, std::string::npos) << from;
      text.replace(at, from.size(), to);
      std::ofstream(p) << text;
    });
    expect_load_fails(dir, tag, "is damaged: its contents do not match its checksum");
  }
  edit_manifest("unsigned", [](nlohmann::json& j) { j.erase("manifest_crc32c"); });
  on_rank0([&] {  // (edit_manifest signs it again: take the checksum out after)
    const fs::path p = dir / "unsigned" / ckpt::kManifestName;
    nlohmann::json j = nlohmann::json::parse(ckpt::read_text(p));
    j.erase("manifest_crc32c");
    std::ofstream(p) << j.dump();
  });
  expect_load_fails(dir, "unsigned", "has format version 2 but no manifest_crc32c");
  edit_manifest("newer", [](nlohmann::json& j) { j["format_version"] = 99; });
  expect_load_fails(dir, "newer", "newer than this zerocpp reads");
  edit_manifest("escape", [](nlohmann::json& j) { j["files"][0]["name"] = "../good/manifest.json"; });
  expect_load_fails(dir, "escape", "is not a plain file name");
  edit_manifest("huge", [](nlohmann::json& j) { j["files"][0]["sections"][0]["bytes"] = 1ull << 62; });
  expect_load_fails(dir, "huge", "more than the limit");
  edit_manifest("negative", [](nlohmann::json& j) { j["params"][0]["offset"] = -4; });
  expect_load_fails(dir, "negative", "is negative");
  edit_manifest("overlap", [](nlohmann::json& j) { j["params"][1]["offset"] = j["params"][0]["offset"]; });
  expect_load_fails(dir, "overlap", "overlap");
  edit_manifest("decay", [](nlohmann::json& j) { j["params"][0]["weight_decay"] = -0.5; });
  expect_load_fails(dir, "decay", "].weight_decay is not a finite number >= 0");
  edit_manifest("scale", [](nlohmann::json& j) { j["params"][0]["lr_scale"] = "fast"; });
  expect_load_fails(dir, "scale", "].lr_scale is not a number");
  edit_manifest("notjson", [](nlohmann::json& j) { j = "x"; });
  expect_load_fails(dir, "notjson", "not a zerocpp checkpoint manifest");
  // Found by checkpoint_reader_fuzzer: a "format" that is not a string threw
  // nlohmann's type_error past the loader.
  edit_manifest("notstring", [](nlohmann::json& j) { j["format"] = 1; });
  expect_load_fails(dir, "notstring", "not a zerocpp checkpoint manifest");
  // A version that wraps round in 32 bits to 1.
  edit_manifest("wraps", [](nlohmann::json& j) { j["format_version"] = 4294967297ull; });
  expect_load_fails(dir, "wraps", "newer than this zerocpp reads");
  on_rank0([&] { rm_tree(dir); });
}

TEST(BadInput, UnwritableFolderAndFullDiskLeaveTheEarlierCheckpoint) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const config::Config cfg = make_config(2, false, false, world, kGlobalBatch / world, 1);
  const Saved s = save_one(cfg, "full_disk");
  Trainer t{ModelKind::kUnitMlp, cfg};
  std::vector<float> losses;
  t.steps(0, 3, losses);
  // A folder below a file: cannot be created, whoever runs the test (root too).
  const fs::path blocked = s.dir / "a_file" / "ckpt";
  on_rank0([&] { std::ofstream(s.dir / "a_file") << "x"; });
  try {
    t.engine->save_checkpoint(blocked.string(), "x");
    ADD_FAILURE() << "save into " << blocked << " did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create the checkpoint folder"), std::string::npos) << e.what();
  }
  // A full disk mid-file: the file size limit stands in for it.
  for (bool async : {false, true}) {
    {
      const LastRankFileSizeLimit full_disk(comm, 4096);
      try {
        t.engine->save_checkpoint(s.dir.string(), "good", {}, async);
        t.engine->wait_checkpoint();
        ADD_FAILURE() << "save past the file size limit did not fail";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("after"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("was not saved"), std::string::npos) << e.what();
      }
    }
    EXPECT_FALSE(t.engine->checkpoint_in_flight());
  }
  // latest still names "good", whose files are those of the first save.
  Trainer u{ModelKind::kUnitMlp, cfg};
  u.engine->load_checkpoint(s.dir.string(), "latest");
  EXPECT_EQ(u.engine->stats().step, 2);
  expect_bitwise_equal(u.engine->gather_master_params(), s.master);
  // The engine that failed to save trains on, and saves once there is room.
  t.steps(3, 4, losses);
  t.engine->save_checkpoint(s.dir.string(), "after");
  on_rank0([&] { EXPECT_EQ(ckpt::resolve_tag(s.dir, "latest"), "after"); rm_tree(s.dir); });
}

TEST(Save, MidWindowSaveAndLoadAreRefusedAndTheAsyncCommitComesAtAStep) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const config::Config cfg = make_config(2, true, false, world, kGlobalBatch / (2 * world), 2);
  const fs::path dir = shared_temp_dir(comm, "async");
  Trainer t{ModelKind::kUnitMlp, cfg};
  std::vector<float> losses;
  t.steps(0, 1, losses);
  t.engine->save_checkpoint(dir.string(), "window_start");
  // Half a window.
  GlobalBatch gb = global_batch(ModelKind::kUnitMlp, 1);
  const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
  t.engine->backward(micro_loss(ModelKind::kUnitMlp, *t.model, gb.x.narrow(0, comm.rank() * micro, micro),
                                gb.y.narrow(0, comm.rank() * micro, micro), t.engine->dtype()));
  // A backward whose step() has not come is part of the window: its
  // gradients are taken in already (a load would meet them, a save would
  // hold the state before their update).
  try {
    t.engine->load_checkpoint(dir.string(), "window_start");
    ADD_FAILURE() << "a load between backward() and step() was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("load_checkpoint() in the middle of an accumulation window (1 of its 2 "
                                         "backward()s done, the last one's step() not yet)"),
              std::string::npos)
        << e.what();
  }
  t.engine->step();
  EXPECT_THROW(t.engine->save_checkpoint(dir.string(), "mid"), Error);
  // A load would carry the half window's gradients into the loaded state's
  // next window: refused as the save is, before anything changes.
  try {
    t.engine->load_checkpoint(dir.string(), "window_start");
    ADD_FAILURE() << "a load in the middle of a window was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("load_checkpoint() in the middle of an accumulation window (1 of its 2 "
                                         "backward()s done): call it after the step() that ends the window"),
              std::string::npos)
        << e.what();
  }
  t.engine->backward(micro_loss(ModelKind::kUnitMlp, *t.model, gb.x.narrow(0, 8 + comm.rank() * micro, micro),
                                gb.y.narrow(0, 8 + comm.rank() * micro, micro), t.engine->dtype()));
  t.engine->step();
  t.engine->save_checkpoint(dir.string(), "async", {}, /*async=*/true);
  EXPECT_TRUE(t.engine->checkpoint_in_flight());
  EXPECT_FALSE(fs::exists(dir / "async" / ckpt::kManifestName));
  // Steps until every rank's file is written: on a loaded machine the
  // fsync can take longer than 50 of these tiny steps (then the test removed
  // the folder under the save). The bound is a count, the same on every
  // rank (the commit is collective); a time limit could differ by rank.
  for (int i = 0; i < 20000 && t.engine->checkpoint_in_flight(); ++i) t.steps(2 + i, 3 + i, losses);
  EXPECT_FALSE(t.engine->checkpoint_in_flight());
  comm.barrier()->wait();
  EXPECT_TRUE(fs::exists(dir / "async" / ckpt::kManifestName));
  EXPECT_GT(t.engine->last_checkpoint().bytes, 0u);
  on_rank0([&] { rm_tree(dir); });
}

// An asynchronous save writes the partition's host memory in place (no copy
// at the save) until the next optimizer step, which copies what is not
// written yet (held back here) before it changes it: the ledger shows where
// the copy is made, and the checkpoint holds the state of the save.
// With one micro-batch per window too: a save between backward() and its
// step() would hold the state before that backward's update, and a resume
// from it would lose the micro-batch. Refused, and the same save after the
// step() holds the update (a fresh engine loads the step's weights).
TEST(Save, ASaveBetweenBackwardAndItsStepIsRefused) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const config::Config cfg = make_config(2, true, false, world, kGlobalBatch / world, 1);
  const fs::path dir = shared_temp_dir(comm, "between");
  Trainer t{ModelKind::kUnitMlp, cfg};
  std::vector<float> losses;
  t.steps(0, 1, losses);
  GlobalBatch gb = global_batch(ModelKind::kUnitMlp, 1);
  const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
  t.engine->backward(micro_loss(ModelKind::kUnitMlp, *t.model, gb.x.narrow(0, comm.rank() * micro, micro),
                                gb.y.narrow(0, comm.rank() * micro, micro), t.engine->dtype()));
  try {
    t.engine->save_checkpoint(dir.string(), "between");
    ADD_FAILURE() << "a save between backward() and step() was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("save_checkpoint() in the middle of an accumulation window (1 of its 1 "
                                         "backward()s done, the last one's step() not yet)"),
              std::string::npos)
        << e.what();
  }
  t.engine->step();
  t.engine->save_checkpoint(dir.string(), "after");
  Trainer u{ModelKind::kUnitMlp, cfg};
  u.engine->load_checkpoint(dir.string(), "after");
  EXPECT_EQ(u.engine->stats().step, 2);
  expect_bitwise_equal(u.engine->gather_master_params(), t.engine->gather_master_params());
  on_rank0([&] { rm_tree(dir); });
}

TEST(Save, AsyncWritesThePartitionInPlaceUntilTheNextStep) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const fs::path dir = shared_temp_dir(comm, "async_in_place");
  const config::Config cfg = make_config(2, true, false, world, kGlobalBatch / world, 1);  // fp32, CPU offload
  Trainer t{ModelKind::kUnitMlp, cfg};
  std::vector<float> losses;
  t.steps(0, 2, losses);
  const std::vector<at::Tensor> at_save = t.engine->gather_master_params();
  auto staging = [&] { return t.engine->ledger().snapshot().bytes(memory::Tier::kHost, memory::Kind::kStaging); };
  const auto s = t.engine->ledger().snapshot();
  const std::int64_t state = s.bytes(memory::Tier::kHost, memory::Kind::kFp32Master) +
                             s.bytes(memory::Tier::kHost, memory::Kind::kMoments);
  ASSERT_GT(state, 0);
  ASSERT_EQ(staging(), 0);
  setenv("ZERO_TEST_CKPT_WRITE_DELAY_MS", "1500", 1);
  t.engine->save_checkpoint(dir.string(), "in_place", {}, /*async=*/true);
  unsetenv("ZERO_TEST_CKPT_WRITE_DELAY_MS");
  ASSERT_TRUE(t.engine->last_checkpoint().async);
  // At the save: copies of the small sections only (the RNG state, 5 KB;
  // module tensors), not of the partition.
  const std::int64_t small = staging();
  EXPECT_LT(small, state) << "the partition was copied at the save";
  const double save_stall = t.engine->last_checkpoint().stall_s;
  // The next step changes the partition: the unwritten rest is copied first.
  t.steps(2, 3, losses);
  ASSERT_TRUE(t.engine->checkpoint_in_flight()) << "the write was not held back";
  EXPECT_GE(staging(), small + state) << "the step went on without copying the unwritten state";
  EXPECT_GT(t.engine->last_checkpoint().stall_s, save_stall);
  t.steps(3, 4, losses);  // no second copy
  EXPECT_LT(staging(), small + 2 * state);
  t.engine->wait_checkpoint();
  EXPECT_EQ(staging(), 0) << "the copies outlive the save";
  expect_bitwise_equal(loaded_master(cfg, dir, "in_place"), at_save);
  on_rank0([&] { rm_tree(dir); });
}

// The fence in the middle of a piece: the live sections written in blocks of
// 256 bytes with a pause after each, the next steps start at once, so the
// step's fence finds the writer part-way through the master weights: the
// copy must start where the writer is, and the file hold the saved state.
TEST(Save, AsyncFenceInTheMiddleOfAPieceKeepsTheSavedState) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const fs::path dir = shared_temp_dir(comm, "async_mid_piece");
  const config::Config cfg = make_config(2, true, false, world, kGlobalBatch / world, 1);
  Trainer t{ModelKind::kUnitMlp, cfg};
  std::vector<float> losses;
  t.steps(0, 2, losses);
  const std::vector<at::Tensor> at_save = t.engine->gather_master_params();
  setenv("ZERO_TEST_CKPT_LIVE_BLOCK", "256:2", 1);
  t.engine->save_checkpoint(dir.string(), "mid", {}, /*async=*/true);
  unsetenv("ZERO_TEST_CKPT_LIVE_BLOCK");
  t.steps(2, 4, losses);
  t.engine->wait_checkpoint();
  expect_bitwise_equal(loaded_master(cfg, dir, "mid"), at_save);
  on_rank0([&] { rm_tree(dir); });
}

// The next step's copy of what is not written yet, where one rank's host
// has no room for it: that rank abandons the save (its writer stops before
// reading memory the step changes), training goes on exactly as without
// the save, the commit fails on every rank naming the rank and why, nothing
// is committed, and the next save works.
TEST(Save, AsyncFenceWithoutRoomForTheCopyAbandonsTheSave) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const fs::path dir = shared_temp_dir(comm, "async_abandoned");
  const config::Config cfg = make_config(2, true, false, world, kGlobalBatch / world, 1);
  Trainer t{ModelKind::kUnitMlp, cfg};
  Trainer ref{ModelKind::kUnitMlp, cfg};  // the same steps, no save
  std::vector<float> losses, ref_losses;
  t.steps(0, 2, losses);
  ref.steps(0, 2, ref_losses);
  setenv("ZERO_TEST_CKPT_WRITE_DELAY_MS", "1500", 1);
  t.engine->save_checkpoint(dir.string(), "abandoned", {}, /*async=*/true);
  unsetenv("ZERO_TEST_CKPT_WRITE_DELAY_MS");
  ASSERT_TRUE(t.engine->last_checkpoint().async);
  if (comm.rank() == world - 1) setenv("ZERO_HOST_MEMORY_LIMIT", "1K", 1);
  t.steps(2, 3, losses);  // the fence: no room on the last rank
  unsetenv("ZERO_HOST_MEMORY_LIMIT");
  try {
    t.engine->wait_checkpoint();
    ADD_FAILURE() << "an abandoned save was committed";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'abandoned' was not saved"), std::string::npos) << msg;
    EXPECT_NE(msg.find("abandoned and training went on"), std::string::npos) << msg;
    if (comm.rank() == world - 1) {
      EXPECT_NE(msg.find("ZERO_HOST_MEMORY_LIMIT"), std::string::npos) << msg;
    } else {
      EXPECT_NE(msg.find("rank " + std::to_string(world - 1)), std::string::npos) << msg;
    }
  }
  t.steps(3, 4, losses);
  ref.steps(2, 4, ref_losses);
  EXPECT_FALSE(t.engine->checkpoint_in_flight());
  comm.barrier()->wait();
  EXPECT_FALSE(fs::exists(dir / "abandoned" / ckpt::kManifestName));
  // Training went on as if no save had been made.
  EXPECT_EQ(losses, ref_losses);
  expect_bitwise_equal(t.engine->gather_master_params(), ref.engine->gather_master_params());
  // The next save is whole.
  t.engine->save_checkpoint(dir.string(), "next", {}, /*async=*/true);
  t.steps(4, 5, losses);
  t.engine->wait_checkpoint();
  comm.barrier()->wait();
  EXPECT_TRUE(fs::exists(dir / "next" / ckpt::kManifestName));
  on_rank0([&] { rm_tree(dir); });
}

// An asynchronous save that failed (a full disk on one rank: the file size
// limit stands in for it) is reported by the step() that would commit it,
// before that step counts: the caller that catches the error and calls
// step() again trains on exactly as without the save (accumulation 2: the
// window's first micro-batch is not lost).
TEST(Save, AsyncFailureAtAStepLeavesTheWindowToTheNextCall) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const fs::path dir = shared_temp_dir(comm, "async_failed_at_step");
  const config::Config cfg = make_config(2, false, false, world, kGlobalBatch / (2 * world), 2);
  Trainer t{ModelKind::kUnitMlp, cfg};
  Trainer ref{ModelKind::kUnitMlp, cfg};
  std::vector<float> losses, ref_losses;
  t.steps(0, 2, losses);
  ref.steps(0, 3, ref_losses);
  {
    const LastRankFileSizeLimit full_disk(comm, 4096);
    t.engine->save_checkpoint(dir.string(), "failed", {}, /*async=*/true);
    // The writer fails at its first 8 MiB block; give it far more than it needs.
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  }
  comm.barrier()->wait();
  // Step 2 by hand: two micro-batches, the error at the boundary's step().
  const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
  t.engine->set_lr(cfg.optimizer.lr * 1.2f);
  GlobalBatch gb = global_batch(ModelKind::kUnitMlp, 2);
  float sum = 0.0f;
  int errors = 0;
  for (int j = 0; j < 2; ++j) {
    const int begin = j * (kGlobalBatch / 2) + comm.rank() * micro;
    at::Tensor loss = micro_loss(ModelKind::kUnitMlp, *t.model, gb.x.narrow(0, begin, micro),
                                 gb.y.narrow(0, begin, micro), t.engine->dtype());
    t.engine->backward(loss);
    try {
      t.engine->step();
    } catch (const Error& e) {
      ++errors;
      EXPECT_EQ(j, 1) << "the error came off the accumulation boundary";
      EXPECT_NE(std::string(e.what()).find("'failed' was not saved"), std::string::npos) << e.what();
      EXPECT_FALSE(t.engine->checkpoint_in_flight());
      EXPECT_TRUE(t.engine->step()) << "the window's step, called again, was not taken";
    }
    sum += loss.item<float>();
  }
  EXPECT_EQ(errors, 1);
  comm.all_reduce(&sum, 1, DType::kFloat32)->wait();
  losses.push_back(sum / static_cast<float>(world * 2));
  EXPECT_EQ(losses, ref_losses);
  expect_bitwise_equal(t.engine->gather_master_params(), ref.engine->gather_master_params());
  on_rank0([&] { rm_tree(dir); });
}

// flush() without a pending update changes nothing a save in flight writes in
// place: it copies nothing. With the delayed update's pending one, it does.
TEST(Save, AsyncFlushCopiesOnlyWhenAnUpdateIsPending) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const fs::path dir = shared_temp_dir(comm, "async_flush");
  for (bool dpu : {false, true}) {
    config::Config cfg = make_config(2, true, false, world, kGlobalBatch / world, 1);
    cfg.zero_optimization.offload_optimizer.delayed_param_update = dpu;
    cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = 1;
    Trainer t{ModelKind::kUnitMlp, cfg};
    std::vector<float> losses;
    t.steps(0, 3, losses);
    auto staging = [&] { return t.engine->ledger().snapshot().bytes(memory::Tier::kHost, memory::Kind::kStaging); };
    setenv("ZERO_TEST_CKPT_WRITE_DELAY_MS", "1000", 1);
    t.engine->save_checkpoint(dir.string(), "flush", {}, /*async=*/true);
    unsetenv("ZERO_TEST_CKPT_WRITE_DELAY_MS");
    const std::int64_t at_save = staging();
    auto module_params = [](torch::nn::Module& m) {
      std::vector<at::Tensor> v;
      for (const at::Tensor& p : m.parameters()) v.push_back(p.detach().clone());
      return v;
    };
    const std::vector<at::Tensor> saved_params = module_params(*t.model);
    t.engine->flush();
    if (dpu) {
      EXPECT_GT(staging(), at_save) << "flush() applied the pending update without copying what the save reads";
    } else {
      EXPECT_EQ(staging(), at_save) << "flush() copied with nothing pending";
    }
    t.engine->wait_checkpoint();
    Trainer u{ModelKind::kUnitMlp, cfg};
    u.engine->load_checkpoint(dir.string(), "flush");
    const std::vector<at::Tensor> loaded = module_params(*u.model);
    // Without a pending update the module's parameters are the saved ones;
    // with one, the loaded engine holds it pending and the module the
    // parameters of the step before, as at the save.
    expect_bitwise_equal(loaded, saved_params);
    comm.barrier()->wait();
    on_rank0([&] { rm_tree(dir / "flush"); });
  }
  on_rank0([&] { rm_tree(dir); });
}

// LoraMlp at stage 3 on this world: its config, the run of `steps` steps
// without a break that a saved and resumed one is compared with (losses
// and final weights), and a folder every rank sees.
struct FrozenRun {
  FrozenRun(comm::Communicator& comm, int steps, const char* folder)
      : N(comm.world_size()), cfg(make_config(3, false, false, N, kGlobalBatch / N, 1)) {
    Trainer t{ModelKind::kLoraMlp, cfg};
    t.steps(0, steps, unbroken);
    unbroken_params = t.final_params();
    dir = shared_temp_dir(comm, folder);
  }
  int N;
  config::Config cfg;
  std::vector<float> unbroken;
  std::vector<at::Tensor> unbroken_params;
  fs::path dir;
};

// Stage 3 partitions a base's frozen weights (LoraMlp): a checkpoint holds
// them whole, as rank 0's module tensors (the format of every stage), and a
// load reads each rank's share of them into its partition (inside a
// gather_parameters() scope here, so the gathered ones are refreshed too). Saved at stage 3
// asynchronously (from copies gathered for the save), then loaded into
// engines whose frozen weights were changed before they were built: at
// stage 3 the run goes on bitwise as the unbroken one; at stage 0 (whole
// frozen weights) within the parity tolerance; both with the saved frozen
// weights.
TEST(Save, FrozenWeightsPartitionedAtStage3RoundTrip) {
  constexpr int kSave = 2, kSteps = 4;
  const FrozenRun f(world_comm(), kSteps, "frozen_stage3");
  {
    Trainer t{ModelKind::kLoraMlp, f.cfg};
    std::vector<float> losses;
    t.steps(0, kSave, losses);
    setenv("ZERO_TEST_CKPT_WRITE_DELAY_MS", "300", 1);
    t.engine->save_checkpoint(f.dir.string(), "frozen", nlohmann::json::object(), /*async=*/true);
    unsetenv("ZERO_TEST_CKPT_WRITE_DELAY_MS");
    t.steps(kSave, kSave + 1, losses);
    t.engine->wait_checkpoint();
  }
  const auto frozen_of = [](torch::nn::Module& m) {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& item : m.named_parameters()) {
      if (!item.value().requires_grad()) out.emplace_back(item.key(), item.value());
    }
    return out;
  };
  const std::shared_ptr<torch::nn::Module> fresh = make_model(ModelKind::kLoraMlp);  // the frozen weights as saved
  for (const int stage : {3, 0}) {
    SCOPED_TRACE("loaded at stage " + std::to_string(stage));
    std::shared_ptr<torch::nn::Module> changed = make_model(ModelKind::kLoraMlp);
    for (const auto& [name, p] : frozen_of(*changed)) p.detach().uniform_(-3.0, 3.0);
    Trainer t{ModelKind::kLoraMlp, make_config(stage, false, false, f.N, kGlobalBatch / f.N, 1), {}, changed};
    {
      // Loaded while gathered: each rank reads its share, and the gathered
      // buckets are all-gathered again from the shares.
      const GatheredParameters scope = t.engine->gather_parameters();
      t.engine->load_checkpoint(f.dir.string(), "frozen");
      const auto want = frozen_of(*fresh), got = frozen_of(*t.model);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(at::equal(got[i].second, want[i].second)) << got[i].first << " is not the saved value";
      }
    }
    std::vector<float> resumed;
    t.steps(kSave, kSteps, resumed);
    const std::vector<at::Tensor> params = t.final_params();
    for (std::size_t i = 0; i < resumed.size(); ++i) {
      if (stage == 3) {
        EXPECT_EQ(resumed[i], f.unbroken[kSave + i]) << "step " << kSave + i;
      } else {
        EXPECT_NEAR(resumed[i], f.unbroken[kSave + i], 1e-5 * std::abs(f.unbroken[kSave + i])) << "step " << kSave + i;
      }
    }
    if (stage == 3) {
      expect_bitwise_equal(params, f.unbroken_params);
    } else {
      ASSERT_EQ(params.size(), f.unbroken_params.size());
      for (std::size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(at::allclose(params[i], f.unbroken_params[i], 1e-5, 1e-6)) << "param " << i;
      }
    }
  }
}

// exclude_frozen_parameters (DeepSpeed's): a stage-3 run under adapters
// saves no frozen parameter (the manifest says so; rank 0's file holds no
// module section, LoraMlp having no buffers; nothing is gathered for it),
// and its file is smaller by their bytes. A load into an engine built on
// the same base resumes bitwise; one built on another base keeps that base.
TEST(Save, ExcludeFrozenParametersSavesWhatTrainingChanges) {
  constexpr int kSave = 2, kSteps = 4;
  const FrozenRun f(world_comm(), kSteps, "frozen_excluded");
  {
    Trainer t{ModelKind::kLoraMlp, f.cfg};
    std::vector<float> losses;
    t.steps(0, kSave, losses);
    t.engine->save_checkpoint(f.dir.string(), "with", nlohmann::json::object(), /*async=*/false);
    t.engine->save_checkpoint(f.dir.string(), "without", nlohmann::json::object(), /*async=*/false,
                              /*exclude_frozen_parameters=*/true);
  }
  const ckpt::Manifest with = ckpt::parse_manifest(ckpt::read_text(f.dir / "with" / ckpt::kManifestName), "with");
  const ckpt::Manifest without =
      ckpt::parse_manifest(ckpt::read_text(f.dir / "without" / ckpt::kManifestName), "without");
  EXPECT_FALSE(with.frozen_excluded);
  EXPECT_TRUE(without.frozen_excluded);
  EXPECT_EQ(with.module_tensors.size(), 9u) << "inp, 3 blocks' base weight and bias, the gain";
  EXPECT_TRUE(without.module_tensors.empty());
  std::uint64_t frozen_bytes = 0;
  for (const std::string& name : with.module_tensors) frozen_bytes += with.files[0].find(name)->bytes;
  EXPECT_GE(with.files[0].bytes - without.files[0].bytes, frozen_bytes);
  for (const bool same_base : {true, false}) {
    SCOPED_TRACE(same_base ? "the same base" : "another base");
    std::shared_ptr<torch::nn::Module> model = make_model(ModelKind::kLoraMlp);
    std::vector<at::Tensor> base;
    for (const at::Tensor& p : model->parameters()) {
      if (p.requires_grad()) continue;
      if (!same_base) p.detach().uniform_(-3.0, 3.0);
      base.push_back(p.detach().clone());
    }
    Trainer t{ModelKind::kLoraMlp, f.cfg, {}, model};
    t.engine->load_checkpoint(f.dir.string(), "without");
    {
      const GatheredParameters scope = t.engine->gather_parameters();
      std::size_t k = 0;
      for (const at::Tensor& p : t.model->parameters()) {
        if (!p.requires_grad()) {
          EXPECT_TRUE(at::equal(p, base[k++])) << "frozen tensor " << k - 1 << " changed";
        }
      }
    }
    std::vector<float> resumed;
    t.steps(kSave, kSteps, resumed);
    if (!same_base) continue;
    for (std::size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], f.unbroken[kSave + i]) << "step " << kSave + i;
    expect_bitwise_equal(t.final_params(), f.unbroken_params);
  }
}

// An asynchronous save whose snapshot one rank's host cannot hold: every
// rank saves synchronously instead, and the checkpoint is whole.
TEST(Save, AsyncFallsBackToSynchronousWhereTheSnapshotDoesNotFit) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const fs::path dir = shared_temp_dir(comm, "async_fallback");
  const config::Config cfg = make_config(2, false, false, world, kGlobalBatch / world, 1);
  Trainer t{ModelKind::kUnitMlp, cfg};
  std::vector<float> losses;
  t.steps(0, 2, losses);
  if (comm.rank() == world - 1) setenv("ZERO_HOST_MEMORY_LIMIT", "1K", 1);
  t.engine->save_checkpoint(dir.string(), "fallback", {}, /*async=*/true);
  unsetenv("ZERO_HOST_MEMORY_LIMIT");
  EXPECT_FALSE(t.engine->checkpoint_in_flight());
  EXPECT_FALSE(t.engine->last_checkpoint().async);
  comm.barrier()->wait();
  EXPECT_TRUE(fs::exists(dir / "fallback" / ckpt::kManifestName));
  const std::vector<at::Tensor> saved = t.engine->gather_master_params();
  expect_bitwise_equal(loaded_master(cfg, dir, "fallback"), saved);
  // With room, the same call is asynchronous.
  t.engine->save_checkpoint(dir.string(), "async", {}, /*async=*/true);
  EXPECT_TRUE(t.engine->last_checkpoint().async);
  t.engine->wait_checkpoint();
  on_rank0([&] { rm_tree(dir); });
}

// ---- Reshard: one job saves, another (other ranks, other stage) loads --------

// ZERO_CKPT_RESHARD=save:<stage>[+offload][+dpu][+param][+nvme][+pnvme]:<dir> or load:<stage>[...]:<dir>
// (+nvme: the optimizer state on NVMe; +pnvme: the parameter partition)
struct ReshardRole {
  bool save = false, active = false, nvme = false, param_nvme = false;
  ResumeCase c{"reshard", 0};
  fs::path dir;
};

ReshardRole reshard_role() {
  ReshardRole r;
  const char* env = std::getenv("ZERO_CKPT_RESHARD");
  if (!env) return r;
  const std::string s = env;
  const auto a = s.find(':'), b = s.find(':', a + 1);
  r.active = true;
  r.save = s.substr(0, a) == "save";
  const std::string layout = s.substr(a + 1, b - a - 1);
  r.c.stage = layout[0] - '0';
  r.c.offload = layout.find("+offload") != std::string::npos;
  r.c.dpu = layout.find("+dpu") != std::string::npos;
  r.c.param_offload = layout.find("+param") != std::string::npos;
  r.nvme = layout.find("+nvme") != std::string::npos;
  r.param_nvme = layout.find("+pnvme") != std::string::npos;
  r.dir = s.substr(b + 1);
  return r;
}

constexpr int kReshardSave = 3, kReshardSteps = 6;

void write_floats(const fs::path& p, const std::vector<float>& v) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
}
std::vector<float> read_floats(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<float> v(fs::file_size(p) / 4);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}
std::vector<float> flatten(const std::vector<at::Tensor>& ts) {
  std::vector<float> v;
  for (const at::Tensor& t : ts) {
    const at::Tensor c = t.contiguous();
    v.insert(v.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return v;
}

TEST(Reshard, SaveOnOneLayoutLoadOnAnother) {
  const ReshardRole role = reshard_role();
  if (!role.active) GTEST_SKIP() << "run by the ckpt_reshard tests (ZERO_CKPT_RESHARD)";
  comm::Communicator& comm = world_comm();
  // 12 rows: 1, 2, 3 and 4 ranks split them alike, so that the saving and
  // the loading job train on the same rows.
  config::Config cfg = case_config(role.c, comm.world_size(), 12);
  const fs::path swap = role.dir / (role.save ? "swap-save" : "swap-load");
  if (role.nvme || role.param_nvme) {
    if (comm.rank() == 0) fs::create_directories(swap);
    comm.barrier()->wait();
  }
  if (role.nvme) {  // the state in a swap file, in pieces of at most 50 elements: streamed to and from the files
    cfg.zero_optimization.offload_optimizer.device = "nvme";
    cfg.zero_optimization.offload_optimizer.nvme_path = swap.string();
    cfg.zero_optimization.sub_group_size = 50;
  }
  if (role.param_nvme) {  // the parameter partition in a swap file: streamed too, its chunks cut anew by another world
    cfg.zero_optimization.offload_param.device = "nvme";
    cfg.zero_optimization.offload_param.nvme_path = swap.string();
  }
  Trainer t{ModelKind::kUnitMlp, cfg};
  if (role.save) {
    std::vector<float> losses;
    t.steps(0, kReshardSave, losses);
    t.engine->save_checkpoint(role.dir.string(), "step-3");
    const std::vector<float> at_save = flatten(t.engine->gather_master_params());
    losses.clear();
    t.steps(kReshardSave, kReshardSteps, losses);
    const std::vector<float> final_params = flatten(t.final_params());
    if (comm.rank() == 0) {
      write_floats(role.dir / "master_at_save.bin", at_save);
      write_floats(role.dir / "losses_after.bin", losses);
      write_floats(role.dir / "final.bin", final_params);
    }
    return;
  }
  t.engine->load_checkpoint(role.dir.string());
  // Data movement only: bitwise.
  const std::vector<float> loaded = flatten(t.engine->gather_master_params());
  const std::vector<float> saved = read_floats(role.dir / "master_at_save.bin");
  ASSERT_EQ(loaded.size(), saved.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < loaded.size(); ++i) differ += loaded[i] != saved[i];
  EXPECT_EQ(differ, 0u) << "master weights after the load differ from the saved ones";
  // Training on: as the saving job went on, within the parity tolerance
  // (another world size sums the gradients in another order).
  std::vector<float> losses;
  t.steps(kReshardSave, kReshardSteps, losses);
  const std::vector<float> ref_losses = read_floats(role.dir / "losses_after.bin");
  ASSERT_EQ(losses.size(), ref_losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], ref_losses[i], 1e-5f * (1 + std::abs(ref_losses[i])));
  const std::vector<float> fin = flatten(t.final_params()), ref = read_floats(role.dir / "final.bin");
  ASSERT_EQ(fin.size(), ref.size());
  for (std::size_t i = 0; i < fin.size(); ++i) ASSERT_NEAR(fin[i], ref[i], 1e-5 + 1e-5 * std::abs(ref[i])) << "element " << i;
}

// EngineOptions' rules are recorded per parameter in the manifest; a load
// into an engine with other settings (or none) says so once, naming a
// parameter, and one with the same settings says nothing. Training goes on
// with the loading engine's settings.
TEST(CheckpointSettings, RecordedPerParameterAndADifferenceIsSaid) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const config::Config cfg = make_config(2, true, false, world, kGlobalBatch / world, 1);
  const fs::path dir = shared_temp_dir(comm, "settings");
  EngineOptions rules;
  rules.weight_decay = no_decay_below_2d();
  rules.lr_scale = scale_below_2d(2.0f);
  std::vector<float> losses;
  {
    Trainer t{ModelKind::kTransformer, cfg, rules};
    t.steps(0, 2, losses);
    t.engine->save_checkpoint(dir.string(), "rules");
  }
  {
    Trainer t{ModelKind::kTransformer, cfg};
    t.steps(0, 2, losses);
    t.engine->save_checkpoint(dir.string(), "none");
  }
  // The manifest: biases and norms 0 and 2, the matrices the config's decay and 1.
  const ckpt::Manifest man = ckpt::parse_manifest(ckpt::read_text(dir / "rules" / ckpt::kManifestName), "rules");
  // ... and which zerocpp wrote it.
  EXPECT_EQ(nlohmann::json::parse(ckpt::read_text(dir / "rules" / ckpt::kManifestName)).value("zerocpp_version", ""),
            ZERO_VERSION_STRING);
  auto model = make_model(ModelKind::kTransformer);
  std::map<std::string, int> dims;
  for (const auto& np : model->named_parameters()) dims[np.key()] = static_cast<int>(np.value().dim());
  for (const ckpt::ParamRecord& p : man.params) {
    ASSERT_TRUE(p.weight_decay && p.lr_scale) << p.name;
    const bool low = dims.at(p.name) < 2;
    EXPECT_FLOAT_EQ(static_cast<float>(*p.weight_decay), low ? 0.0f : cfg.optimizer.weight_decay) << p.name;
    EXPECT_FLOAT_EQ(static_cast<float>(*p.lr_scale), low ? 2.0f : 1.0f) << p.name;
  }
  const ckpt::Manifest plain = ckpt::parse_manifest(ckpt::read_text(dir / "none" / ckpt::kManifestName), "none");
  for (const ckpt::ParamRecord& p : plain.params) EXPECT_FALSE(p.weight_decay || p.lr_scale) << p.name;

  // What the load says, through a log sink: the settings' line under its
  // own topic (a program that says it in its own words drops it there).
  auto load_says = [&](const EngineOptions& options, const std::string& tag) {
    Trainer t{ModelKind::kTransformer, cfg, options};
    std::string said;
    bool loaded_said = false;
    struct Restore {
      LogSink previous;
      ~Restore() { set_log_sink(std::move(previous)); }  // (also if the load throws)
    } restore;
    restore.previous = set_log_sink([&](const LogRecord& r) {
      if (r.topic == log_topic::checkpoint_param_settings) {
        EXPECT_EQ(r.level, LogLevel::warning);
        said += std::string(r.text) + "\n";
      }
      if (r.topic == log_topic::checkpoint && r.text.starts_with("loaded checkpoint ")) loaded_said = true;
      EXPECT_EQ(r.text.find("zerocpp: "), std::string_view::npos) << r.text;
    });
    t.engine->load_checkpoint(dir.string(), tag);
    EXPECT_EQ(loaded_said, comm.rank() == 0);
    std::vector<float> more;
    t.steps(2, 3, more);
    EXPECT_TRUE(std::isfinite(more.back()));
    return said;
  };
  const std::string same = load_says(rules, "rules");
  const std::string without = load_says(EngineOptions{}, "rules");
  const std::string added = load_says(rules, "none");
  if (comm.rank() == 0) {
    EXPECT_TRUE(same.empty()) << same;
    const std::size_t low = static_cast<std::size_t>(
        std::count_if(dims.begin(), dims.end(), [](const auto& d) { return d.second < 2; }));
    EXPECT_NE(without.find("was trained with other optimizer settings for " + std::to_string(low) + " of " +
                           std::to_string(dims.size()) + " parameters, such as '"),
              std::string::npos)
        << without;
    EXPECT_NE(without.find("weight decay 0 there, 0.01 here; lr scale 2 there, 1 here"), std::string::npos) << without;
    EXPECT_NE(added.find("(it records no settings per parameter: it was saved without EngineOptions' "),
              std::string::npos)
        << added;
    EXPECT_NE(added.find("weight decay 0.01 there, 0 here"), std::string::npos) << added;
  }
  comm.barrier()->wait();
  on_rank0([&] { rm_tree(dir); });
}

// Without a scheduler the checkpoint's rate stays in force (as DeepSpeed's
// optimizer state keeps it; the Trainer's own set_lr() made it 0.011): a
// config whose rate changed since the save is told so once, on rank 0, and
// set_lr() sets another. The same config says nothing.
TEST(CheckpointSettings, AnotherConfiguredRateIsSaidToYieldToTheCheckpoints) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const config::Config cfg = make_config(2, false, false, world, kGlobalBatch / world, 1);
  const fs::path dir = shared_temp_dir(comm, "rate");
  std::vector<float> losses;
  float saved_lr = 0;
  {
    Trainer t{ModelKind::kMlp, cfg};
    t.steps(0, 2, losses);
    t.engine->save_checkpoint(dir.string(), "r");
    saved_lr = t.engine->lr();
  }
  ASSERT_NE(saved_lr, cfg.optimizer.lr);
  std::ostringstream os;
  os << saved_lr;
  const std::string at_save = os.str();
  // What is said from the load through the next backward, with or without
  // a set_lr() in between (a loop that sets its rate chose it: nothing to say).
  auto load_says = [&](float lr, bool set_lr_first) {
    config::Config other = cfg;
    other.optimizer.lr = lr;
    Trainer t{ModelKind::kMlp, other};
    std::string said;
    struct Restore {
      LogSink previous;
      ~Restore() { set_log_sink(std::move(previous)); }
    } restore;
    restore.previous = set_log_sink([&](const LogRecord& r) {
      if (r.text.find("learning rate") != std::string_view::npos) said += std::string(r.text) + "\n";
    });
    t.engine->load_checkpoint(dir.string(), "r");
    EXPECT_EQ(t.engine->lr(), saved_lr);
    if (set_lr_first) {
      t.engine->set_lr(lr);
      EXPECT_EQ(t.engine->lr(), lr);
    }
    // One micro-batch of the loop, without its set_lr().
    const int micro = static_cast<int>(other.train_micro_batch_size_per_gpu);
    GlobalBatch gb = global_batch(ModelKind::kMlp, 2);
    t.engine->backward(micro_loss(ModelKind::kMlp, *t.model, gb.x.narrow(0, comm.rank() * micro, micro),
                                  gb.y.narrow(0, comm.rank() * micro, micro), t.engine->dtype()));
    t.engine->step();
    return said;
  };
  const std::string same = load_says(cfg.optimizer.lr, false), other = load_says(2 * cfg.optimizer.lr, false);
  const std::string chosen = load_says(2 * cfg.optimizer.lr, true);
  EXPECT_TRUE(same.empty()) << same;
  EXPECT_TRUE(chosen.empty()) << chosen;
  if (comm.rank() == 0) {
    EXPECT_NE(other.find("warning: the checkpoint's learning rate " + at_save + " stays in force"), std::string::npos)
        << other;
    EXPECT_NE(other.find("optimizer.params.lr, 0.01 when it was saved, is 0.02 now and is not used; call "
                         "engine.set_lr()"),
              std::string::npos)
        << other;
  } else {
    EXPECT_TRUE(other.empty()) << other;
  }
  comm.barrier()->wait();
  on_rank0([&] { rm_tree(dir); });
}

// Muon's state through a checkpoint: each parameter's momentum (exp_avg's
// place) and its half (the manifest's "muon": DeepSpeed's choice here, the
// MLP's weights with Muon, its biases with Adam); a run resumed from it goes
// on bitwise like the unbroken one. An engine that splits the parameters
// otherwise (EngineOptions::use_muon) refuses it, unchanged, naming the
// first parameter that changed halves.
TEST(CheckpointSettings, MuonResumesAndItsHalvesMustAgree) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  config::Config cfg = make_config(2, true, false, world, kGlobalBatch / world, 1);
  cfg.optimizer.type = "Muon";
  cfg.optimizer.momentum = 0.9f;
  cfg.optimizer.adam_lr = 3e-3f;
  const fs::path dir = shared_temp_dir(comm, "muon");
  constexpr int kSteps = 6;
  const RunResult unbroken = train(ModelKind::kMlp, cfg, comm, kSteps);
  expect_save_resume_like(ModelKind::kMlp, cfg, cfg, comm, kSteps, dir.string(), "muon", false, unbroken);

  const ckpt::Manifest man = ckpt::parse_manifest(ckpt::read_text(dir / "muon" / ckpt::kManifestName), "muon");
  EXPECT_EQ(man.optimizer, "Muon");
  for (const ckpt::ParamRecord& p : man.params) {
    ASSERT_TRUE(p.muon.has_value()) << p.name;
    EXPECT_EQ(*p.muon, p.shape.size() >= 2) << p.name;
  }

  EngineOptions other;
  other.use_muon = muon_except_named({"l2"});
  Trainer t{ModelKind::kMlp, cfg, other};
  const std::vector<at::Tensor> before = t.engine->gather_master_params();
  try {
    t.engine->load_checkpoint(dir.string(), "muon");
    ADD_FAILURE() << "the load did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("steps parameter 'l2.weight' with Muon, this engine with Adam"),
              std::string::npos)
        << e.what();
  }
  expect_bitwise_equal(t.engine->gather_master_params(), before);
  comm.barrier()->wait();
  on_rank0([&] { rm_tree(dir); });
}

}  // namespace
}  // namespace zero::test
