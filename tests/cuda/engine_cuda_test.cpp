// The engine on a GPU against the engine on the CPU (label "cuda"): the same
// GPT, data and config trained on both, step for step. The CPU engine is
// itself checked against torch.optim (tests/engine/engine_reference_test.cpp),
// so agreement here carries that reference over to the GPU path: its device
// Adam, the gradient norm and overflow check computed on the device, clipping,
// accumulation, loss scaling, offload to pinned host memory and the delayed
// update (on a GPU: gradients down and parameters up on a copy stream, the
// gradient norm on the device, accumulation on the device), and the NCCL
// communicator at world size 1.
//
// Tolerances: the two devices sum in different orders (GEMM tiles, norms), so
// fp32 agrees to ~1e-6 per step and bf16/fp16 to their rounding. The final
// update (master weights minus initial weights) must agree in relative L2 norm
// within 1e-3 (fp32) or 5e-2 (bf16/fp16; 16-bit Lion and Muon instead no
// further from the CPU's fp32 run than the CPU's own 16-bit run, see
// MatchesTheCpuEngine); losses and gradient norms per step
// within 1e-4 / 3e-2 relative; fp16 skips the same steps. A wrong grad scale,
// a missed micro-batch, clipping or an update not applied moves them by far
// more (scripts/mutants).
//
// Two ranks on one GPU are not tested: NCCL refuses two ranks of one
// communicator on the same device ("Duplicate GPU detected"), and the GPU
// machine has one.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/utils.h>

#include "cuda_test_util.h"
#include "zero/ckpt/checkpoint_dir.h"
#include "zero/comm/communicator.h"
#include "zero/config/config.h"
#include "zero/core/error.h"
#include "zero/engine/engine.h"
#include "zero/models/gpt.h"
#include "zero/zero/memory_estimate.h"
#include "zero/zero/memory_plan.h"
#include "zero/zero/unit.h"
#if ZERO_HAVE_NCCL
#include "zero/cuda/nccl_communicator.h"
#endif

namespace zero {
namespace {

struct Case {
  std::string name;
  int stage = 0;
  int accum = 1;
  float clip = 0.0f;
  std::string dtype = "fp32";  // fp32, bf16, fp16 (dynamic loss scale)
  std::string offload = "none";
  bool dpu = false;
  std::string optimizer = "AdamW";
  bool nccl = false;  // the engine on an NCCL communicator of world 1
  bool offload_param = false;  // stage 3: the parameter partition in pinned host memory
  float ratio = 1.0f;          // offload_optimizer.ratio: the rest stepped on the GPU
  bool param_nvme = false;     // stage 3: the parameter partition on NVMe (pinned buffers, read ahead)
  bool rules = false;          // EngineOptions: no decay below 2-D, those at 3x the rate
  bool frozen_mlp = false;     // the blocks' MLP frozen (a base under adapters: stage 3 partitions it)
  bool published = false;      // offload_optimizer.publish_in_backward (DPU, stages 1-2)
};

struct TrainRun {
  std::vector<float> losses, grad_norms, clipped_norms;
  std::int64_t skipped = 0;
  std::vector<at::Tensor> initial, final;
};

constexpr int kSteps = 6;

models::GptConfig tiny() {
  models::GptConfig c;
  c.vocab_size = 256;
  c.block_size = 32;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 64;
  return c;
}

// offload "nvme": the swap files' folder (each engine's lock is released
// before the next one is built).
std::string nvme_dir() {
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("zero_cuda_nvme_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d.string();
}

config::Config make_config(const Case& k) {
  nlohmann::json c = {
      {"train_micro_batch_size_per_gpu", 4},
      {"gradient_accumulation_steps", k.accum},
      {"gradient_clipping", k.clip},
      {"optimizer", {{"type", k.optimizer}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.05}}}}},
      {"zero_optimization",
       {{"stage", k.stage},
        {"reduce_bucket_size", 20000},  // several buckets
        // Stage 3: the blocks partitioned (all their parameters are small).
        {"stage3_param_persistence_threshold", 0},
        {"offload_param",
         {{"device", k.param_nvme ? "nvme" : k.offload_param ? "cpu" : "none"},
          {"nvme_path", k.param_nvme ? nvme_dir() : ""}}},
        {"offload_optimizer",
         {{"device", k.offload}, {"nvme_path", k.offload == "nvme" ? nvme_dir() : ""},
          {"delayed_param_update", k.dpu}, {"delayed_param_update_warmup_steps", 1},
          {"ratio", k.offload == "cpu" ? k.ratio : 1.0f}, {"publish_in_backward", k.published}}}}},
      {"steps_per_print", 1000000}};
  if (k.dtype == "bf16") c["bf16"] = {{"enabled", true}};
  // 2^20: the first steps overflow and are skipped, then the scale settles.
  if (k.dtype == "fp16") c["fp16"] = {{"enabled", true}, {"initial_scale_power", 20}, {"loss_scale_window", 2}};
  return config::parse_config(c.dump(), 1, "<engine_cuda_test>");
}

