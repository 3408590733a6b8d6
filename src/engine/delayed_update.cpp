#include "delayed_update.h"

#include <cstdio>

namespace zero::detail {

DelayedUpdate::DelayedUpdate(bool enabled, int warmup) : warmup_(warmup) {
  if (enabled) worker_ = std::make_unique<offload::BackgroundWorker>();
}

DelayedUpdate::~DelayedUpdate() {
  if (!worker_) return;
  const bool was_pending = pending_;
  try {
    wait();
    if (was_pending) {
      std::fprintf(stderr,
                   "zerocpp: the engine was destroyed with a delayed update pending: the update of step %lld "
                   "was dropped and the module keeps the weights of the step before. Call engine.flush() "
                   "after the last step.\n",
                   static_cast<long long>(pending_step_));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerocpp: the delayed update failed and was dropped: %s\n", e.what());
  }
}

void DelayedUpdate::submit(std::function<void()> job, std::int64_t step) {
  worker_->submit(std::move(job));
  pending_ = true;
  pending_step_ = step;
}

void DelayedUpdate::wait() {
  if (error_) std::rethrow_exception(error_);
  if (!worker_) return;
  try {
    worker_->wait();
  } catch (...) {
    error_ = std::current_exception();
    pending_ = false;
    throw;
  }
}

}  // namespace zero::detail
