// A deterministic training loop over a fixed global batch, split over the
// ranks the way a data-parallel job splits it. Used by the parity, DPU and
// formula tests.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <torch/utils.h>

#include "test_models.h"
#include "zero/comm/communicator.h"
#include "zero/engine/engine.h"

namespace zero::test {

enum class ModelKind { kMlp, kTransformer, kTiedMlp, kUnitMlp, kSharedUnitMlp, kLoraMlp };

// The job's communicator (MPI under mpirun, else one process), made once.
inline comm::Communicator& world_comm() {
  static std::unique_ptr<comm::Communicator> c = comm::make_communicator();
  return *c;
}
constexpr int kGlobalBatch = 16;

struct RunResult {
  std::vector<float> losses;         // global mean loss per optimizer step
  std::vector<at::Tensor> params;    // final fp32 master weights
  std::vector<StepStats> stats;
};

inline std::shared_ptr<torch::nn::Module> make_model(ModelKind kind) {
  torch::manual_seed(1234);
  if (kind == ModelKind::kMlp) return std::make_shared<Mlp>();
  if (kind == ModelKind::kTiedMlp) return std::make_shared<TiedMlp>();
  if (kind == ModelKind::kUnitMlp) return std::make_shared<UnitMlp>();
  if (kind == ModelKind::kSharedUnitMlp) return std::make_shared<SharedUnitMlp>();
  if (kind == ModelKind::kLoraMlp) return std::make_shared<LoraMlp>();
  return std::make_shared<TinyTransformer>();
}

// The global batch, the same on every rank and (as the parity oracle asks: a
// fixed global batch) on every step, so that the loss must fall.
struct GlobalBatch {
  at::Tensor x, y;
};
inline GlobalBatch global_batch(ModelKind kind, int /*step*/) {
  torch::manual_seed(1000);
  if (kind != ModelKind::kTransformer) {
    at::Tensor x = at::randn({kGlobalBatch, 16});
    return {x, at::sin(x.narrow(1, 0, 4) * 2.0) + 0.1 * at::randn({kGlobalBatch, 4})};
  }
  at::Tensor idx = at::randint(TinyTransformer::kVocab, {kGlobalBatch, TinyTransformer::kSeq + 1});
  return {idx.narrow(1, 0, TinyTransformer::kSeq), idx.narrow(1, 1, TinyTransformer::kSeq)};
}

inline at::Tensor micro_loss(ModelKind kind, torch::nn::Module& model, const at::Tensor& x,
                             const at::Tensor& y, c10::ScalarType dtype) {
  if (kind == ModelKind::kMlp) {
    at::Tensor out = static_cast<Mlp&>(model).forward(x.to(dtype));
    return at::mse_loss(out.to(at::kFloat), y);
  }
  if (kind == ModelKind::kTiedMlp) {
    at::Tensor out = static_cast<TiedMlp&>(model).forward(x.to(dtype));
    return at::mse_loss(out.to(at::kFloat), y);
  }
  if (kind == ModelKind::kUnitMlp) {
    at::Tensor out = static_cast<UnitMlp&>(model).forward(x.to(dtype));
    return at::mse_loss(out.to(at::kFloat), y);
  }
  if (kind == ModelKind::kSharedUnitMlp) {
    at::Tensor out = static_cast<SharedUnitMlp&>(model).forward(x.to(dtype));
    return at::mse_loss(out.to(at::kFloat), y);
  }
  if (kind == ModelKind::kLoraMlp) {
    at::Tensor out = static_cast<LoraMlp&>(model).forward(x.to(dtype));
    return at::mse_loss(out.to(at::kFloat), y);
  }
  at::Tensor logits = static_cast<TinyTransformer&>(model).forward(x);
  return at::cross_entropy_loss(logits.to(at::kFloat).reshape({-1, TinyTransformer::kVocab}),
                                y.reshape({-1}));
}

// A plain LibTorch reference step's backward: the global batch in `accum`
// micro-batches, each loss divided by `accum` (fp32). Returns the mean loss.
inline float accumulate_reference_grads(ModelKind kind, torch::nn::Module& model,
                                        const GlobalBatch& gb, int accum) {
  float loss_sum = 0.0f;
  const int micro = kGlobalBatch / accum;
  for (int j = 0; j < accum; ++j) {
    at::Tensor loss = micro_loss(kind, model, gb.x.narrow(0, j * micro, micro),
                                 gb.y.narrow(0, j * micro, micro), at::kFloat);
    (loss / accum).backward();
    loss_sum += loss.item<float>();
  }
  return loss_sum / accum;
}

// `hook(step, engine)` runs before each optimizer step's micro-batches.
template <typename Hook>
RunResult train(ModelKind kind, const config::Config& cfg, comm::Communicator& comm, int steps,
                Hook&& hook, EngineOptions options = {}) {
  auto model = make_model(kind);
  Engine engine(model, cfg, comm, std::move(options));
  const int world = comm.world_size(), rank = comm.rank();
  const int accum = static_cast<int>(cfg.gradient_accumulation_steps);
  const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
  RunResult r;
  for (int step = 0; step < steps; ++step) {
    hook(step, engine);
    GlobalBatch gb = global_batch(kind, step);
    float loss_sum = 0.0f;
    for (int j = 0; j < accum; ++j) {
      const int begin = j * (kGlobalBatch / accum) + rank * micro;
      at::Tensor loss = micro_loss(kind, *model, gb.x.narrow(0, begin, micro),
                                   gb.y.narrow(0, begin, micro), engine.dtype());
      engine.backward(loss);
      engine.step();
      loss_sum += loss.item<float>();
    }
    comm.all_reduce(&loss_sum, 1, DType::kFloat32)->wait();
    r.losses.push_back(loss_sum / static_cast<float>(world * accum));
    r.stats.push_back(engine.stats());
  }
  engine.flush();
  r.params = engine.gather_master_params();
  return r;
}

inline RunResult train(ModelKind kind, const config::Config& cfg, comm::Communicator& comm,
                       int steps) {
  return train(kind, cfg, comm, steps, [](int, Engine&) {});
}

// One optimizer step of train()'s schedule without accumulation: this rank's
// micro-batch of the global batch, backward and step.
inline void step_once(ModelKind kind, torch::nn::Module& model, Engine& engine, comm::Communicator& comm, int step) {
  GlobalBatch gb = global_batch(kind, step);
  const int micro = kGlobalBatch / comm.world_size();
  engine.backward(micro_loss(kind, model, gb.x.narrow(0, comm.rank() * micro, micro),
                             gb.y.narrow(0, comm.rank() * micro, micro), engine.dtype()));
  engine.step();
}

// Building an engine of `cfg` for a `kind` model fails with a zero::Error
// whose message contains `needle`.
inline void expect_engine_error(ModelKind kind, const config::Config& cfg, comm::Communicator& comm,
                                const std::string& needle) {
  auto model = make_model(kind);
  try {
    Engine engine(model, cfg, comm);
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// How a checkpoint test saves and loads: where the state (or the
// parameters) lived when it was saved and when loaded, and whether the save
// was asynchronous.
struct SaveLoadWay {
  std::string save_on, load_on;
  bool async = false;
  std::string tag() const { return "from_" + save_on + (async ? "_async" : ""); }
  std::string trace() const {
    return "saved with " + save_on + (async ? " asynchronously" : "") + ", loaded with " + load_on;
  }
};

// Trains `steps` steps of train()'s schedule (no accumulation) with an
// engine of `cfg`, then saves checkpoint `tag` under `root`. `async`: its
// writer held back `hold_ms` (ZERO_TEST_CKPT_WRITE_DELAY_MS), and two more
// steps run while it is written. Returns the save's timing.
inline Engine::CheckpointTiming save_after(ModelKind kind, const config::Config& cfg, comm::Communicator& comm,
                                           int steps, const std::string& root, const std::string& tag, bool async,
                                           int hold_ms = 300) {
  auto model = make_model(kind);
  Engine engine(model, cfg, comm);
  for (int step = 0; step < steps; ++step) step_once(kind, *model, engine, comm, step);
  if (async) ::setenv("ZERO_TEST_CKPT_WRITE_DELAY_MS", std::to_string(hold_ms).c_str(), 1);
  engine.save_checkpoint(root, tag, nlohmann::json::object(), async);
  ::unsetenv("ZERO_TEST_CKPT_WRITE_DELAY_MS");
  if (async) {
    EXPECT_TRUE(engine.checkpoint_in_flight());
    for (int step = steps; step < steps + 2; ++step) step_once(kind, *model, engine, comm, step);
    engine.wait_checkpoint();
  }
  return engine.last_checkpoint();
}

// `steps` steps with an engine of `cfg` that first loads checkpoint `tag` of `root`.
inline RunResult resume_from(ModelKind kind, const config::Config& cfg, comm::Communicator& comm, int steps,
                             const std::string& root, const std::string& tag) {
  return train(kind, cfg, comm, steps, [&](int step, Engine& engine) {
    if (step == 0) engine.load_checkpoint(root, tag);
  });
}

// A run resumed at step `from` against the unbroken run: its losses those of
// the unbroken run's steps from `from` on, its final weights the same, bitwise.
inline void expect_resumed_like(const RunResult& resumed, const RunResult& unbroken, int from) {
  for (std::size_t i = 0; i < resumed.losses.size(); ++i) {
    EXPECT_EQ(resumed.losses[i], unbroken.losses[i + static_cast<std::size_t>(from)]) << "step " << i + from;
  }
  ASSERT_EQ(resumed.params.size(), unbroken.params.size());
  for (std::size_t i = 0; i < unbroken.params.size(); ++i) {
    EXPECT_TRUE(resumed.params[i].equal(unbroken.params[i])) << "parameter " << i;
  }
}

// Saves checkpoint `tag` under `root` after half of `steps` with an engine
// of `save_cfg` (save_after(): async, two more steps while it is written),
// resumes from it with an engine of `load_cfg` for the other half, and
// expects the run to go on like `unbroken`, bitwise. An async save's steps
// must have waited at least `min_stall_s` for it (0: not checked).
inline void expect_save_resume_like(ModelKind kind, const config::Config& save_cfg, const config::Config& load_cfg,
                                    comm::Communicator& comm, int steps, const std::string& root,
                                    const std::string& tag, bool async, const RunResult& unbroken,
                                    double min_stall_s = 0.0, int hold_ms = 300) {
  const Engine::CheckpointTiming saved = save_after(kind, save_cfg, comm, steps / 2, root, tag, async, hold_ms);
  if (async && min_stall_s > 0.0) {
    EXPECT_GT(saved.stall_s, min_stall_s) << "the step did not wait for the save's streamed sections";
  }
  expect_resumed_like(resume_from(kind, load_cfg, comm, steps / 2, root, tag), unbroken, steps / 2);
}

}  // namespace zero::test