TrainRun train(const Case& k, const at::Device& device) {
  torch::manual_seed(7);
  auto model = std::make_shared<models::Gpt>(tiny());
  if (k.frozen_mlp) {
    for (const auto& item : model->named_parameters()) {
      if (item.key().find(".fc.") != std::string::npos) item.value().set_requires_grad(false);
    }
  }
  TrainRun r;
  for (const auto& p : model->parameters()) {
    if (p.requires_grad()) r.initial.push_back(p.detach().clone());
  }
  model->to(device);
  std::unique_ptr<comm::Communicator> single = comm::make_single_process_communicator();
  std::unique_ptr<comm::Communicator> nccl;
#if ZERO_HAVE_NCCL
  if (k.nccl && device.is_cuda()) nccl = cuda::make_nccl_communicator(*single, device.index());
#endif
  EngineOptions options;
  if (k.rules) {
    options.weight_decay = no_decay_below_2d();
    options.lr_scale = [](const std::string&, const at::Tensor& p) -> std::optional<float> {
      if (p.dim() < 2) return 3.0f;
      return std::nullopt;
    };
  }
  // Muon: the GPT's block matrices (its tables, one of them the tied head, with Adam).
  if (k.optimizer == "Muon") options.use_muon = muon_except_named({"wte", "wpe"});
  Engine engine(model, make_config(k), nccl ? *nccl : *single, std::move(options));
  for (int s = 0; s < kSteps; ++s) {
    for (int j = 0; j < k.accum; ++j) {
      torch::manual_seed(1000 + s * 10 + j);
      at::Tensor b = at::randint(256, {4, 33}, at::TensorOptions().dtype(at::kLong)).to(device);
      at::Tensor loss = model->loss(b.narrow(1, 0, 32), b.narrow(1, 1, 32));
      engine.backward(loss);
      r.losses.push_back(loss.item<float>());
      if (engine.step()) {
        r.grad_norms.push_back(engine.stats().grad_norm);
        r.clipped_norms.push_back(engine.stats().clipped_grad_norm);
      }
    }
  }
  engine.flush();
  r.skipped = engine.stats().skipped;
  r.final = engine.gather_master_params();
  return r;
}

// ||a_update - b_update|| / ||b_update||, updates from the common start.
double relative_update_error(const TrainRun& a, const TrainRun& b) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < b.final.size(); ++i) {
    const at::Tensor ua = a.final[i].cpu() - a.initial[i];
    const at::Tensor ub = b.final[i].cpu() - b.initial[i];
    diff += (ua - ub).pow(2).sum().item<double>();
    ref += ub.pow(2).sum().item<double>();
  }
  return std::sqrt(diff / ref);
}

void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel, const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], rel * std::abs(cpu[i]) + 1e-6) << what << " " << i;
  }
}

class EngineCuda : public ::testing::TestWithParam<Case> {};

TEST_P(EngineCuda, MatchesTheCpuEngine) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  const Case& k = GetParam();
#if !ZERO_HAVE_NCCL
  if (k.nccl) GTEST_SKIP() << "built without NCCL";
