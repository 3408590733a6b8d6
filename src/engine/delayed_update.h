// ZeRO-Offload's one-step delayed parameter update (DPU): the optimizer step
// of step t runs on a worker thread while the forward and backward of step
// t+1 run, and its result reaches the model at the next step() or flush().
// This part owns the worker, whether an update is pending, and its error,
// which sticks: a failed update may have half written the master weights,
// so every later wait() rethrows it.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>

#include "zero/offload/background_worker.h"

namespace zero::detail {

class DelayedUpdate {
 public:
  // enabled: offload_optimizer.delayed_param_update; the first `warmup`
  // optimizer steps are ordinary.
  DelayedUpdate(bool enabled, int warmup);
  // Waits for a running job (it writes buffers that are about to go); a
  // pending update is dropped, and that, or its failure, is said on stderr.
  ~DelayedUpdate();
  DelayedUpdate(const DelayedUpdate&) = delete;
  DelayedUpdate& operator=(const DelayedUpdate&) = delete;

  bool enabled() const { return worker_ != nullptr; }
  int warmup() const { return warmup_; }
  // Whether the step after `steps_taken` ordinary steps is delayed.
  bool should_delay(std::int64_t steps_taken) const { return enabled() && steps_taken >= warmup_; }

  // Starts `job` (the CPU step of optimizer step `step`) on the worker.
  void submit(std::function<void()> job, std::int64_t step);
  // Waits for the job, if any (at once when there is none); rethrows its
  // failure, on this and every later call.
  void wait();
  // Whether a finished (or running) job's update has not reached the model.
  bool pending() const { return pending_; }
  // The caller has applied the pending update.
  void applied() { pending_ = false; }

 private:
  std::unique_ptr<offload::BackgroundWorker> worker_;
  int warmup_ = 0;
  bool pending_ = false;
  std::int64_t pending_step_ = 0;
  std::exception_ptr error_;
};

}  // namespace zero::detail
