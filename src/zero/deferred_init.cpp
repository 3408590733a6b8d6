#include "zero/zero/deferred_init.h"

#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/variable.h>

#include "zero/core/error.h"

namespace zero {

void replace_data(const at::Tensor& t, const at::Tensor& v) {
  ZERO_CHECK(t.defined() && v.defined(), "replace_data needs two defined tensors");
  if (t.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(v.key_set())) {
    t.set_data(v);
    return;
  }
  // Meta <-> a real device: what set_data does, without its type check.
  // Both are plain TensorImpls (no subclass state to carry over); the copy
  // takes v's storage, sizes, strides, dtype, device and dispatch keys, and
  // keeps t's autograd metadata (requires_grad, hooks) and version counter.
  ZERO_CHECK(t.is_meta() || v.is_meta(), "cannot give a ", t.device().str(), " ", c10::toString(t.scalar_type()),
             " tensor the data of a ", v.device().str(), " ", c10::toString(v.scalar_type()), " one");
  ZERO_CHECK(!t.is_sparse() && !v.is_sparse() && t.layout() == at::kStrided && v.layout() == at::kStrided,
             "replace_data handles dense strided tensors only");
  if (auto* meta = torch::autograd::impl::get_autograd_meta(t)) meta->grad_accumulator_.reset();
  t.unsafeGetTensorImpl()->shallow_copy_from(v.getIntrusivePtr());
}

void to_meta(torch::nn::Module& m) {
  at::NoGradGuard no_grad;
  auto move = [](const at::Tensor& t) {
    if (t.defined() && !t.is_meta()) replace_data(t, at::empty(t.sizes(), t.options().device(at::kMeta)));
  };
  for (const at::Tensor& p : m.parameters(/*recurse=*/true)) move(p);
  for (const at::Tensor& b : m.buffers(/*recurse=*/true)) move(b);
}

bool has_meta_tensors(const torch::nn::Module& m) {
  for (const at::Tensor& p : m.parameters(/*recurse=*/true)) {
    if (p.defined() && p.is_meta()) return true;
  }
  for (const at::Tensor& b : m.buffers(/*recurse=*/true)) {
    if (b.defined() && b.is_meta()) return true;
  }
  return false;
}

}  // namespace zero