#endif
  const TrainRun cpu = train(k, at::Device(at::kCPU));
  const TrainRun gpu = train(k, at::Device(at::kCUDA, 0));
  const bool half = k.dtype != "fp32";
  // Adagrad's first steps move each weight by about lr * sign(g): a tiny
  // gradient whose rounding differs between the devices moves its weight a
  // whole step the other way, so its runs drift apart faster than Adam's.
  // Muon orthogonalizes with LibTorch's matrix products on each device
  // (fp32 both, other summation orders): held to Adagrad's bounds.
  const bool adagrad = k.optimizer == "Adagrad" || k.optimizer == "Muon";
  // Lion steps every weight by +-lr on a sign: one that differs between the
  // devices moves its weight 2 lr, so Lion is held to the 16-bit bounds.
  const bool lion = k.optimizer == "Lion";
  const double per_step = half || lion ? 3e-2 : adagrad ? 1e-3 : 1e-4;
  expect_close(gpu.losses, cpu.losses, per_step, "loss");
  expect_close(gpu.grad_norms, cpu.grad_norms, per_step, "grad norm");
  expect_close(gpu.clipped_norms, cpu.clipped_norms, per_step, "clipped grad norm");
  EXPECT_EQ(gpu.skipped, cpu.skipped);
  const double err = relative_update_error(gpu, cpu);
  if (half && (lion || k.optimizer == "Muon")) {
    // In 16 bits Lion's signs and Muon's orthogonalized directions are set by
    // rounding on this small model: two bf16 runs that round differently
    // (the devices' kernels) are as far apart as bf16 is from fp32 (measured
    // on an H200: Lion 0.29 between the devices against 0.31 between bf16
    // and fp32 on the CPU; Muon 0.089 against 0.086). So the GPU's run is
    // held to the precision's own distance from the fp32 run on the CPU: no
    // further from it than the CPU's 16-bit run, with half again as margin.
    // A wrong sign, rate or a step not applied moves it by several times that.
    Case full = k;
    full.dtype = "fp32";
    const TrainRun fp32 = train(full, at::Device(at::kCPU));
    const double own = relative_update_error(cpu, fp32), gpu_err = relative_update_error(gpu, fp32);
    std::printf("[ measured ] %s: update difference GPU-CPU %.4f; from the fp32 run: CPU %.4f, GPU %.4f\n",
                k.name.c_str(), err, own, gpu_err);
    EXPECT_LT(gpu_err, 1.5 * own + 1e-2) << "the GPU's " << k.dtype << " run is further from the fp32 run than the "
                                         << "CPU's (" << own << ")";
  } else {
    EXPECT_LT(err, half || lion ? 5e-2 : adagrad ? 1e-2 : 1e-3) << "relative difference of the updates";
  }
  // The run trained: the update is not empty.
  double moved = 0;
  for (std::size_t i = 0; i < cpu.final.size(); ++i) moved += (gpu.final[i] - gpu.initial[i]).abs().sum().item<double>();
  EXPECT_GT(moved, 0.0);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (int stage : {0, 1, 2, 3}) {
    for (int accum : {1, 2}) {
      for (float clip : {0.0f, 0.05f}) {
        Case c;
        c.stage = stage;
        c.accum = accum;
        c.clip = clip;
        c.name = "fp32_stage" + std::to_string(stage) + "_accum" + std::to_string(accum) + (clip > 0 ? "_clip" : "");
        v.push_back(c);
      }
    }
  }
  auto add = [&](std::string name, int stage, int accum, float clip, std::string dtype, std::string offload = "none",
                 bool dpu = false, std::string optimizer = "AdamW", bool nccl = false) {
    v.push_back({std::move(name), stage, accum, clip, std::move(dtype), std::move(offload), dpu,
                 std::move(optimizer), nccl});
  };
  add("bf16_stage0_accum2_clip", 0, 2, 0.05f, "bf16");
  add("bf16_stage1", 1, 1, 0.0f, "bf16");
  add("bf16_stage2_accum2_clip", 2, 2, 0.05f, "bf16");
  add("fp16_stage0_dynamic_scale", 0, 1, 0.05f, "fp16");
  add("fp16_stage2_dynamic_scale_accum2", 2, 2, 0.0f, "fp16");
  add("adam_l2_stage2_clip", 2, 1, 0.05f, "fp32", "none", false, "Adam");
  add("offload_fp32_stage1", 1, 1, 0.05f, "fp32", "cpu");
  add("offload_bf16_stage2_accum2", 2, 2, 0.05f, "bf16", "cpu");
  add("offload_bf16_stage2_dpu", 2, 1, 0.05f, "bf16", "cpu", true);
  add("offload_fp32_stage2_dpu_accum2", 2, 2, 0.0f, "fp32", "cpu", true);
  add("offload_fp16_stage2_accum2_dynamic_scale", 2, 2, 0.05f, "fp16", "cpu");
  add("offload_bf16_stage1_dpu_accum3", 1, 3, 0.05f, "bf16", "cpu", true);
  add("adagrad_offload_stage2", 2, 1, 0.0f, "fp32", "cpu", false, "Adagrad");
  // Lion: the fused device Lion (stages 0 and 3, bf16), and the CPU Lion
  // of the offload with the delayed update.
  add("lion_stage0_clip", 0, 1, 0.05f, "fp32", "none", false, "Lion");
  add("lion_bf16_stage3", 3, 1, 0.05f, "bf16", "none", false, "Lion");
  add("lion_offload_stage2_dpu", 2, 1, 0.05f, "fp32", "cpu", true, "Lion");
  // Muon: orthogonalized on the GPU, the Adam half by the fused device Adam
  // (stages 0 and 3, bf16 at 3); with offload, the state in host memory,
  // each matrix copied up to be orthogonalized, with the delayed update.
  add("muon_stage0_clip", 0, 1, 0.05f, "fp32", "none", false, "Muon");
  add("muon_bf16_stage3_accum2", 3, 2, 0.05f, "bf16", "none", false, "Muon");
  add("muon_offload_stage2_dpu", 2, 1, 0.05f, "fp32", "cpu", true, "Muon");
  add("nccl_fp32_stage0", 0, 2, 0.05f, "fp32", "none", false, "AdamW", true);
  add("nccl_bf16_stage2_clip", 2, 1, 0.05f, "bf16", "none", false, "AdamW", true);
  add("bf16_stage3_accum2_clip", 3, 2, 0.05f, "bf16");
  add("nccl_bf16_stage3_clip", 3, 1, 0.05f, "bf16", "none", false, "AdamW", true);
  add("offload_bf16_stage3_dpu", 3, 1, 0.05f, "bf16", "cpu", true);
  // The optimizer state on NVMe: the CPU step's pieces through the swap file
  // (the master seeded from device memory), stages 2 and 3.
  add("nvme_bf16_stage2_dpu", 2, 1, 0.05f, "bf16", "nvme", true);
  add("nvme_fp32_stage3_accum2", 3, 2, 0.05f, "fp32", "nvme");
  Case params_offloaded{"offload_param_bf16_stage3_dpu", 3, 1, 0.05f, "bf16", "cpu", true};
  params_offloaded.offload_param = true;
  v.push_back(params_offloaded);
  // Twin-Flow: part of the optimizer state stepped on the GPU by the device
  // Adam beside the CPU step (with DPU its update waits for the CPU's).
  auto share = [&](Case c, float ratio) {
    c.name += "_ratio" + std::to_string(static_cast<int>(ratio * 100));
    c.ratio = ratio;
    v.push_back(c);
  };
  share(Case{"offload_bf16_stage2_dpu", 2, 1, 0.05f, "bf16", "cpu", true}, 0.5f);
  share(Case{"offload_fp32_stage2_accum2", 2, 2, 0.05f, "fp32", "cpu"}, 0.3f);
  share(Case{"offload_fp16_stage1_dynamic_scale", 1, 1, 0.05f, "fp16", "cpu"}, 0.6f);
  share(params_offloaded, 0.5f);
  share(Case{"lion_offload_bf16_stage2_dpu", 2, 1, 0.05f, "bf16", "cpu", true, "Lion"}, 0.5f);
  // The parameter partition on NVMe: its chunks read ahead into pinned
  // buffers and copied up on the gather lane, a buffer reused only after its
  // copy; with the optimizer state in host memory and on NVMe.
  Case params_nvme{"param_nvme_bf16_stage3_dpu", 3, 1, 0.05f, "bf16", "cpu", true};
  params_nvme.param_nvme = true;
  v.push_back(params_nvme);
  Case all_nvme{"param_nvme_all_nvme_fp32_stage3_accum2", 3, 2, 0.05f, "fp32", "nvme"};
  all_nvme.param_nvme = true;
  v.push_back(all_nvme);
  // Frozen weights of units (the blocks' first MLP layer): their partition
  // on the device, or in pinned host memory gathered on the lane with the
  // parameters' (offload_param), gathered again in backward.
  for (Case c : {Case{"frozen_bf16_stage3_accum2", 3, 2, 0.05f, "bf16"},
                 Case{"frozen_offload_param_bf16_stage3_dpu", 3, 1, 0.05f, "bf16", "cpu", true}}) {
    c.frozen_mlp = true;
    c.offload_param = c.offload == "cpu";
    v.push_back(c);
  }
  // The delayed update taken in during backward (publish_in_backward): each
  // piece up on the copy stream once backward has reduced its bucket,
  // ordered after backward's last reads of it on the device.
  for (Case c : {Case{"published_bf16_stage2_dpu", 2, 1, 0.05f, "bf16", "cpu", true},
                 Case{"published_bf16_stage2_dpu_ratio50", 2, 1, 0.05f, "bf16", "cpu", true},
                 Case{"published_fp32_stage1_accum2_dpu", 1, 2, 0.05f, "fp32", "cpu", true}}) {
    c.published = true;
    if (c.name.find("ratio50") != std::string::npos) c.ratio = 0.5f;
    v.push_back(c);
  }
  // Settings per parameter (EngineOptions' rules): the device Adam run by
  // run, the CPU Adam's runs beside a GPU, the device share, and the update
  // written over the gradients (offload, bf16, no accumulation).
  for (Case c : {Case{"rules_bf16_stage2", 2, 1, 0.05f, "bf16"}, Case{"rules_offload_bf16_stage2", 2, 1, 0.05f, "bf16", "cpu"},
                 Case{"rules_offload_bf16_stage3_dpu_ratio50", 3, 1, 0.05f, "bf16", "cpu", true}}) {
    c.rules = true;
    if (c.name.find("ratio50") != std::string::npos) c.ratio = 0.5f;
    v.push_back(c);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, EngineCuda, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// A checkpoint saved with the delayed update pending, loaded on a GPU: the
// update is read whole into the pinned buffer, and the first step() after
// the load copies it up piece by piece. No job runs for it, so that copy
// must not wait for one (it did: the step hung). The resumed losses are
// the unbroken run's, bit for bit; also with publish_in_backward.
TEST(EngineCudaCheckpoint, ResumesWithTheDelayedUpdatePending) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  const at::Device device(at::kCUDA, 0);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("zero_cuda_resume_" + std::to_string(::getpid()));
  constexpr int kSave = 3, kSteps = 6;
  auto single = comm::make_single_process_communicator();
  for (const bool published : {false, true}) {
    Case k{"resume", 2, 1, 0.05f, "bf16", "cpu", true};
    k.published = published;
    auto steps = [&](Engine& engine, models::Gpt& model, int from, int to, std::vector<float>& losses) {
      for (int s = from; s < to; ++s) {
        torch::manual_seed(1000 + s);
        at::Tensor b = at::randint(256, {4, 33}, at::TensorOptions().dtype(at::kLong)).to(device);
        at::Tensor loss = model.loss(b.narrow(1, 0, 32), b.narrow(1, 1, 32));
        engine.backward(loss);
        losses.push_back(loss.item<float>());
        engine.step();
      }
    };
    auto fresh = [&] {
      torch::manual_seed(7);
      auto model = std::make_shared<models::Gpt>(tiny());
      model->to(device);
      return model;
    };
    std::vector<float> unbroken, resumed;
    {
      auto model = fresh();
      Engine engine(model, make_config(k), *single);
      steps(engine, *model, 0, kSteps, unbroken);
    }
    {
      auto model = fresh();
      Engine engine(model, make_config(k), *single);
      steps(engine, *model, 0, kSave, resumed);
      engine.save_checkpoint(dir.string(), "step-3");
    }
    auto model = fresh();
    Engine engine(model, make_config(k), *single);
    engine.load_checkpoint(dir.string(), "step-3");
    steps(engine, *model, kSave, kSteps, resumed);
    ASSERT_EQ(resumed.size(), unbroken.size());
    for (std::size_t s = 0; s < unbroken.size(); ++s) {
      EXPECT_EQ(resumed[s], unbroken[s]) << "published " << published << ", step " << s + 1;
    }
    std::error_code ec;
    ckpt::remove_tree(dir, ec);  // (not std::filesystem::remove_all: zero/ckpt/checkpoint_dir.h)
  }
}

