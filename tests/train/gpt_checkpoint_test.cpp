// Per-block activation checkpointing of the GPT: the same loss and gradients
// as an ordinary backward (fp32, within 1e-6), with the checkpoints on the
// device or on the host, and the same training run under the engine (whose
// post-accumulate-grad hooks must see every gradient of a recomputed block).
#include <atomic>
#include <cstdio>
#include <functional>
#include <set>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <ATen/autocast_mode.h>
#include <ATen/ops/randint.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include "zero/comm/communicator.h"
#include "zero/engine/engine.h"
#include "zero/models/gpt.h"

namespace zero {
namespace {

struct LossAndGrads {
  float loss = 0.0f;
  std::vector<at::Tensor> grads;
};

LossAndGrads loss_and_grads(models::Gpt& model, const at::Tensor& batch) {
  for (auto& p : model.parameters()) p.mutable_grad().reset();
  const auto T = batch.size(1) - 1;
  at::Tensor loss = model.loss(batch.narrow(1, 0, T), batch.narrow(1, 1, T));
  loss.backward();
  LossAndGrads out;
  out.loss = loss.item<float>();
  for (auto& p : model.parameters()) out.grads.push_back(p.grad().clone());
  return out;
}

TEST(GptCheckpoint, SameLossAndGradientsAsWithout) {
  torch::manual_seed(3);
  models::GptConfig g = models::gpt_preset("gpt2-tiny");
  g.n_layer = 3;
  models::Gpt model(g);
  const at::Tensor batch = at::randint(0, g.vocab_size, {4, g.block_size + 1}, at::kLong);
  const LossAndGrads plain = loss_and_grads(model, batch);
  for (bool on_cpu : {false, true}) {
    model.set_activation_checkpointing(true, on_cpu);
    const LossAndGrads ckpt = loss_and_grads(model, batch);
    EXPECT_EQ(ckpt.loss, plain.loss) << "on_cpu " << on_cpu;
    ASSERT_EQ(ckpt.grads.size(), plain.grads.size());
    for (std::size_t i = 0; i < plain.grads.size(); ++i) {
      const double diff = (ckpt.grads[i] - plain.grads[i]).abs().max().item<double>();
      EXPECT_LE(diff, 1e-6) << "parameter " << i << " on_cpu " << on_cpu;
      EXPECT_GT(plain.grads[i].abs().max().item<double>(), 0.0) << "parameter " << i << " got no gradient";
    }
  }
  // Under no-grad (evaluation, sampling) the forward is the ordinary one.
  at::NoGradGuard no_grad;
  model.set_activation_checkpointing(true, true);
  at::Tensor a = model.forward(batch.narrow(1, 0, 8));
  model.set_activation_checkpointing(false);
  EXPECT_TRUE(at::equal(a, model.forward(batch.narrow(1, 0, 8))));
}

// Counts the aten::gelu calls (one per block forward: the MLP's activation)
// and the aten::linear calls (four per block forward: attention's qkv and
// proj, the MLP's fc and proj) that run while it lives, on any thread.
class OpCounter {
 public:
  OpCounter() {
    gelus_ = 0;
    linears_ = 0;
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
          const std::string_view name(fn.name());
          if (name == "aten::gelu") ++gelus_;
          if (name == "aten::linear") ++linears_;
          return nullptr;
        }).scopes({at::RecordScope::FUNCTION}));
  }
  ~OpCounter() { at::removeCallback(handle_); }
  int gelus() const { return gelus_; }
  int linears() const { return linears_; }

 private:
  static inline std::atomic<int> gelus_{0}, linears_{0};
  at::CallbackHandle handle_;
};

// The autograd nodes a backward from `loss` would visit.
std::size_t graph_nodes(const at::Tensor& loss) {
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo{loss.grad_fn().get()};
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    for (const auto& e : n->next_edges()) todo.push_back(e.function.get());
  }
  return seen.size();
}

// Bytes the forward leaves allocated: what autograd saved for backward (and
// the loss), measured by LibTorch's profiler, which sees every allocation and
// free of the CPU allocator while it runs.
std::int64_t bytes_kept_by_forward(const std::function<at::Tensor()>& forward, at::Tensor* loss) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const std::set<ActivityType> acts{ActivityType::CPU};
  const torch::profiler::impl::ProfilerConfig cfg(torch::profiler::impl::ProfilerState::KINETO,
                                                  /*report_input_shapes=*/false, /*profile_memory=*/true);
  prof::prepareProfiler(cfg, acts);
  prof::enableProfiler(cfg, acts);
  *loss = forward();
  const auto result = prof::disableProfiler();
  std::int64_t net = 0;
  for (const auto& e : result->events()) {
    if (e.name() == "[memory]") net += e.nBytes();
  }
  return net;
}

