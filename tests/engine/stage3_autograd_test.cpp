// Stage 3 under autograd patterns beyond one plain backward per step, each
// held to stage 0 (which gathers nothing) on the same ranks:
//  - a parameter of a unit that gets a gradient on some ranks only (a branch
//    or an expert not taken on a rank: DDP's find_unused_parameters case
//    inside a unit): the unit's buckets are reduced when its backward is
//    over, the missing gradient as zeros, at the same point on every rank;
//  - a parameter outside every unit (kept gathered) used on some ranks only:
//    its bucket goes out after every unit's;
//  - a double backward through units (a gradient penalty: autograd::grad
//    with create_graph in forward, then the penalty's backward): the units
//    stay gathered until the engine's backward ends;
//  - two engines in one loop (a GAN): the generator's loss runs backward
//    through the discriminator, whose engine drops those gradients as a
//    plain loop's zero_grad() would.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ops/gelu.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/linear.h>

#include "train_loop.h"
#include "zero/core/log.h"
#include "zero/engine/engine.h"
#include "zero/zero/flat_layout.h"
#include "zero/zero/memory_plan.h"
#include "zero/zero/unit.h"

namespace zero::test {
namespace {

constexpr int kSteps = 4;

config::Config config_for(int stage, int world) {
  config::Config c = make_config(stage, false, false, world, 4, 1);
  c.zero_optimization.reduce_bucket_size = 200;  // several buckets per unit
  c.comm_timeout = 30;  // a divergence fails in seconds, not minutes
  return c;
}

void expect_same_params(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE((got[i] - want[i]).abs().max().item<double>(), 1e-5) << what << ": parameter " << i;
  }
}

// A unit of two branches: `main` always, `side` only where the caller says.
struct Branchy : torch::nn::Module {
  Branchy() {
    main = register_module("main", torch::nn::Linear(16, 16));
    side = register_module("side", torch::nn::Linear(16, 16));
  }
  torch::nn::Linear main{nullptr}, side{nullptr};
};

struct BranchyNet : torch::nn::Module {
  BranchyNet() {
    for (int i = 0; i < 3; ++i) {
      blocks.push_back(register_module("b" + std::to_string(i), std::make_shared<Branchy>()));
      zero::mark_unit(*blocks.back());
    }
    head = register_module("head", torch::nn::Linear(16, 4));
    zero::mark_unit(*head);
  }
  // use_side(i): whether block i's side branch runs on this rank now.
  at::Tensor forward(at::Tensor h, const std::function<bool(int)>& use_side) {
    for (int i = 0; i < 3; ++i) {
      Branchy& b = *blocks[static_cast<std::size_t>(i)];
      const bool side = use_side(i);
      h = zero::unit(b, h, [&](const at::Tensor& x) {
        at::Tensor y = b.main->forward(x);
        if (side) y = y + b.side->forward(x);
        return at::gelu(y);
      });
    }
    return as_unit(head, h);
  }
  std::vector<std::shared_ptr<Branchy>> blocks;
  torch::nn::Linear head{nullptr};
};

std::vector<at::Tensor> train_branchy(int stage, comm::Communicator& comm) {
  torch::manual_seed(11);
  auto model = std::make_shared<BranchyNet>();
  Engine engine(model, config_for(stage, comm.world_size()), comm);
  const int r = comm.rank();
  for (int step = 0; step < kSteps; ++step) {
    torch::manual_seed(100 + step * 7 + r);
    const at::Tensor x = at::randn({4, 16}), y = at::randn({4, 4});
    // Block 1's side branch is skipped on rank 0 at every other step, block
    // 2's on the last rank at the others: each rank leaves a different
    // parameter without a gradient (on one rank: skipped at times).
    auto use_side = [&](int block) {
      if (block == 1) return !(r == 0 && step % 2 == 0);
      if (block == 2) return !(r == comm.world_size() - 1 && step % 2 == 1);
      return true;
    };
    engine.backward(at::mse_loss(model->forward(x, use_side), y));
    engine.step();
  }
  return engine.gather_master_params();
}

TEST(Stage3Autograd, AUnitParameterUsedOnSomeRanksOnlyTrainsAsStage0) {
  comm::Communicator& comm = world_comm();
  const std::vector<at::Tensor> s0 = train_branchy(0, comm);
  // The parameter without a gradient is named once per engine, on rank 0
  // (its own: block 1's side branch, skipped there at even steps).
  std::vector<std::string> said;
  struct Restore {
    LogSink previous;
    ~Restore() { set_log_sink(std::move(previous)); }
  } restore;
  restore.previous = set_log_sink([&](const LogRecord& r) {
    if (r.text.find("got no gradient") != std::string_view::npos) said.emplace_back(r.text);
  });
  expect_same_params(train_branchy(3, comm), s0, "stage 3");
  if (comm.rank() == 0) {
    ASSERT_EQ(said.size(), 1u);
    EXPECT_EQ(said[0].rfind("parameter 'b1.side.weight' got no gradient in a backward", 0), 0u) << said[0];
  } else {
    EXPECT_TRUE(said.empty());
  }
}

// A parameter outside every unit (kept gathered) used on some ranks only:
// a gate between two units that rank 0 skips at even steps. Its bucket
// goes out after every unit's (when the last unit's backward is over, or at
// the end of backward where it is missing), so that it never stands between
// a unit's all-gather and another rank's; the missing gradient counts as
// zeros, as at stages 1 and 2.
struct GatedNet : torch::nn::Module {
  GatedNet() {
    for (int i = 0; i < 2; ++i) {
      blocks.push_back(register_module("b" + std::to_string(i), torch::nn::Linear(16, 16)));
      zero::mark_unit(*blocks.back());
    }
    gate = register_module("gate", torch::nn::Linear(16, 16));  // no unit: kept
    head = register_module("head", torch::nn::Linear(16, 4));
    zero::mark_unit(*head);
  }
  at::Tensor forward(at::Tensor h, bool use_gate) {
    h = at::gelu(as_unit(blocks[0], h));
    if (use_gate) h = h + gate->forward(h);
    h = at::gelu(as_unit(blocks[1], h));
    return as_unit(head, h);
  }
  std::vector<torch::nn::Linear> blocks;
  torch::nn::Linear gate{nullptr}, head{nullptr};
};

// Trains a Net whose forward(x, use_gate) takes the gate where rank 0
// skips it at even steps; returns the master weights.
template <typename Net>
std::vector<at::Tensor> train_gate_skipped_on_rank0(int stage, comm::Communicator& comm, std::uint64_t seed) {
  torch::manual_seed(seed);
  auto model = std::make_shared<Net>();
  Engine engine(model, config_for(stage, comm.world_size()), comm);
  const int r = comm.rank();
  for (int step = 0; step < kSteps; ++step) {
    torch::manual_seed(seed * 25 + step * 7 + r);
    const at::Tensor x = at::randn({4, 16}), y = at::randn({4, 4});
    engine.backward(at::mse_loss(model->forward(x, !(r == 0 && step % 2 == 0)), y));
    engine.step();
  }
  return engine.gather_master_params();
}

TEST(Stage3Autograd, AKeptParameterUsedOnSomeRanksOnlyTrainsAsStage0) {
  comm::Communicator& comm = world_comm();
  const std::vector<at::Tensor> s0 = train_gate_skipped_on_rank0<GatedNet>(0, comm, 12);
  expect_same_params(train_gate_skipped_on_rank0<GatedNet>(3, comm, 12), s0, "stage 3");
}

// The same with units of frozen parameters only (adapters on a partitioned
// base): the trainable parameters are all kept, and the frozen units still
// gather in backward (their inputs need gradients), so the kept buckets
// wait for the end of backward here too.
struct FrozenBaseNet : torch::nn::Module {
  FrozenBaseNet() {
    pre = register_module("pre", torch::nn::Linear(16, 16));
    for (int i = 0; i < 2; ++i) {
      blocks.push_back(register_module("b" + std::to_string(i), torch::nn::Linear(16, 16)));
      for (at::Tensor& p : blocks.back()->parameters()) p.set_requires_grad(false);
      zero::mark_unit(*blocks.back());
    }
    gate = register_module("gate", torch::nn::Linear(16, 16));
    head = register_module("head", torch::nn::Linear(16, 4));
  }
  at::Tensor forward(at::Tensor h, bool use_gate) {
    h = at::gelu(as_unit(blocks[0], pre->forward(h)));
    if (use_gate) h = h + gate->forward(h);
    h = at::gelu(as_unit(blocks[1], h));
    return head->forward(h);
  }
  std::vector<torch::nn::Linear> blocks;
  torch::nn::Linear pre{nullptr}, gate{nullptr}, head{nullptr};
};

TEST(Stage3Autograd, AKeptParameterBetweenFrozenUnitsUsedOnSomeRanksOnlyTrainsAsStage0) {
  comm::Communicator& comm = world_comm();
  const std::vector<at::Tensor> s0 = train_gate_skipped_on_rank0<FrozenBaseNet>(0, comm, 14);
  expect_same_params(train_gate_skipped_on_rank0<FrozenBaseNet>(3, comm, 14), s0, "stage 3");
}

// A large parameter of no unit whose gradient comes first in backward (a
// projection after the last unit): its buckets live until the units' have
// gone out, beside at most kPlanLiveBuckets of the units' at once, which
// the memory plan budgets (kept ones plus the units' three largest).
struct ProjectedNet : torch::nn::Module {
  ProjectedNet() {
    for (int i = 0; i < 5; ++i) {
      blocks.push_back(register_module("b" + std::to_string(i), torch::nn::Linear(16, 16)));
      zero::mark_unit(*blocks.back());
    }
    proj = register_module("proj", torch::nn::Linear(16, 256));  // no unit: kept
  }
  at::Tensor forward(at::Tensor h) {
    for (auto& b : blocks) h = at::gelu(as_unit(b, h));
    return proj->forward(h);
  }
  std::vector<torch::nn::Linear> blocks;
  torch::nn::Linear proj{nullptr};
};

TEST(Stage3Autograd, KeptBucketsLiveToTheEndOfBackwardWithinTheirBudget) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  torch::manual_seed(13);
  auto model = std::make_shared<ProjectedNet>();
  config::Config cfg = config_for(3, world);
  // The layout the engine makes (sizes before it partitions them): units in
  // the order marked, proj kept.
  std::vector<std::size_t> numels;
  std::vector<int> groups;
  for (int u = 0; u < 5; ++u) {
    for (const at::Tensor& p : model->blocks[static_cast<std::size_t>(u)]->parameters()) {
      numels.push_back(static_cast<std::size_t>(p.numel()));
      groups.push_back(u);
    }
  }
  for (const at::Tensor& p : model->proj->parameters()) {
    numels.push_back(static_cast<std::size_t>(p.numel()));
    groups.push_back(-1);
  }
  Engine engine(model, cfg, comm);
  const FlatLayout layout(numels, bucket_numel_from_config(cfg.zero_optimization.reduce_bucket_size), world, world,
                          kPlanAlignElements, groups);
  std::int64_t kept = 0;
  std::vector<std::int64_t> unit_buckets;
  for (const Bucket& b : layout.buckets()) {
    if (b.group < 0) {
      kept += static_cast<std::int64_t>(b.padded);
    } else {
      unit_buckets.push_back(static_cast<std::int64_t>(b.padded));
    }
  }
  std::sort(unit_buckets.rbegin(), unit_buckets.rend());
  ASSERT_GT(unit_buckets.size(), static_cast<std::size_t>(kPlanLiveBuckets));
  std::int64_t bound = kept;
  for (int i = 0; i < kPlanLiveBuckets; ++i) bound += unit_buckets[static_cast<std::size_t>(i)];
  bound *= 4;  // fp32
  // The bucket bytes alive when the last unit in backward (the first in
  // forward) gets its gradient: proj's, which came first, still wait.
  std::int64_t live = 0;
  for (at::Tensor& p : model->blocks[0]->parameters()) {
    p.register_hook([&](const at::Tensor& g) {
      live = std::max(live, engine.ledger().snapshot().bytes(memory::Tier::kDevice, memory::Kind::kBuckets));
      return g;
    });
  }
  for (int step = 0; step < 3; ++step) {
    live = 0;
    torch::manual_seed(500 + step + comm.rank());
    engine.backward(at::mse_loss(model->forward(at::randn({4, 16})), at::zeros({4, 256})));
    engine.step();
    // (From the second step: the order agreed after the first.)
    if (step > 0) {
      EXPECT_GE(live, kept * 4) << "step " << step << ": the kept buckets went out before the units'";
    }
  }
  const std::int64_t peak = engine.ledger().snapshot().peak[static_cast<int>(memory::Tier::kDevice)]
                                 [static_cast<int>(memory::Kind::kBuckets)];
  EXPECT_LE(peak, bound) << "kept " << kept << " elements, unit buckets " << unit_buckets.size();
}

