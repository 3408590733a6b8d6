#include "zero/offload/background_worker.h"

#include "zero/core/error.h"

namespace zero::offload {

BackgroundWorker::BackgroundWorker() : thread_([this] { run(); }) {}

BackgroundWorker::~BackgroundWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundWorker::submit(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  ZERO_INTERNAL_ASSERT(done_, "a job was submitted before the previous one was waited for");
  job_ = std::move(job);
  has_job_ = true;
  done_ = false;
  cv_.notify_all();
}

void BackgroundWorker::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

bool BackgroundWorker::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !done_;
}

void BackgroundWorker::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return has_job_ || stop_; });
    if (stop_ && !has_job_) return;
    std::function<void()> job = std::move(job_);
    has_job_ = false;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    done_ = true;
    cv_.notify_all();
  }
}

}  // namespace zero::offload