// Checkpointing really happens: forward keeps only the blocks' inputs (one
// autograd node per block instead of the block's whole graph, whose nodes
// hold its saved activations) and backward recomputes each block's forward
// exactly once, up to the MLP's activation (three of its four linears: the
// last one's output feeds nothing backward needs); without it nothing is
// recomputed.
TEST(GptCheckpoint, RecomputesEachBlockOnceAndKeepsOnlyBlockInputs) {
  torch::manual_seed(4);
  models::GptConfig g = models::gpt_preset("gpt2-tiny");
  g.n_layer = 3;
  models::Gpt model(g);
  const at::Tensor batch = at::randint(0, g.vocab_size, {2, 17}, at::kLong);
  std::int64_t kept = 0;
  int fwd_linears = 0, bwd_linears = 0;
  auto run = [&](bool checkpoint, bool on_cpu, int* forward_gelus, int* backward_gelus) {
    model.set_activation_checkpointing(checkpoint, on_cpu);
    OpCounter counter;
    at::Tensor loss;
    kept = bytes_kept_by_forward([&] { return model.loss(batch.narrow(1, 0, 16), batch.narrow(1, 1, 16)); },
                                 &loss);
    *forward_gelus = counter.gelus();
    fwd_linears = counter.linears();
    const std::size_t nodes = graph_nodes(loss);
    loss.backward();
    *backward_gelus = counter.gelus() - *forward_gelus;
    bwd_linears = counter.linears() - fwd_linears;
    return nodes;
  };
  int fwd = 0, bwd = 0;
  const std::size_t plain_nodes = run(false, false, &fwd, &bwd);
  const std::int64_t plain_kept = kept;
  EXPECT_EQ(fwd, g.n_layer);
  EXPECT_EQ(bwd, 0) << "a plain backward recomputed a block";
  EXPECT_EQ(fwd_linears, 4 * g.n_layer);
  EXPECT_EQ(bwd_linears, 0);
  // What a checkpointed forward may keep: each block's input [B, T, C] in
  // fp32, plus what lives outside the blocks (embeddings, final LayerNorm,
  // logits, the loss), which the plain run keeps as well.
  const std::int64_t block_input = 2 * 16 * g.n_embd * 4;
  for (bool on_cpu : {false, true}) {
    const std::size_t ckpt_nodes = run(true, on_cpu, &fwd, &bwd);
    EXPECT_EQ(fwd, g.n_layer) << "on_cpu " << on_cpu;
    EXPECT_EQ(bwd, g.n_layer) << "backward must re-run every block once (on_cpu " << on_cpu << ")";
    EXPECT_EQ(fwd_linears, 4 * g.n_layer) << "on_cpu " << on_cpu;
    EXPECT_EQ(bwd_linears, 3 * g.n_layer) << "the recomputation must stop at the MLP's activation (on_cpu "
                                          << on_cpu << ")";
    // Each block's graph (LayerNorms, attention, MLP: well over 10 nodes)
    // collapses into one checkpoint node.
    EXPECT_LE(ckpt_nodes + static_cast<std::size_t>(10 * g.n_layer), plain_nodes)
        << "checkpointed graph " << ckpt_nodes << " nodes, plain " << plain_nodes;
    // The saved activations, measured: the blocks' insides are gone. A block
    // of gpt2-tiny saves about 20 of its input's size in the plain run.
    EXPECT_GT(kept, 0);
    EXPECT_LE(kept + static_cast<std::int64_t>(g.n_layer) * 8 * block_input, plain_kept)
        << "checkpointed forward kept " << kept << " bytes, plain " << plain_kept << " (on_cpu " << on_cpu << ")";
    std::printf("[ measured ] forward kept %lld bytes checkpointed (on_cpu %d), %lld plain\n",
                static_cast<long long>(kept), on_cpu, static_cast<long long>(plain_kept));
  }
}