// offload_optimizer.publish_in_backward on a GPU: unset, off and silent;
// said true, on where it applies (one rank, stage 1 or 2, the delayed
// update on the CPU Adam) and ignored with a warning at stage 3.
TEST(EngineCudaDefaults, PublishInBackwardIsOnOnlyWhereSaid) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  auto single = comm::make_single_process_communicator();
  for (const bool said : {false, true}) {
    for (const int stage : {2, 3}) {
      auto model = std::make_shared<models::Gpt>(tiny());
      model->to(at::Device(at::kCUDA, 0));
      config::Config cfg = make_config(Case{"publish", stage, 1, 0.05f, "bf16", "cpu", true});
      if (said) {
        cfg.zero_optimization.offload_optimizer.publish_in_backward = true;
      } else {
        cfg.zero_optimization.offload_optimizer.publish_in_backward.reset();
      }
      testing::internal::CaptureStderr();
      bool on = false;
      {
        Engine engine(model, cfg, *single);
        on = engine.stats().publish_in_backward;
      }
      const std::string err = testing::internal::GetCapturedStderr();
      EXPECT_EQ(on, said && stage == 2) << "said " << said << ", stage " << stage;
      EXPECT_EQ(err.find("publish_in_backward is ignored: stage 3") != std::string::npos, said && stage == 3) << err;
    }
  }
}

