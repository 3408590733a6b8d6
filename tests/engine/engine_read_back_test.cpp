// One parameter's state read back and written (Engine::full_master,
// full_grad, full_optimizer_state, set_full_master, set_full_optimizer_state;
// DeepSpeed's safe_get_full_* / safe_set_full_*), against a plain LibTorch
// loop that knows nothing of zerocpp: the fp32 model, torch::optim::AdamW,
// clip_grad_norm_, the global batch of each step in micro-batches of loss /
// accumulation. At stages 0-3, with optimizer offload (and a device share),
// the state on NVMe, the parameters in host memory or on NVMe, on 1, 2 and 3
// ranks (3: parameters split unevenly over the chunks). Per step: every
// parameter's gradient before the step (the mean over the global batch,
// before clipping: the reference's grad before clip_grad_norm_), and after
// it the master weights and Adam's two moments (the reference optimizer's
// state). Then the setters on both sides: a new value for one parameter's
// weights and one's moment, one more step, and every weight compared again
// (so a setter that misses the training-precision copy, a rank's part or the
// step's input fails). With the delayed update: the gradients' norm is the
// step's grad_norm, and the master weights are gather_master_params()'s.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ops/randn.h>
#include <ATen/ops/zeros_like.h>
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include "shared_temp_dir.h"
#include "train_loop.h"
#include "zero/comm/communicator.h"
#include "zero/config/config.h"
#include "zero/core/error.h"

namespace zero::test {
namespace fs = std::filesystem;
namespace {

constexpr int kSteps = 3;
constexpr int kAccumulation = 2;
constexpr int kBatch = 12;  // the global batch: micro-batches of 6 / world on 1, 2 and 3 ranks

GlobalBatch batch_at(int step) {
  torch::manual_seed(7000 + step);
  at::Tensor x = at::randn({kBatch, 16});
  return {x, at::sin(x.narrow(1, 0, 4) * 2.0) + 0.1 * at::randn({kBatch, 4})};
}

// The reference's gradients of the global batch: kAccumulation micro-batches,
// each loss divided by kAccumulation.
void reference_grads(ModelKind kind, torch::nn::Module& model, const GlobalBatch& gb) {
  const int micro = kBatch / kAccumulation;
  for (int j = 0; j < kAccumulation; ++j) {
    at::Tensor loss = micro_loss(kind, model, gb.x.narrow(0, j * micro, micro), gb.y.narrow(0, j * micro, micro),
                                 at::kFloat);
    (loss / kAccumulation).backward();
  }
}

struct Case {
  const char* name;
  ModelKind kind;
  int stage;
  const char* optimizer_device = "none";  // offload_optimizer.device
  float ratio = 1.0f;
  const char* param_device = "none";  // offload_param.device
  bool dpu = false;
};

config::Config make(const Case& c, int world, const fs::path& dir) {
  config::Config cfg = make_config(c.stage, std::string(c.optimizer_device) != "none", false, world,
                                   kBatch / kAccumulation / world, kAccumulation);
  auto& oo = cfg.zero_optimization.offload_optimizer;
  oo.device = c.optimizer_device;
  oo.nvme_path = oo.device == "nvme" ? (dir / "optimizer").string() : "";
  oo.ratio = c.ratio;
  oo.delayed_param_update = c.dpu;
  oo.delayed_param_update_warmup_steps = 1;
  cfg.zero_optimization.sub_group_size = 64;
  auto& op = cfg.zero_optimization.offload_param;
  op.device = c.param_device;
  op.nvme_path = op.device == "nvme" ? (dir / "params").string() : "";
  return cfg;
}

// Each trainable tensor once, under its first name (a tied one's is the
// engine's too).
struct Named {
  std::string name;
  at::Tensor p;
};
std::vector<Named> trained(torch::nn::Module& model) {
  std::vector<Named> out;
  for (const auto& item : model.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    if (std::none_of(out.begin(), out.end(), [&](const Named& n) { return n.p.is_same(item.value()); })) {
      out.push_back({item.key(), item.value()});
    }
  }
  return out;
}

// fp32 on both sides: summation order only. Gradients and moments within
// 1e-5 relative + 1e-6; the weights within 1e-5 + 1e-5, as
// engine_reference_test's (Adam turns the rounding of a near-zero gradient
// into up to ~3e-6 here, measured on 3 ranks). A wrong value moves a weight
// by ~lr (1e-2), a gradient by its own size.
void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what, double atol = 1e-6) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), at::kFloat) << what;
  const at::Tensor diff = (got - want).abs();
  const at::Tensor bound = want.abs() * 1e-5 + atol;
  EXPECT_TRUE((diff <= bound).all().item<bool>()) << what << ": max abs diff " << diff.max().item<double>();
}

torch::optim::AdamWParamState& adam_state(torch::optim::AdamW& opt, const at::Tensor& p) {
  return static_cast<torch::optim::AdamWParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
}

