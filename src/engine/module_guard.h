// What zero::Engine changes in the user's module, undone when the engine goes.
//
// The engine turns the trainable parameters into views of its flat buffer in
// the training precision, casts frozen floating-point parameters and buffers
// to that precision, and installs a post-accumulate-grad hook on every
// trainable parameter. A ModuleGuard records each change as it is made and,
// when destroyed, leaves the module a plain LibTorch module again:
//  - the hooks it installed are removed (a hook someone else installed since
//    is left alone), so a backward after the engine is gone is an ordinary
//    backward, not a call into freed memory;
//  - before commit() (the constructor failed): every parameter and buffer gets
//    back the very tensor it had, values and dtype untouched;
//  - after commit() (the engine was built and has trained): each trainable
//    parameter becomes an fp32 tensor of its own holding the value the module
//    computes with (the training-precision value, widened; in fp32 training
//    exactly the master weight), and frozen parameters and buffers get back
//    their original dtype. A second Engine can then be built on the module.
// Private to zero_engine.
#pragma once

#include <memory>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/autograd/function_hook.h>

namespace zero::detail {

class ModuleGuard {
 public:
  ModuleGuard() = default;
  ~ModuleGuard();
  ModuleGuard(const ModuleGuard&) = delete;
  ModuleGuard& operator=(const ModuleGuard&) = delete;

  // Before `t.set_data(...)` of a trainable parameter: remembers its tensor.
  void will_replace_trainable(const at::Tensor& t);
  // Before casting a frozen parameter or buffer: remembers its tensor and dtype.
  void will_cast(const at::Tensor& t);
  // Before making a frozen parameter a view of the engine's memory (stage
  // 3 partitions it): the same, and once committed it gets a tensor of its
  // own back, as a trainable one does.
  void will_view(const at::Tensor& t);
  // Installs `hook` as t's post-accumulate-grad hook (LibTorch keeps one per tensor).
  void install_hook(const at::Tensor& t, std::unique_ptr<torch::autograd::PostAccumulateGradHook> hook);
  // The engine is built: the original tensors are no longer kept.
  void commit();

 private:
  struct Replaced {
    at::Tensor param;     // the module's parameter (its TensorImpl stays the module's)
    at::Tensor original;  // its data before the engine (empty after commit)
  };
  struct Cast {
    at::Tensor tensor;
    at::Tensor original;  // empty after commit
    c10::ScalarType dtype;
    bool view = false;  // will_view()
  };
  struct Hooked {
    at::Tensor param;
    const torch::autograd::PostAccumulateGradHook* hook;
  };
  std::vector<Replaced> trainable_;
  std::vector<Cast> casts_;
  std::vector<Hooked> hooks_;
  bool committed_ = false;
};

}  // namespace zero::detail