// What the engine refuses on a GPU, before it allocates anything.
TEST(EngineCudaErrors, AdagradWithoutOffloadIsRefused) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  auto model = std::make_shared<models::Gpt>(tiny());
  model->to(at::Device(at::kCUDA, 0));
  auto single = comm::make_single_process_communicator();
  Case k;
  k.optimizer = "Adagrad";
  try {
    Engine engine(model, make_config(k), *single);
    FAIL() << "Adagrad on the GPU without offload was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offload the optimizer"), std::string::npos) << e.what();
  }
  // The module is untouched and trainable by another engine (destroyed
  // before the next try: one engine per module).
  { Engine ok(model, make_config(Case{}), *single); }
  // Offloaded in part, its device share would need a device Adagrad.
  k.offload = "cpu";
  k.stage = 2;
  k.ratio = 0.5f;
  try {
    Engine engine(model, make_config(k), *single);
    FAIL() << "Adagrad with a device share was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ratio 1"), std::string::npos) << e.what();
  }
}

// A model built on the CPU (or on meta) and trained on the GPU through
// EngineOptions::device: at stage 3 the device never holds the model, only
// the partition (none with offload_param), one bucket in fp32 (and its bf16
// copy) and the kept parameters, measured by the CUDA allocator's peak while the engine is
// built (the bound from the model's sizes); and it trains exactly as the
// same model built on meta and filled on the GPU.
struct BuiltElsewhere {
  bool offload_param;
};
class EngineCudaBuild : public ::testing::TestWithParam<BuiltElsewhere> {};