// A gradient penalty: the input gradient of the output, taken with
// create_graph in forward, is part of the loss.
std::vector<at::Tensor> train_penalty(int stage, comm::Communicator& comm) {
  torch::manual_seed(12);
  auto model = make_model(ModelKind::kMlp);
  auto& mlp = static_cast<Mlp&>(*model);
  Engine engine(model, config_for(stage, comm.world_size()), comm);
  for (int step = 0; step < kSteps; ++step) {
    torch::manual_seed(200 + step * 7 + comm.rank());
    const at::Tensor x = at::randn({4, 16}).requires_grad_(true), y = at::randn({4, 4});
    const at::Tensor out = mlp.forward(x);
    const at::Tensor gx = torch::autograd::grad({out.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    engine.backward(at::mse_loss(out, y) + 0.1 * gx.pow(2).sum(1).mean());
    engine.step();
  }
  return engine.gather_master_params();
}

TEST(Stage3Autograd, AGradientPenaltyThroughUnitsTrainsAsStage0) {
  comm::Communicator& comm = world_comm();
  const std::vector<at::Tensor> s0 = train_penalty(0, comm);
  expect_same_params(train_penalty(3, comm), s0, "stage 3");
}

// A GAN: D learns real from fake, G learns to fool D; G's loss runs backward
// through D (D's engine drops those gradients). `freeze`: D's parameters
// are frozen around G's backward instead, the documented way to skip them.
struct Critic : torch::nn::Module {
  Critic() {
    l1 = register_module("l1", torch::nn::Linear(4, 8));
    l2 = register_module("l2", torch::nn::Linear(8, 1));
    zero::mark_unit(*l1);
    zero::mark_unit(*l2);
  }
  at::Tensor forward(const at::Tensor& x) { return as_unit(l2, at::gelu(as_unit(l1, x))); }
  torch::nn::Linear l1{nullptr}, l2{nullptr};
};
struct GanRun {
  std::vector<at::Tensor> g, d;
};
GanRun train_gan(int stage, bool freeze, comm::Communicator& comm) {
  torch::manual_seed(13);
  auto g = make_model(ModelKind::kMlp);  // 16 -> 4
  auto d = std::make_shared<Critic>();
  auto& gen = static_cast<Mlp&>(*g);
  Engine eg(g, config_for(stage, comm.world_size()), comm);
  Engine ed(d, config_for(stage, comm.world_size()), comm);
  for (int step = 0; step < kSteps; ++step) {
    torch::manual_seed(300 + step * 7 + comm.rank());
    const at::Tensor z = at::randn({4, 16}), real = at::randn({4, 4}) + 1.0;
    at::Tensor fake;
    {
      torch::NoGradGuard no_grad;
      fake = gen.forward(z);
    }
    ed.backward(at::mse_loss(d->forward(real), at::ones({4, 1})) + at::mse_loss(d->forward(fake), at::zeros({4, 1})));
    ed.step();
    if (freeze) {
      for (auto& p : d->parameters()) p.set_requires_grad(false);
    }
    eg.backward(at::mse_loss(d->forward(gen.forward(z)), at::ones({4, 1})));
    eg.step();
    if (freeze) {
      for (auto& p : d->parameters()) p.set_requires_grad(true);
    }
  }
  return {eg.gather_master_params(), ed.gather_master_params()};
}

TEST(Stage3Autograd, TwoEnginesInAGanLoopTrainAsWithTheDiscriminatorFrozen) {
  comm::Communicator& comm = world_comm();
  for (int stage : {0, 3}) {
    const GanRun frozen = train_gan(stage, true, comm);
    const GanRun plain = train_gan(stage, false, comm);
    expect_same_params(plain.g, frozen.g, "generator, stage " + std::to_string(stage));
    expect_same_params(plain.d, frozen.d, "discriminator, stage " + std::to_string(stage));
    if (stage == 3) {
      const GanRun s0 = train_gan(0, false, comm);
      expect_same_params(plain.g, s0.g, "generator, stage 3 vs 0");
      expect_same_params(plain.d, s0.d, "discriminator, stage 3 vs 0");
    }
  }
}

// A gradient that reaches an engine's parameters outside every engine's
// backward is still refused (loss.backward() called directly).
TEST(Stage3Autograd, AGradientOutsideEveryEnginesBackwardIsStillRefused) {
  comm::Communicator& comm = world_comm();
  auto model = make_model(ModelKind::kMlp);
  Engine engine(model, config_for(0, comm.world_size()), comm);
  const at::Tensor loss = at::mse_loss(static_cast<Mlp&>(*model).forward(at::randn({4, 16})), at::randn({4, 4}));
  try {
    loss.backward();
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("came from a backward that was not engine.backward(loss)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zero::test
