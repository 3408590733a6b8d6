// Muon as a torch::optim::Optimizer, in LibTorch tensor operations: the
// reference the tests hold zerocpp's Muon to. LibTorch has no Muon (torch.optim.Muon
// is Python, and iterates in bf16); this is Keller Jordan's algorithm as
// DeepSpeed's muon_update and torch.optim.Muon write it, with the
// Newton-Schulz iteration in fp32:
//
//   buf.lerp_(grad, 1 - momentum)
//   update = grad.lerp(buf, momentum)              (Nesterov)
//   X = update / (||update||_F + 1e-7), on its transpose if tall
//   5 times: A = X Xᵀ; X = a X + (b A + c A²) X    (a, b, c = 3.4445, -4.7750, 2.0315)
//   update = X * sqrt(max(1, rows / cols))
//   p.mul_(1 - lr * wd); p.add_(update, -lr)
//
// for parameters of two dimensions or more (viewed as [size(0), the rest]).
// muon_test checks it against DeepSpeed's own numbers
// (tests/support/deepspeed_muon.h). It shares no code with the engine's
// (src/engine/muon_update.cpp, muon_step.cpp).
#pragma once

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

namespace zero::test {

inline at::Tensor reference_newton_schulz(const at::Tensor& g) {
  constexpr double a = 3.4445, b = -4.7750, c = 2.0315;
  const bool tall = g.size(0) > g.size(1);
  at::Tensor x = tall ? g.t() : g;
  x = x / (x.norm() + 1e-7);
  for (int i = 0; i < 5; ++i) {
    const at::Tensor A = at::matmul(x, x.t());
    x = a * x + at::matmul(b * A + c * at::matmul(A, A), x);
  }
  if (tall) x = x.t();
  return x * std::sqrt(std::max(1.0, static_cast<double>(g.size(0)) / static_cast<double>(g.size(1))));
}

struct TorchMuonOptions : public torch::optim::OptimizerCloneableOptions<TorchMuonOptions> {
  TorchMuonOptions() = default;
  explicit TorchMuonOptions(double lr) : lr_(lr) {}
  TORCH_ARG(double, lr) = 0.02;
  TORCH_ARG(double, momentum) = 0.95;
  TORCH_ARG(double, weight_decay) = 0.0;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double value) override { lr(value); }
};

struct TorchMuonState : public torch::optim::OptimizerCloneableParamState<TorchMuonState> {
  TORCH_ARG(at::Tensor, momentum_buffer);
};

class TorchMuon : public torch::optim::Optimizer {
 public:
  explicit TorchMuon(const std::vector<torch::optim::OptimizerParamGroup>& groups, TorchMuonOptions defaults = {})
      : Optimizer(groups, std::make_unique<TorchMuonOptions>(defaults)) {}
  explicit TorchMuon(std::vector<at::Tensor> params, TorchMuonOptions defaults = {})
      : TorchMuon({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  at::Tensor step(LossClosure closure = nullptr) override {
    at::NoGradGuard no_grad;
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode grad(true);
      loss = closure();
    }
    for (auto& group : param_groups_) {
      const auto& o = static_cast<const TorchMuonOptions&>(group.options());
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        const at::Tensor grad = p.grad().reshape({p.size(0), -1});
        auto& slot = state_[p.unsafeGetTensorImpl()];
        if (!slot) {
          auto s = std::make_unique<TorchMuonState>();
          s->momentum_buffer(at::zeros_like(grad));
          slot = std::move(s);
        }
        at::Tensor buf = static_cast<TorchMuonState&>(*slot).momentum_buffer();
        buf.lerp_(grad, 1.0 - o.momentum());
        const at::Tensor update = reference_newton_schulz(grad.lerp(buf, o.momentum()));
        p.mul_(1.0 - o.lr() * o.weight_decay());
        p.add_(update.reshape(p.sizes()), -o.lr());
      }
    }
    return loss;
  }
};

}  // namespace zero::test
