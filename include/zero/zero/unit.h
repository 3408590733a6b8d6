// Units of ZeRO stage 3: the modules whose parameters are gathered just
// before they run and released just after, in forward and again in backward.
// LibTorch's C++ modules have no forward hooks (pytorch/pytorch#25888), so a
// model marks each unit where it calls it — one line, like FSDP's per-block
// wrapping:
//
//   x = zero::unit(*block, x, [&](const at::Tensor& in) { return block->forward(in); });
//
// Outside a stage-3 engine (no handler registered for the module) this is
// just the call. Under one, the module's handler gathers before `fn`,
// releases after, and — through gradient hooks on the unit's input and
// output — gathers again before the unit's backward and releases after it.
// A unit called twice in one forward, and recomputation by activation
// checkpointing inside `fn`, are balanced: each gather has its release. An
// input that needs no gradient is given one (a leaf) under grad mode, so
// that the end of the unit's backward is known: one extra input gradient
// for a first unit fed with data.
// zero::models::Gpt marks its blocks.
#pragma once

#include <functional>

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

namespace zero {

// What a stage-3 engine does for one unit. gather() and release() nest:
// the parameters are gathered while any gather() is not yet released.
class UnitHandler {
 public:
  virtual ~UnitHandler() = default;
  virtual void gather() = 0;
  virtual void release() = 0;
};

// Registers `handler` for module `m` (nullptr removes it). The handler must
// outlive every forward and backward through `m` until removed.
void set_unit_handler(const torch::nn::Module& m, UnitHandler* handler);
UnitHandler* unit_handler(const torch::nn::Module& m);

// Runs fn(x) as unit `m` (see the file comment). fn must return one tensor.
at::Tensor unit(const torch::nn::Module& m, const at::Tensor& x,
                const std::function<at::Tensor(const at::Tensor&)>& fn);

}  // namespace zero