class ReadBack : public testing::TestWithParam<Case> {};

TEST_P(ReadBack, MatchesPlainLibTorch) {
  const Case& c = GetParam();
  comm::Communicator& comm = world_comm();
  const fs::path dir = shared_temp_dir(comm, "zero_read_back_", c.name);
  if (comm.rank() == 0) {
    fs::create_directories(dir / "optimizer");
    fs::create_directories(dir / "params");
  }
  comm.barrier()->wait();
  const config::Config cfg = make(c, comm.world_size(), dir);
  const int rank = comm.rank();
  const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);

  auto ref_model = make_model(c.kind);
  const std::vector<Named> ref = trained(*ref_model);
  std::vector<at::Tensor> ref_params;
  for (const Named& n : ref) ref_params.push_back(n.p);
  torch::optim::AdamW opt(ref_params, torch::optim::AdamWOptions(cfg.optimizer.lr)
                                          .betas({cfg.optimizer.beta1, cfg.optimizer.beta2})
                                          .eps(cfg.optimizer.eps)
                                          .weight_decay(cfg.optimizer.weight_decay));

  auto model = make_model(c.kind);
  Engine engine(model, cfg, comm);

  // One optimizer step of both; `check_grads`: each gradient before the step.
  auto step_both = [&](int step) {
    const GlobalBatch gb = batch_at(step);
    opt.zero_grad();
    reference_grads(c.kind, *ref_model, gb);
    std::vector<at::Tensor> want_grads;
    for (at::Tensor& p : ref_params) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      want_grads.push_back(p.grad().clone());
    }
    torch::nn::utils::clip_grad_norm_(ref_params, cfg.gradient_clipping);
    opt.step();
    for (int j = 0; j < kAccumulation; ++j) {
      const int begin = j * (kBatch / kAccumulation) + rank * micro;
      engine.backward(micro_loss(c.kind, *model, gb.x.narrow(0, begin, micro), gb.y.narrow(0, begin, micro),
                                 engine.dtype()));
      if (j + 1 < kAccumulation) {
        EXPECT_THROW(engine.full_grad(ref[0].name), Error) << "full_grad in the middle of the window";
      } else {
        double sq = 0.0;
        for (std::size_t k = 0; k < ref.size(); ++k) {
          const at::Tensor g = engine.full_grad(ref[k].name);
          sq += g.square().sum().item<double>();
          // With the delayed update the engine's gradients are of other
          // (one step older) weights than the reference's: their norm is
          // checked against the step's instead.
          if (!c.dpu) expect_close(g, want_grads[k], "gradient of " + ref[k].name + ", step " + std::to_string(step));
        }
        engine.step();
        EXPECT_NEAR(std::sqrt(sq), engine.stats().grad_norm, 1e-5 * engine.stats().grad_norm)
            << "the gradients' norm against the step's, step " << step;
        continue;
      }
      engine.step();
    }
    EXPECT_THROW(engine.full_grad(ref[0].name), Error) << "full_grad after the step";
  };
  auto expect_state_like_reference = [&](const std::string& when) {
    const std::vector<at::Tensor> masters = engine.gather_master_params();
    for (std::size_t k = 0; k < ref.size(); ++k) {
      const at::Tensor master = engine.full_master(ref[k].name);
      EXPECT_TRUE(master.equal(masters[k])) << ref[k].name << " against gather_master_params(), " << when;
      if (c.dpu) continue;  // (the delayed update's weights are not the plain loop's)
      expect_close(master, ref[k].p.detach(), "master of " + ref[k].name + ", " + when, 1e-5);
      torch::optim::AdamWParamState& s = adam_state(opt, ref[k].p);
      expect_close(engine.full_optimizer_state(ref[k].name, "exp_avg"), s.exp_avg(),
                   "exp_avg of " + ref[k].name + ", " + when);
      expect_close(engine.full_optimizer_state(ref[k].name, "exp_avg_sq"), s.exp_avg_sq(),
                   "exp_avg_sq of " + ref[k].name + ", " + when);
    }
  };

  for (int step = 0; step < kSteps; ++step) {
    step_both(step);
    expect_state_like_reference("after step " + std::to_string(step));
  }
  // Every name of a trained tensor reads it (a tied weight's both).
  for (const auto& item : model->named_parameters()) {
    const auto it = std::find_if(ref.begin(), ref.end(), [&](const Named& n) { return n.name == item.key(); });
    if (it != ref.end()) continue;
    for (const Named& n : trained(*model)) {
      if (n.p.is_same(item.value())) {
        EXPECT_TRUE(engine.full_master(item.key()).equal(engine.full_master(n.name))) << item.key();
      }
    }
  }
  if (c.dpu) {
    // The setters apply the pending update first: compared after it.
    engine.flush();
  }

  // The setters: rank 0's value is taken (each rank passes another one).
  const Named& first = ref.front();
  const Named& last = ref.back();
  torch::manual_seed(99);
  const at::Tensor weights = at::randn(first.p.sizes()) * 0.1;
  const at::Tensor moment = at::randn(last.p.sizes()).abs() * 1e-3;
  engine.set_full_master(first.name, weights + rank);
  engine.set_full_optimizer_state(last.name, "exp_avg", moment + rank);
  EXPECT_TRUE(engine.full_master(first.name).equal(weights)) << "set_full_master: rank 0's value";
  EXPECT_TRUE(engine.full_optimizer_state(last.name, "exp_avg").equal(moment)) << "set_full_optimizer_state";
  {
    // The module computes with it (fp32: exactly).
    GatheredParameters gathered = engine.gather_parameters();
    for (const auto& item : model->named_parameters()) {
      if (item.key() == first.name) {
        EXPECT_TRUE(item.value().equal(weights)) << "the module's " << first.name;
      }
    }
  }
  if (!c.dpu) {
    {
      at::NoGradGuard no_grad;
      first.p.copy_(weights);
      adam_state(opt, last.p).exp_avg().copy_(moment);
    }
    step_both(kSteps);
    expect_state_like_reference("after the setters and a step");
  }
  engine.flush();
  if (rank == 0) rm_tree(dir);
}