TEST_P(EngineCudaBuild, DeviceHoldsThePartitionNotTheModel) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  const bool offload_param = GetParam().offload_param;
  models::GptConfig g = tiny();
  g.n_layer = 6;
  g.n_embd = 256;
  const at::Device gpu(at::kCUDA, 0);
  auto single = comm::make_single_process_communicator();
  Case k;
  k.stage = 3;
  k.dtype = "bf16";
  k.offload = "cpu";
  k.offload_param = offload_param;
  config::Config cfg = make_config(k);
  cfg.zero_optimization.reduce_bucket_size = 1 << 20;
  std::int64_t psi = 0, kept = 0, largest = 0, tensors = 0;
  auto run = [&](bool on_meta) {
    torch::manual_seed(7);
    auto model = std::make_shared<models::Gpt>(g, on_meta);
    psi = kept = largest = tensors = 0;
    for (const auto& item : model->named_children()) {
      std::int64_t n = 0;
      for (const at::Tensor& p : item.value()->parameters()) n += p.numel();
      tensors += static_cast<std::int64_t>(item.value()->parameters().size());
      psi += n;
      if (zero::is_unit(*item.value())) {
        largest = std::max(largest, n);
      } else {
        kept += n;
      }
    }
    EngineOptions o;
    o.device = gpu;
    if (on_meta) {
      o.init = [m = model.get()](const std::string& name, const at::Tensor& v) { m->init_parameter(name, v); };
    }
    torch::cuda::synchronize(0);
    at::accelerator::resetPeakStats(0);
    const std::int64_t before = at::accelerator::getDeviceStats(0).allocated_bytes[0].current;
    std::vector<float> losses;
    Engine engine(model, cfg, *single, std::move(o));
    torch::cuda::synchronize(0);
    const std::int64_t peak = at::accelerator::getDeviceStats(0).allocated_bytes[0].peak - before;
    const std::int64_t slack = tensors * static_cast<std::int64_t>(kPlanAlignElements);  // padding of every bucket, at most
    // The partition, one bucket in fp32 and its bf16 copy (made while the
    // fp32 one lives), the kept parameters, and 1 MiB for the rest.
    const std::int64_t bound = (offload_param ? 0 : 2 * (psi + slack)) +
                               (4 + 2) * (std::max(largest, kept) + slack) + 2 * (kept + slack) + (1 << 20);
    std::printf("[ measured ] built on %s, offload_param=%d: device peak while built %lld B, bound %lld B, the model "
                "in fp32 %lld B\n",
                on_meta ? "meta" : "the CPU", offload_param, static_cast<long long>(peak),
                static_cast<long long>(bound), static_cast<long long>(4 * psi));
    EXPECT_LE(peak, bound);
    EXPECT_LT(peak, 4 * psi) << "the device never held the model in fp32";
    for (int s = 0; s < 3; ++s) {
      torch::manual_seed(1000 + s);
      at::Tensor b = at::randint(256, {4, 33}, at::TensorOptions().dtype(at::kLong)).to(gpu);
      at::Tensor loss = model->loss(b.narrow(1, 0, 32), b.narrow(1, 1, 32));
      engine.backward(loss);
      engine.step();
      losses.push_back(loss.item<float>());
    }
    return losses;
  };
  const std::vector<float> from_cpu = run(false);
  const std::vector<float> from_meta = run(true);
  EXPECT_EQ(from_cpu, from_meta) << "the same weights whichever way the model was built";
}

