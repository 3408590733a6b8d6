// Lion as a torch::optim::Optimizer, in LibTorch tensor operations: the
// reference the tests hold zerocpp's Lion to. LibTorch has no Lion; this is
// the paper's Program 1 (Chen et al. 2023, "Symbolic Discovery of
// Optimization Algorithms") as the public PyTorch implementations write it
// (google/automl's lion_pytorch.py, lucidrains/lion-pytorch):
//
//   p.mul_(1 - lr * wd)
//   update = (exp_avg * beta1 + grad * (1 - beta1)).sign()
//   p.add_(update, -lr)
//   exp_avg.mul_(beta2).add_(grad, 1 - beta2)
//
// with param groups and set_lr as LibTorch's own optimizers have them. It
// shares no code with the engine's kernel (src/optim/lion_kernel.cpp).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

namespace zero::test {

struct TorchLionOptions : public torch::optim::OptimizerCloneableOptions<TorchLionOptions> {
  TorchLionOptions() = default;
  explicit TorchLionOptions(double lr) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.999;
  TORCH_ARG(double, weight_decay) = 0.0;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double value) override { lr(value); }
};

struct TorchLionState : public torch::optim::OptimizerCloneableParamState<TorchLionState> {
  TORCH_ARG(at::Tensor, exp_avg);
};

class TorchLion : public torch::optim::Optimizer {
 public:
  explicit TorchLion(const std::vector<torch::optim::OptimizerParamGroup>& groups, TorchLionOptions defaults = {})
      : Optimizer(groups, std::make_unique<TorchLionOptions>(defaults)) {}
  explicit TorchLion(std::vector<at::Tensor> params, TorchLionOptions defaults = {})
      : TorchLion({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  at::Tensor step(LossClosure closure = nullptr) override {
    at::NoGradGuard no_grad;
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode grad(true);
      loss = closure();
    }
    for (auto& group : param_groups_) {
      const auto& o = static_cast<const TorchLionOptions&>(group.options());
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        const at::Tensor grad = p.grad();
        auto& slot = state_[p.unsafeGetTensorImpl()];
        if (!slot) {
          auto s = std::make_unique<TorchLionState>();
          s->exp_avg(at::zeros_like(p));
          slot = std::move(s);
        }
        at::Tensor exp_avg = static_cast<TorchLionState&>(*slot).exp_avg();
        p.mul_(1.0 - o.lr() * o.weight_decay());
        const at::Tensor update = (exp_avg * o.beta1()).add(grad, 1.0 - o.beta1()).sign();
        p.add_(update, -o.lr());
        exp_avg.mul_(o.beta2()).add_(grad, 1.0 - o.beta2());
      }
    }
    return loss;
  }
};

}  // namespace zero::test
