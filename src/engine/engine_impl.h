// Engine::Impl: the engine's parts (src/engine/engine.cpp lists them) and
// the state that ties them together, shared by engine.cpp (construction,
// backward, step) and engine_checkpoint.cpp (save and load).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <torch/csrc/autograd/function_hook.h>

#include "checkpoint_save.h"
#include "delayed_update.h"
#include "device_context.h"
#include "grad_path.h"
#include "module_guard.h"
#include "muon_step.h"
#include "optimizer_partition.h"
#include "param_store.h"
#include "precision.h"
#include "step_timeline.h"
#include "unit_schedule.h"
#include "zero/core/log.h"
#include "zero/engine/engine.h"
#include "zero/engine/lr_schedule.h"
#include "zero/zero/memory_plan.h"

namespace zero {

struct Engine::Impl {
  int world = 1, rank = 0, stage = 0;
  bool offload = false;
  detail::DeviceContext ctx;
  detail::Precision precision;
  detail::StepTimeline timeline{ctx};
  detail::StepTimeline::Mark last_mark;  // where the compute stream was when the engine last returned
  // Declared in dependency order: each part may refer to those above it,
  // and is destroyed before them.
  MemoryPlan plan;
  std::unique_ptr<detail::ParamStore> params;
  std::unique_ptr<detail::OptimizerPartition> optimizer;
  std::unique_ptr<detail::MuonStep> muon;  // optimizer "Muon"
  std::unique_ptr<detail::GradPath> grads;
  std::unique_ptr<detail::DelayedUpdate> delayed;
  std::unique_ptr<detail::UnitSchedule> units;  // stage 3
  std::unique_ptr<detail::CheckpointSave> saving;  // a save whose commit is still to come
  // Set while the state is partly overwritten: by a load that failed after
  // it began reading into the engine (engine_checkpoint.cpp).
  std::string damaged_by;
  // After a load: the note that the checkpoint's rate stays in force over
  // another configured one, said at the next backward() unless set_lr()
  // came first (a loop that sets the rate every step, as zero-train's
  // schedule does, chose its rate: the note would contradict it).
  std::string pending_lr_note;
  void check_not_damaged(const char* what) const;
  int update_index = 0;  // the gradient buffer whose step the pending update is
  std::int64_t micro_step = 0;
  // A backward() since the last step(): each micro-batch is one backward()
  // and one step(), in that order.
  bool backward_done = false;
  // Inside engine.backward()'s autograd pass: gradients that arrive
  // otherwise (loss.backward() called directly) are refused, not reduced.
  bool in_backward = false;
  // engine.backward() passes under way in this process, of any engine.
  // Gradients that reach this engine's parameters from another engine's
  // (a GAN's generator loss through its discriminator) are dropped, once
  // said (foreign_grads_told), as a plain loop's zero_grad() before this
  // model's next backward drops them.
  static std::atomic<int>& backwards_running();
  bool foreign_grads_told = false;
  bool no_gradient_told = false;  // a parameter without a gradient in a backward, said once
  // offload_optimizer.publish_in_backward, where it applies (CPU offload
  // with the delayed update at stage 1 or 2, one rank): in the backward that
  // ends a window, each piece of the pending update goes into the model once
  // the worker has stepped it and backward is done with its bucket.
  bool publish_in_backward = false;
  bool publishing_backward = false;    // this backward publishes so
  std::vector<char> bucket_reduced;    // ...and bucket b's gradient is in (its parameters are read no more)
  // Main-share pieces of the pending update published in backward, in
  // order (more than 0: its publish has begun).
  std::size_t published_early = 0;
  // Publishes the pieces that may go now (publish_in_backward).
  void publish_reduced_pieces();
  // The pending update's publish, after what the compute stream has queued:
  // begun, or (pieces already in) carried on.
  void publish_after_current();
  std::int64_t optimizer_step = 0;  // the optimizer's own step count (bias correction)
  // The config's scheduler, until set_lr() takes over.
  std::optional<LrSchedule> schedule;
  // The betas a OneCycle scheduler left when set_lr() turned it off.
  std::optional<LrSchedule::Betas> held_betas;
  // The betas of the next step where a scheduler set them (the running
  // schedule's, or those it left); nullopt: the config's.
  std::optional<LrSchedule::Betas> scheduled_betas() const {
    return schedule ? schedule->applied_betas(optimizer_step) : held_betas;
  }
  comm::CommStats comm_at_step_start;
  // The delayed update's timing: the last step() call, and the delayed
  // steps timed so far (the note of dpu_advice.h is decided on the third).
  std::optional<std::chrono::steady_clock::time_point> last_step_call;
  int delayed_steps_timed = 0;
  // Declared last, so destroyed first: the hooks go before what they call,
  // and the module gets its own tensors back while the flat buffer is alive.
  detail::ModuleGuard guard;

  explicit Impl(const config::Config& config) : precision(config) {}
  using Clock = detail::StepTimeline::Clock;