const Case kCases[] = {
    {"stage0", ModelKind::kMlp, 0},
    {"stage1", ModelKind::kMlp, 1},
    {"stage2", ModelKind::kTiedMlp, 2},
    {"stage2_offload", ModelKind::kMlp, 2, "cpu"},
    {"stage2_offload_ratio", ModelKind::kMlp, 2, "cpu", 0.5f},
    {"stage2_nvme", ModelKind::kMlp, 2, "nvme"},
    {"stage2_offload_dpu", ModelKind::kMlp, 2, "cpu", 1.0f, "none", true},
    {"stage3", ModelKind::kUnitMlp, 3},
    {"stage3_offload", ModelKind::kUnitMlp, 3, "cpu"},
    {"stage3_offload_param", ModelKind::kUnitMlp, 3, "cpu", 1.0f, "cpu"},
    {"stage3_param_nvme", ModelKind::kUnitMlp, 3, "cpu", 1.0f, "nvme"},
};

INSTANTIATE_TEST_SUITE_P(Layouts, ReadBack, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// What is refused, on every rank alike (no rank waits in a collective).
TEST(ReadBackErrors, NamedAndRefused) {
  comm::Communicator& comm = world_comm();
  auto model = make_model(ModelKind::kLoraMlp);  // a frozen base under adapters
  config::Config cfg = make_config(2, false, false, comm.world_size(), kBatch / comm.world_size(), 1);
  Engine engine(model, cfg, comm);
  const std::vector<Named> t = trained(*model);
  std::string frozen;
  for (const auto& item : model->named_parameters()) {
    if (!item.value().requires_grad()) frozen = item.key();
  }
  ASSERT_FALSE(frozen.empty());
  auto message = [](const auto& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string typo = t[0].name + "x";
  EXPECT_NE(message([&] { engine.full_master(typo); }).find("did you mean '" + t[0].name + "'"), std::string::npos)
      << message([&] { engine.full_master(typo); });
  EXPECT_NE(message([&] { engine.full_master(frozen); }).find("is frozen"), std::string::npos);
  EXPECT_NE(message([&] { engine.full_grad(t[0].name); }).find("without a backward()"), std::string::npos);
  EXPECT_NE(message([&] { engine.full_optimizer_state(t[0].name, "momentum"); }).find("its states are exp_avg, exp_avg_sq"),
            std::string::npos);
  EXPECT_EQ(engine.optimizer_state_keys(t[0].name), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  // A wrong value on one rank only: every rank fails.
  const at::Tensor good = at::zeros(t[0].p.sizes());
  const at::Tensor value = comm.rank() == comm.world_size() - 1 ? at::zeros({3, 3, 3}) : good;
  EXPECT_NE(message([&] { engine.set_full_master(t[0].name, value); }).find("has shape"), std::string::npos);
  EXPECT_NE(message([&] { engine.set_full_master(t[0].name, at::zeros(t[0].p.sizes(), at::kLong)); })
                .find("floating-point"),
            std::string::npos);
  // Not in a window (a backward whose step has not come).
  const GlobalBatch gb = batch_at(0);
  const int micro = kBatch / comm.world_size();
  engine.backward(micro_loss(ModelKind::kLoraMlp, *model, gb.x.narrow(0, comm.rank() * micro, micro),
                             gb.y.narrow(0, comm.rank() * micro, micro), engine.dtype()));
  EXPECT_NE(message([&] { engine.set_full_master(t[0].name, good); }).find("in the middle of an accumulation window"),
            std::string::npos);
  EXPECT_EQ(engine.full_grad(t[0].name).sizes(), t[0].p.sizes());
  engine.step();
}

}  // namespace
}  // namespace zero::test
