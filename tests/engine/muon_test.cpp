// Muon's pieces against DeepSpeed's own numbers (tests/support/deepspeed_muon.h,
// its functions with the Newton-Schulz iteration in fp32): the
// orthogonalization (both methods, wide, tall and square matrices), the
// step before the optimizer's (MuonStep: momentum, look-ahead, update) on a
// flat layout, and the LibTorch reference the engine tests use
// (tests/support/torch_muon.h) over DeepSpeed's training run. Then the rules
// that split the parameters into Muon's and Adam's halves.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include <ATen/ops/from_blob.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/adamw.h>

#include "../support/cpu_allocation_peak.h"
#include "../support/deepspeed_muon.h"
#include "ds_muon_mlp.h"
#include "../support/torch_muon.h"
#include "muon_step.h"
#include "muon_update.h"
#include "zero/comm/communicator.h"
#include "zero/engine/param_rules.h"
#include "zero/zero/muon_plan.h"

namespace zero::test {
namespace {

namespace ds = deepspeed_muon;

// `v` in `shape` ({-1}: flat).
at::Tensor tensor(const std::vector<float>& v, std::vector<std::int64_t> shape) {
  return at::from_blob(const_cast<float*>(v.data()), {static_cast<std::int64_t>(v.size())}, at::kFloat)
      .reshape(shape)
      .clone();
}

detail::NsMethod method(const char* name) {
  return std::string(name) == "gram" ? detail::NsMethod::kGram : detail::NsMethod::kStandard;
}

// The largest difference relative to the largest value of `want`.
double relative_error(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

std::vector<std::int64_t> shape_of(const ds::UpdateCase& c) { return {c.shape.begin(), c.shape.end()}; }
std::string name_of(const ds::UpdateCase& c) {
  std::string n = c.ns_method;
  for (long d : c.shape) n += " " + std::to_string(d);
  return n;
}

TEST(MuonUpdateDirection, MatchesDeepSpeed) {
  double worst = 0;
  for (const ds::UpdateCase& c : ds::kUpdates) {
    const at::Tensor g = tensor(c.grad, {-1});
    const at::Tensor m = tensor(c.momentum_after, {-1});
    const at::Tensor u = detail::muon_update_direction(g.lerp(m, c.beta), shape_of(c), method(c.ns_method));
    // Measured at most 1.8e-6 (fp32 rounding of two orderings of the same
    // products); a coefficient off in its third digit moves it past 1e-3.
    const double e = relative_error(u, tensor(c.update, {-1}));
    worst = std::max(worst, e);
    EXPECT_LE(e, 2e-5) << name_of(c);
  }
  std::printf("[ measured ] largest relative difference %.3g\n", worst);
}

// PyTorch's own Muon (torch.optim.Muon, its bf16 cast made fp32) on the
// same matrices: the same algorithm but for its eps (the norm clamped at
// 1e-7, not 1e-7 added).
TEST(MuonUpdateDirection, MatchesTorchOptimMuon) {
  std::size_t next = 0;
  double worst = 0;
  for (const ds::UpdateCase& c : ds::kUpdates) {
    if (c.shape.size() != 2) continue;
    ASSERT_LT(next, ds::kTorchUpdates.size());
    const at::Tensor v = tensor(c.grad, {-1}).lerp(tensor(c.momentum_after, {-1}), c.beta);
    const double e = relative_error(detail::muon_update_direction(v, shape_of(c), method(c.ns_method)),
                                    tensor(ds::kTorchUpdates[next++], {-1}));
    worst = std::max(worst, e);
    EXPECT_LE(e, 2e-5) << name_of(c);
  }
  EXPECT_EQ(next, ds::kTorchUpdates.size());
  std::printf("[ measured ] largest relative difference %.3g\n", worst);
}

// A convolution's filters (DeepSpeed's muon_update fails on them: its last
// torch.where meets the 2-D update and the 4-D gradient) as Keller Jordan's
// muon.py, which DeepSpeed's copies: orthogonalized as [size(0), the rest],
// scaled by sqrt(max(1, kh / kw)).
TEST(MuonUpdateDirection, ConvolutionFiltersAsKellerJordansMuon) {
  const at::Tensor v = at::randn({6, 2, 4, 3});
  const at::Tensor want = reference_newton_schulz(v.reshape({6, -1})).reshape({-1}) * std::sqrt(4.0 / 3.0);
  for (const char* ns : {"gram", "standard"}) {
    const at::Tensor u = detail::muon_update_direction(v.reshape({-1}), v.sizes(), method(ns));
    EXPECT_LE(relative_error(u, want), 2e-5) << ns;
  }
}

// What the orthogonalization allocates beside its input, measured with
// c10's allocator, stays within what the memory plan counts for it
// (zero::muon_ns_workspace_elements), and not far below it: square, wide,
// tall, batched and convolution shapes, both methods.
TEST(MuonUpdateDirection, AllocatesWithinItsPlannedWorkspace) {
  const std::vector<std::vector<std::int64_t>> shapes = {{64, 64}, {32, 96}, {96, 32}, {3, 24, 40}, {16, 4, 3, 3}};
  for (const char* m : {"gram", "standard"}) {
    for (const auto& shape : shapes) {
      const MuonMatrix planned = muon_matrix(0, shape);
      const at::Tensor v = at::randn({static_cast<std::int64_t>(planned.numel())});
      auto peak = std::make_shared<CpuAllocationPeak>();
      {
        c10::DebugInfoGuard on(c10::DebugInfoKind::PROFILER_STATE, peak);
        const at::Tensor u = detail::muon_update_direction(v, shape, method(m));
      }
      const auto bound = static_cast<std::int64_t>(muon_ns_workspace_elements(planned, std::string(m) == "gram") * sizeof(float));
      const std::string what = std::string(m) + " " + std::to_string(shape.size()) + "-D, " +
                               std::to_string(planned.rows) + " x " + std::to_string(planned.cols);
      std::fprintf(stderr, "%s: measured %lld, planned %lld\n", what.c_str(), static_cast<long long>(peak->bytes()),
                   static_cast<long long>(bound));
      EXPECT_LE(peak->bytes(), bound + 64) << what;  // (+ the norm's scalars)
      EXPECT_GE(peak->bytes(), bound * 3 / 4) << what;
    }
  }
}

// MuonStep on one rank: a bucket holding a parameter of each case (and a
// bias between them that Muon leaves alone), the gradients scaled by 1/4 as a
// loss scale of 4 would leave them.
TEST(MuonStep, MomentumAndUpdateMatchDeepSpeed) {
  for (const char* ns : {"gram", "standard"}) {
    std::vector<const ds::UpdateCase*> cases;
    for (const ds::UpdateCase& c : ds::kUpdates) {
      if (std::string(c.ns_method) == ns) cases.push_back(&c);
    }
    std::vector<std::size_t> numels;
    for (const ds::UpdateCase* c : cases) {
      numels.push_back(c->grad.size());
      numels.push_back(3);  // a bias
    }
    const FlatLayout layout(numels, 1 << 20, 1, 1, 1);
    ASSERT_EQ(layout.buckets().size(), 1u);
    const std::size_t n = layout.partition_numel();
    at::Tensor grads = at::zeros({static_cast<std::int64_t>(n)});
    at::Tensor momentum = at::zeros({static_cast<std::int64_t>(n)});
    at::Tensor update = at::zeros({static_cast<std::int64_t>(n)});
    auto at_param = [&](const at::Tensor& t, std::size_t i) {
      const ParamSlot& s = layout.params()[2 * i];
      return t.narrow(0, static_cast<std::int64_t>(s.offset), static_cast<std::int64_t>(s.numel));
    };
    for (std::size_t i = 0; i < cases.size(); ++i) {
      at_param(grads, i).copy_(tensor(cases[i]->grad, {-1}) * 4.0f);
      at_param(momentum, i).copy_(tensor(cases[i]->momentum, {-1}));
    }
    // (One beta per MuonStep: the cases one at a time.)
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const detail::MuonStep step(layout, 0, {{static_cast<int>(2 * i), shape_of(*cases[i])}}, cases[i]->beta,
                                  method(ns), c10::Device(c10::kCPU));
      const at::Tensor before = momentum.clone();
      step.prepare([&](const Bucket&) { return grads; }, momentum, update, 0.25f,
                   *comm::make_single_process_communicator());
      EXPECT_LE(relative_error(at_param(momentum, i), tensor(cases[i]->momentum_after, {-1})), 1e-6) << name_of(*cases[i]);
      EXPECT_LE(relative_error(at_param(update, i), tensor(cases[i]->update, {-1})), 2e-5) << name_of(*cases[i]);
      // Only this parameter's momentum moved.
      for (std::size_t j = 0; j < cases.size(); ++j) {
        if (j == i) continue;
        EXPECT_TRUE(at_param(momentum, j).equal(at_param(before, j))) << name_of(*cases[i]) << ", " << j;
      }
    }
  }
}

// The reference the engine tests hold the engine to, over DeepSpeed's run:
// TorchMuon on the matrices DeepSpeed gives Muon, LibTorch's AdamW on the
// rest, at kTrainingOptimizer's settings.
TEST(TorchMuonReference, MatchesDeepSpeedTraining) {
  for (const ds::Training& run : ds::kTraining) {
    DsMuonMlp model;
    const auto params = model.parameters();
    ASSERT_EQ(params.size(), run.params[0].size());
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(tensor(run.params[0][i], params[i].sizes().vec()));
    }
    std::vector<at::Tensor> muon, adam;
    for (const auto& item : model.named_parameters()) (muon_by_default(item.key(), item.value()) ? muon : adam).push_back(item.value());
    ASSERT_EQ(muon.size(), 2u);  // fc1.weight, fc2.weight
    TorchMuon muon_opt(muon, TorchMuonOptions(0.02).momentum(0.9).weight_decay(0.1));
    torch::optim::AdamW adam_opt(adam, torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).eps(1e-10).weight_decay(0.1));
    for (int step = 0; step < ds::kSteps; ++step) {
      muon_opt.zero_grad();
      adam_opt.zero_grad();
      const at::Tensor x = tensor(run.x[static_cast<std::size_t>(step)], {ds::kBatch, ds::kIn});
      const at::Tensor y = tensor(run.y[static_cast<std::size_t>(step)], {ds::kBatch, ds::kOut});
      at::mse_loss(model.forward(x), y).backward();
      muon_opt.step();
      adam_opt.step();
      for (std::size_t i = 0; i < params.size(); ++i) {
        const at::Tensor want = tensor(run.params[static_cast<std::size_t>(step) + 1][i], params[i].sizes().vec());
        EXPECT_TRUE(params[i].allclose(want, 1e-5, 1e-6))
            << run.ns_method << " step " << step << " parameter " << i << ": max diff "
            << (params[i] - want).abs().max().item<double>();
      }
    }
  }
}

TEST(MuonRules, DeepSpeedsChoiceAndNamedExceptions) {
  const at::Tensor matrix = at::zeros({4, 3}), bias = at::zeros({4}), conv = at::zeros({8, 3, 2, 2});
  EXPECT_TRUE(muon_by_default("h0.fc.weight", matrix));
  EXPECT_TRUE(muon_by_default("conv.weight", conv));
  EXPECT_FALSE(muon_by_default("h0.fc.bias", bias));
  EXPECT_FALSE(muon_by_default("model.embed_tokens.weight", matrix));
  EXPECT_FALSE(muon_by_default("Embed.weight", matrix));
  EXPECT_FALSE(muon_by_default("lm_head.weight", matrix));
  const MuonRule gpt = muon_except_named({"wte", "wpe"});
  EXPECT_EQ(gpt("wte.weight", matrix), false);
  EXPECT_EQ(gpt("h1.attn.qkv.weight", matrix), true);
  EXPECT_EQ(gpt("h1.attn.qkv.bias", bias), false);
}

}  // namespace
}  // namespace zero::test