  // A stage-3 unit's parameter whose gradient came after the unit's
  // backward had ended: backward() names a use while released instead
  // where that is the cause.
  struct LateUnitGradient : Error {
    using Error::Error;
  };
  // Fires once per backward for each parameter, after autograd has
  // accumulated its gradient (also for a parameter used twice).
  struct GradHook : torch::autograd::PostAccumulateGradHook {
    GradHook(Impl* impl, int index) : impl_(impl), index_(index) {}
    void operator()(const at::Tensor& p) override {
      const std::string& name = impl_->params->names()[static_cast<std::size_t>(index_)];
      if (!impl_->in_backward) {
        // Before any buffer is touched: the gradient is dropped, and the
        // window being accumulated stays as it was.
        p.mutable_grad().reset();
        if (backwards_running().load() > 0) {  // another engine's
          if (!impl_->foreign_grads_told && impl_->rank == 0) {
            impl_->foreign_grads_told = true;
            detail::log_info(log_topic::engine,
                             "gradients of this engine's parameters (first '%s') came from another engine's "
                             "backward (a GAN's generator loss through this model): dropped, as a plain loop's "
                             "zero_grad() before this model's next backward drops them. To save computing them, "
                             "set requires_grad false on this model's parameters around that backward (back "
                             "to true before this engine's next backward)",
                             name.c_str());
          }
          return;
        }
        ZERO_CHECK(false, "the gradient of parameter '", name,
                   "' came from a backward that was not engine.backward(loss) (loss.backward() called directly?): "
                   "the engine reduces and steps only the gradients of engine.backward(). It is dropped; call "
                   "engine.backward(loss) instead");
      }
      if (impl_->grads->closed(index_)) {
        p.mutable_grad().reset();
        throw LateUnitGradient("the gradient of parameter '" + name + "' came after its stage-3 unit's backward had "
                               "ended (the backward had reached the unit's input, where the unit's gradients are "
                               "reduced): it is used outside the unit's function as well, earlier in forward. Use it "
                               "inside the unit only, or make its module a unit of its own (or no unit)");
      }
      ZERO_CHECK(p.grad().layout() == at::kStrided, "parameter '", name,
                 "' has a sparse gradient (torch::nn::Embedding with sparse(true)?): zerocpp reduces and steps "
                 "gradients densely; build that module with sparse(false)");
      impl_->grads->on_grad(index_, p.grad());
      // The gradient now lives in its bucket; release the tensor at once.
      p.mutable_grad().reset();
    }
    Impl* impl_;
    int index_;
  };

  // The optimizer step of one share of the partition on gradient buffer
  // `buf` (no collectives). The main share runs on the main thread or the
  // DPU worker; the device share (offload_optimizer.ratio < 1) always on
  // the main thread, before the next backward can write its gradients, its
  // update kept in its staging until published. after_piece (optional):
  // each piece as it is done (the DPU worker reports it; without DPU it goes
  // up at once).
  using Piece = detail::OptimizerPartition::Piece;
  using Share = detail::OptimizerPartition::Share;
  void run_optimizer(int buf, float grad_scale, const detail::StepRates& rates, std::int64_t step,
                     const std::function<void(const Piece&)>& after_piece = {}, Share share = Share::kMain);
  // Where the updated training-precision values of a share (of gradient
  // buffer `buf`) are read from for the model (values undefined: the
  // optimizer wrote the flat buffer itself).
  detail::ParamStore::UpdateSource update_source(int buf, Share share) const;
  // The pending update's values in partition order (for a checkpoint), one
  // tensor per share; empty when they are the fp32 master weights themselves.
  std::vector<at::Tensor> update_parts(int buf) const;
  // One piece of the update of buffer `buf` into the model, in a publish
  // begun by the caller.
  void publish_piece(const Piece& pc, int buf, const char* kind);
  // The update of gradient buffer `buf` into the model: copies and all-gather.
  void apply_update(int buf, comm::Communicator& comm);
  // Before the partition changes (an optimizer step, a flush): an
  // asynchronous save still writing it copies the rest
  // (CheckpointSave::fence()). Returns the seconds it took.
  double fence_save(memory::MemoryLedger& ledger);
  // Waits for the delayed update, if any, and applies it to the model: on a
  // GPU each chunk goes up as soon as the worker has stepped it, so the
  // copies overlap the rest of the CPU step.
  // Returns how long the host waited for a pending update's CPU step, in
  // milliseconds (0 when none was pending).
  double finish_delayed(comm::Communicator& comm);
  // A compute interval from the last mark to now (tracing only).
  void trace_compute(const char* what) {
    if (!timeline.on()) return;
    detail::StepTimeline::Mark now = timeline.mark_current();
    timeline.device_interval("compute", what, last_mark, now);
    last_mark = std::move(now);
  }
};

// A save, a load or a setter only between accumulation windows: after the
// step() that ends one. A backward() whose step() has not come is part of a
// window too: a save would hold the state before its update (a resume would
// lose that micro-batch), a load or a setter would meet its gradients.
// Throws zero::Error naming `call`, how far the window is, and `note`.
void refuse_mid_window(std::int64_t micro_step, bool backward_done, std::int64_t accumulation, const char* call,
                       const char* note = "");

}  // namespace zero