INSTANTIATE_TEST_SUITE_P(Cases, EngineCudaBuild, ::testing::Values(BuiltElsewhere{false}, BuiltElsewhere{true}),
                         [](const auto& info) { return info.param.offload_param ? "offload_param" : "partition"; });

// Without EngineOptions::device the module must be on one device.
TEST(EngineCudaErrors, ModuleOnTwoDevicesIsRefused) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  auto model = std::make_shared<models::Gpt>(tiny());
  model->to(at::Device(at::kCUDA, 0));
  for (const auto& child : model->named_children()) {
    if (child.key() == "ln_f") child.value()->to(at::kCPU);  // the final LayerNorm left on the host
  }
  auto single = comm::make_single_process_communicator();
  try {
    Engine engine(model, make_config(Case{}), *single);
    FAIL() << "a module on the GPU and the CPU was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("is on cpu but parameter"), std::string::npos) << msg;
    EXPECT_NE(msg.find("EngineOptions::device"), std::string::npos) << msg;
  }
}

// The GPT's activation checkpoint on a GPU under CUDA autocast (bf16, and
// fp16, whose casts differ): the recomputation in backward, which stops at
// the MLP's activation and gives the last linear's gradients from
// LinearBackwardOnly, matches a plain backward. A recomputation in another
// precision moves the gradients by about 1e-2 relative.
TEST(GptCudaCheckpoint, SameGradientsAsWithoutUnderAutocast) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    torch::manual_seed(5);
    models::Gpt model(tiny());
    model.to(at::Device(at::kCUDA, 0));
    const at::Tensor batch =
        at::randint(0, tiny().vocab_size, {2, 33}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
    auto grads = [&](bool checkpoint) {
      model.set_activation_checkpointing(checkpoint);
      for (auto& p : model.parameters()) p.mutable_grad().reset();
      at::Tensor loss;
      {
        at::autocast::set_autocast_enabled(at::kCUDA, true);
        at::autocast::set_autocast_dtype(at::kCUDA, dtype);
        at::autocast::increment_nesting();
        loss = model.loss(batch.narrow(1, 0, 32), batch.narrow(1, 1, 32));
        if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
        at::autocast::set_autocast_enabled(at::kCUDA, false);
      }
      loss.backward();
      std::vector<at::Tensor> out;
      for (auto& p : model.parameters()) out.push_back(p.grad().to(at::kCPU, at::kDouble));
      return out;
    };
    const auto plain = grads(false);
    const auto ckpt = grads(true);
    ASSERT_EQ(plain.size(), ckpt.size());
    for (std::size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(ckpt[i].dtype(), plain[i].dtype());
      const double scale = plain[i].abs().max().item<double>();
      const double diff = (ckpt[i] - plain[i]).abs().max().item<double>();
      EXPECT_GT(scale, 0.0) << "parameter " << i << " got no gradient";
      EXPECT_LE(diff, 1e-3 * scale + 1e-12) << at::toString(dtype) << " parameter " << i;
    }
  }
}

