// Building a model that does not fit where it is built: parameters without
// memory, filled in by the engine one bucket at a time on its own device.
//
// LibTorch's C++ modules create their parameters on the CPU (torch::nn::Linear
// has no device option) and cannot be moved to the meta device afterwards
// (Module::to(kMeta) is refused: set_data will not cross between meta and a
// real device). to_meta() does that move itself, keeping each tensor object
// (the module's members, such as Linear::weight, still refer to it):
//
//   for (int i = 0; i < n_layer; ++i) {
//     auto block = register_module("h" + std::to_string(i), std::make_shared<Block>(c));
//     zero::mark_unit(*block); // a stage-3 unit (zero/zero/unit.h)
//     zero::to_meta(*block);   // its memory is freed at once: one block at a time on the host
//   }
//   zero::Engine engine(model, config, comm, {.device = device, .init = init_fn});
//
// The engine then gives every meta parameter and buffer its value through
// init_fn on its device (zero/engine/engine.h, EngineOptions). At stage 3 no
// rank ever holds more than one bucket of the full model (docs/engine.md,
// "A model larger than one device"). zero::models::Gpt builds this way when
// asked (its constructor's on_meta).
#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

namespace zero {

// Every parameter and buffer of `m` and its submodules becomes a meta tensor
// of its shape and dtype (requires_grad kept); its memory is freed unless
// something else holds it.
void to_meta(torch::nn::Module& m);

// Whether any parameter or buffer of `m` (recursively) is on the meta device.
bool has_meta_tensors(const torch::nn::Module& m);

// t.set_data(v), also where set_data refuses: from or to the meta device.
// `t` keeps its identity, autograd metadata and requires_grad; a stale
// gradient accumulator (kept for another device or dtype) is dropped as
// set_data does.
void replace_data(const at::Tensor& t, const at::Tensor& v);

}  // namespace zero