// Under bf16 autocast (what a mixed-precision loop does), the recomputation
// in backward must run in bf16 as the forward did: the same gradients as
// without checkpointing. (It once ran in fp32: other gradients, and a 7x
// slower backward on a GPU.)
TEST(GptCheckpoint, RecomputesUnderTheForwardsAutocast) {
  torch::manual_seed(5);
  models::GptConfig g = models::gpt_preset("gpt2-tiny");
  g.n_layer = 2;
  models::Gpt model(g);
  const at::Tensor batch = at::randint(0, g.vocab_size, {2, 33}, at::kLong);
  auto grads_under_autocast = [&](bool checkpoint) {
    model.set_activation_checkpointing(checkpoint);
    for (auto& p : model.parameters()) p.mutable_grad().reset();
    at::Tensor loss;
    {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      at::autocast::increment_nesting();
      loss = model.loss(batch.narrow(1, 0, 32), batch.narrow(1, 1, 32));
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      at::autocast::set_autocast_enabled(at::kCPU, false);
    }
    loss.backward();  // outside the autocast region, as AMP does
    std::vector<at::Tensor> grads;
    for (auto& p : model.parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto plain = grads_under_autocast(false);
  const auto ckpt = grads_under_autocast(true);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (std::size_t i = 0; i < plain.size(); ++i) {
    const double scale = plain[i].abs().max().item<double>();
    const double diff = (ckpt[i] - plain[i]).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5 * scale + 1e-12) << "parameter " << i << ": recomputed in another precision?";
  }
}

TEST(GptCheckpoint, ParameterNumelsFollowTheModule) {
  models::GptConfig g = models::gpt_preset("gpt2-tiny");
  g.n_layer = 3;
  models::Gpt model(g);
  std::vector<std::int64_t> numels;
  for (const auto& p : model.parameters()) numels.push_back(p.numel());
  EXPECT_EQ(numels, g.parameter_numels());
}

// Four engine steps (bf16 parameters; ZeRO-2 + CPU offload, or ZeRO-3,
// whose blocks are gathered only while they run, their recomputation in
// backward included) with and without checkpointing: the same losses and the
// same final master weights.
std::pair<std::vector<float>, std::vector<at::Tensor>> train(comm::Communicator& comm, bool checkpoint,
                                                             bool on_cpu, int stage) {
  torch::manual_seed(11);
  models::GptConfig g = models::gpt_preset("gpt2-tiny");
  g.checkpoint_activations = checkpoint;
  g.checkpoint_on_cpu = on_cpu;
  auto model = std::make_shared<models::Gpt>(g);
  config::Config cfg;
  cfg.train_micro_batch_size_per_gpu = 2;
  cfg.gradient_accumulation_steps = 2;
  cfg.train_batch_size = 4 * comm.world_size();
  cfg.bf16.enabled = true;
  cfg.gradient_clipping = 1.0f;
  cfg.zero_optimization.stage = stage;
  if (stage == 2) cfg.zero_optimization.offload_optimizer.device = "cpu";
  if (stage == 3) cfg.zero_optimization.stage3_param_persistence_threshold = 0;
  Engine engine(model, cfg, comm);
  engine.set_lr(1e-3f);
  std::vector<float> losses;
  torch::manual_seed(100 + comm.rank());
  for (int step = 0; step < 4; ++step) {
    for (int j = 0; j < 2; ++j) {
      at::Tensor batch = at::randint(0, g.vocab_size, {2, 33}, at::kLong);
      at::Tensor loss = model->loss(batch.narrow(1, 0, 32), batch.narrow(1, 1, 32));
      engine.backward(loss);
      engine.step();
      losses.push_back(loss.item<float>());
    }
  }
  engine.flush();
  return {losses, engine.gather_master_params()};
}

TEST(GptCheckpoint, EngineTrainingMatches) {
  auto comm = comm::make_communicator();
  for (int stage : {2, 3}) {
    const auto plain = train(*comm, false, false, stage);
    for (bool on_cpu : {false, true}) {
      const auto ckpt = train(*comm, true, on_cpu, stage);
      ASSERT_EQ(ckpt.first.size(), plain.first.size());
      for (std::size_t i = 0; i < plain.first.size(); ++i) {
        EXPECT_NEAR(ckpt.first[i], plain.first[i], 1e-6)
            << "stage " << stage << " micro-step " << i << " on_cpu " << on_cpu;
      }
      ASSERT_EQ(ckpt.second.size(), plain.second.size());
      for (std::size_t i = 0; i < plain.second.size(); ++i) {
        EXPECT_LE((ckpt.second[i] - plain.second[i]).abs().max().item<double>(), 1e-6)
            << "stage " << stage << " parameter " << i;
      }
    }
  }
}

}  // namespace
}  // namespace zero
