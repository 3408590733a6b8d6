#include "delayed_update.h"

#include <chrono>

#include "zero/core/log.h"

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
      detail::log_warning(log_topic::step,
                          "the engine was destroyed with a delayed update pending: the update of step %lld "
                          "was dropped and the module keeps the weights of the step before. Call engine.flush() "
                          "after the last step.",
                          static_cast<long long>(pending_step_));
    }
  } catch (const std::exception& e) {
    detail::log_warning(log_topic::step, "the delayed update failed and was dropped: %s", e.what());
  }
}

void DelayedUpdate::submit(std::function<void()> job, std::int64_t step) {
  {
    const std::lock_guard<std::mutex> lock(progress_mu_);
    buckets_done_ = 0;
    job_ended_ = false;
  }
  worker_->submit([this, job = std::move(job)] {
    struct Ended {  // on return and on throw
      DelayedUpdate* self;
      std::chrono::steady_clock::time_point began = std::chrono::steady_clock::now();
      ~Ended() {
        {
          const std::lock_guard<std::mutex> lock(self->progress_mu_);
          self->job_ended_ = true;
          self->last_job_ms_ =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
        }
        self->progress_cv_.notify_all();
      }
    } ended{this};
    job();
  });
  pending_ = true;
  pending_step_ = step;
}

void DelayedUpdate::advance() {
  {
    const std::lock_guard<std::mutex> lock(progress_mu_);
    ++buckets_done_;
  }
  progress_cv_.notify_all();
}

double DelayedUpdate::last_job_ms() const {
  const std::lock_guard<std::mutex> lock(progress_mu_);
  return last_job_ms_;
}

std::size_t DelayedUpdate::done() const {
  const std::lock_guard<std::mutex> lock(progress_mu_);
  return buckets_done_;
}

bool DelayedUpdate::wait_for(std::size_t n) {
  std::unique_lock<std::mutex> lock(progress_mu_);
  progress_cv_.wait(lock, [&] { return buckets_done_ >= n || job_ended_; });
  return buckets_done_ >= n;
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
