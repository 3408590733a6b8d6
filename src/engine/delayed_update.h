// ZeRO-Offload's one-step delayed parameter update (DPU): the optimizer step
// of step t runs on a worker thread while the forward and backward of step
// t+1 run, and its result reaches the model at the next step() or flush().
// This part owns the worker, whether an update is pending, and its error,
// which sticks: a failed update may have half written the master weights,
// so every later wait() rethrows it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

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
  // A load replaces the state the update belongs to: the pending update,
  // and a failure of its job, are forgotten (after wait()). The load then
  // restores one, or none.
  void discard() {
    error_ = nullptr;
    pending_ = false;
    const std::lock_guard<std::mutex> lock(progress_mu_);
    buckets_done_ = 0;
    job_ended_ = true;
  }
  // A checkpoint's pending update (of optimizer step `step`) is in the
  // update buffers: the next wait() finds it pending, as after a job. No
  // job runs for it, so every piece of it counts as done: a publish that
  // waits for pieces (on a GPU, or in backward) must not wait for a job.
  void restore_pending(std::int64_t step) {
    {
      const std::lock_guard<std::mutex> lock(progress_mu_);
      buckets_done_ = static_cast<std::size_t>(-1);
      job_ended_ = true;
    }
    pending_ = true;
    pending_step_ = step;
  }

  // How far the running job has come, in buckets, so that the main thread
  // can copy each finished one up while the rest are stepped: the job calls
  // advance() after each bucket; wait_for(n) blocks until n buckets are done
  // (true) or the job has ended, done or failed, short of n (false).
  void advance();
  bool wait_for(std::size_t n);
  // How many the running (or last) job has finished so far; never waits.
  std::size_t done() const;
  // How long the last finished job ran on the worker, in milliseconds (0
  // before the first).
  double last_job_ms() const;

 private:
  std::unique_ptr<offload::BackgroundWorker> worker_;
  int warmup_ = 0;
  bool pending_ = false;
  std::int64_t pending_step_ = 0;
  std::exception_ptr error_;
  mutable std::mutex progress_mu_;
  std::condition_variable progress_cv_;
  std::size_t buckets_done_ = 0;
  bool job_ended_ = false;
  double last_job_ms_ = 0.0;
};

}  // namespace zero::detail
