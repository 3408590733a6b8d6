// Units of ZeRO stage 3: the modules whose parameters are gathered just
// before they run and released just after, in forward and again in backward.
// LibTorch's C++ modules have no forward hooks (pytorch/pytorch#25888), so a
// model marks each unit where it calls it — one line, like FSDP's per-block
// wrapping:
//
//   x = zero::unit(*block, x, [&](const at::Tensor& in) { return block->forward(in); });
//
// The engine lays its buckets out per unit when it is built, before any
// forward, so it must also know the units then: zero::unit() marks its
// module on its first call, and a model marks its units at construction with
// mark_unit(*block) (zero::models::Gpt does) — or runs one forward before
// the engine is built. A module marked but then called directly (not through
// zero::unit) meets its released parameters hollow (shape [0]), and most
// LibTorch kernels fail on that shape (some, as LSTM's, crash): call units
// only through zero::unit.
//
// Outside a stage-3 engine (no handler registered for the module) this is
// just the call. Under one, the module's handler gathers before `fn`,
// releases after, and — through gradient hooks on the unit's input and
// output — gathers again before the unit's backward and releases after it.
// A unit called twice in one forward, and recomputation by activation
// checkpointing inside `fn`, are balanced: each gather has its release. The
// end of a unit's backward is the gradient of a view of its input, taken
// before `fn` runs: autograd runs the nodes made later (all of the unit's,
// those computed from its parameters alone too) before it. A floating-point
// input that needs no gradient (data entering a first unit) is given one
// under grad mode: `fn` gets a copy of it made from a leaf that needs a
// gradient (one more input-sized tensor and its gradient; an in-place op in
// `fn` then changes the copy, not the caller's tensor), not for a unit
// whose parameters are all frozen (its backward, if any, comes from
// gradients its input already carries). An
// input that cannot have one (token ids into an Embedding unit) leaves no
// such mark: that unit stays gathered until the whole backward ends.
// zero::models::Gpt marks its blocks.
#pragma once

#include <functional>
#include <memory>
#include <string>

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
  // Whether the unit gathers trainable parameters: a unit whose gathered
  // parameters are all frozen does not make its input a leaf that needs a
  // gradient (no gradient path through a frozen stem that data enters).
  virtual bool trains_parameters() const { return true; }
  // A gather() whose release() comes when the whole backward ends (the
  // backward of a unit whose input cannot carry a gradient, or one run with
  // create_graph: the graph it makes reads the parameters later).
  virtual void gather_until_backward_ends() = 0;
  // One call of the unit whose backward ends at its input: expect_backward()
  // when the call is made; backward_ended(true) when that backward has run
  // (its input's gradient computed), backward_ended(false) when it never
  // will (the graph was freed first). Once every call's backward has ended,
  // no parameter of the unit gets a gradient in this backward any more.
  virtual void expect_backward() {}
  virtual void backward_ended(bool ran) { (void)ran; }
  // Whether `t` shares the memory the unit's parameters are gathered into
  // (a view of a parameter): release() takes that memory away.
  virtual bool shares_gathered_memory(const at::Tensor& t) const {
    (void)t;
    return false;
  }
  // The unit's path in the model ("blocks.0"), for messages; "" when the
  // handler does not know it (messages then name the module's class).
  virtual std::string path() const { return {}; }
  // Expires with the handler: a unit's backward hooks (which may outlive
  // the engine, with the graph that holds them) use it only while alive.
  std::weak_ptr<const void> liveness() const { return alive_; }

 private:
  std::shared_ptr<const void> alive_ = std::make_shared<char>(0);
};

// Marks `m` as a unit of ZeRO stage 3 (idempotent). m must be owned by a
// shared_ptr (every registered submodule is). The mark lasts as long as m.
void mark_unit(const torch::nn::Module& m);
bool is_unit(const torch::nn::Module& m);

// Registers `handler` for module `m` (nullptr removes it). The handler must
// outlive every forward and backward through `m` until removed.
void set_unit_handler(const torch::nn::Module& m, UnitHandler* handler);
UnitHandler* unit_handler(const torch::nn::Module& m);

// Runs fn(x) as unit `m` (see the file comment). fn must return one tensor,
// not a view of the unit's own parameters (their memory is released when fn
// returns: such an output is refused, naming the unit; return a copy).
at::Tensor unit(const torch::nn::Module& m, const at::Tensor& x,
                const std::function<at::Tensor(const at::Tensor&)>& fn);

}  // namespace zero