// Issue 18: with the model on a GPU the engine's host memory (pinned offload
// buffers) is what zero-estimate predicts, within 5%, and at most 16 bytes
// per parameter with the delayed update in bf16 (fp32 master 4, moments 8,
// the bf16 gradients as they come down 2, twice with the delayed update;
// the update written over them), 14 without; stage 3 with offload_param adds
// the parameter partition (2).
TEST(EngineCudaLedger, HostBytesAreTheEstimatesAndSixteenPerParameter) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  models::GptConfig g = tiny();
  g.n_layer = 4;
  g.n_embd = 256;
  const at::Device gpu(at::kCUDA, 0);
  struct Variant {
    int stage;
    bool dpu, offload_param;
    double per_param;  // the host bytes per parameter the issue allows
  };
  for (const Variant v : {Variant{2, false, false, 14}, Variant{2, true, false, 16}, Variant{3, true, false, 16},
                          Variant{3, true, true, 18}}) {
    const std::string what = "stage " + std::to_string(v.stage) + (v.dpu ? " dpu" : "") +
                             (v.offload_param ? " offload_param" : "");
    Case k;
    k.stage = v.stage;
    k.dtype = "bf16";
    k.offload = "cpu";
    k.dpu = v.dpu;
    k.offload_param = v.offload_param;
    torch::manual_seed(7);
    auto model = std::make_shared<models::Gpt>(g);
    model->to(gpu);
    auto single = comm::make_single_process_communicator();
    Engine engine(model, make_config(k), *single);
    for (int s = 0; s < 3; ++s) {  // past the delayed update's warm-up step
      torch::manual_seed(1000 + s);
      at::Tensor b = at::randint(256, {4, 33}, at::TensorOptions().dtype(at::kLong)).to(gpu);
      engine.backward(model->loss(b.narrow(1, 0, 32), b.narrow(1, 1, 32)));
      engine.step();
    }
    engine.flush();
    const std::int64_t host = engine.ledger().snapshot().tier_peak[static_cast<int>(memory::Tier::kHost)];
    EstimateInput in;
    in.params = g.num_parameters();
    in.param_numels = g.parameter_numels();
    in.param_units = g.parameter_units();
    in.stage = v.stage;
    in.offload = true;
    in.dpu = v.dpu;
    in.on_gpu = true;
    in.offload_param = v.offload_param;
    in.bucket_numel = 20000;
    in.persistence_threshold = 0;
    const MemoryEstimate e = estimate_memory(in);
    std::printf("[ measured ] %s: host peak %lld B = %.2f B/param, estimate %lld B\n", what.c_str(),
                static_cast<long long>(host), static_cast<double>(host) / static_cast<double>(in.params),
                static_cast<long long>(e.host_total()));
    EXPECT_NEAR(static_cast<double>(host), static_cast<double>(e.host_total()), 0.05 * e.host_total()) << what;
    // Padding: the partition is padded per bucket, at most kPlanAlignElements per bucket and buffer.
    EXPECT_LE(static_cast<double>(host), v.per_param * static_cast<double>(in.params) * 1.02) << what;
  }
}

#if ZERO_HAVE_NCCL
TEST(EngineCudaErrors, NcclWithACpuModuleIsRefused) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  auto model = std::make_shared<models::Gpt>(tiny());
  auto single = comm::make_single_process_communicator();
  auto nccl = cuda::make_nccl_communicator(*single, 0);
  try {
    Engine engine(model, make_config(Case{}), *nccl);
    FAIL() << "an NCCL communicator with a CPU module was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("module is on the CPU"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
}  // namespace zero
