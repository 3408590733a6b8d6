#include "module_guard.h"

#include <exception>

#include <ATen/ops/empty_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/variable.h>

#include "zero/core/log.h"
#include "zero/zero/deferred_init.h"

namespace zero::detail {

void ModuleGuard::will_replace_trainable(const at::Tensor& t) {
  trainable_.push_back({t, t.detach()});
}

void ModuleGuard::will_cast(const at::Tensor& t) { casts_.push_back({t, t.detach(), t.scalar_type()}); }

void ModuleGuard::will_view(const at::Tensor& t) { casts_.push_back({t, t.detach(), t.scalar_type(), true}); }

void ModuleGuard::install_hook(const at::Tensor& t,
                               std::unique_ptr<torch::autograd::PostAccumulateGradHook> hook) {
  hooks_.push_back({t, hook.get()});
  torch::autograd::impl::set_post_acc_grad_hooks(t, std::move(hook));
}

void ModuleGuard::commit() {
  committed_ = true;
  for (auto& r : trainable_) r.original = at::Tensor();
  for (auto& c : casts_) c.original = at::Tensor();
}

ModuleGuard::~ModuleGuard() {
  try {
    at::NoGradGuard no_grad;
    for (const auto& h : hooks_) {
      auto& slot = torch::autograd::impl::post_acc_grad_hooks(h.param);
      if (slot.get() == h.hook) slot.reset();
    }
    for (auto& r : trainable_) {
      if (!committed_) {
        replace_data(r.param, r.original);  // also back to the meta device
      } else {
        // A tensor of its own: the flat buffer it viewed goes with the engine.
        at::Tensor own = at::empty_like(r.param, r.param.options().dtype(at::kFloat),
                                        at::MemoryFormat::Contiguous);
        own.copy_(r.param.detach());
        r.param.set_data(own);
      }
      r.param.mutable_grad().reset();
    }
    for (auto& c : casts_) {
      replace_data(c.tensor, !committed_ ? c.original
                             : c.view   ? c.tensor.detach().to(c.dtype, /*non_blocking=*/false, /*copy=*/true)
                                        : c.tensor.detach().to(c.dtype));
    }
  } catch (const std::exception& e) {
    detail::log_warning(log_topic::engine, "could not give the module back its own tensors: %s", e.what());
  }
}

}  // namespace zero::detail
