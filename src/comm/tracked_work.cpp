#include "tracked_work.h"

#include <exception>
#include <optional>
#include <string>
#include <thread>

#include "zero/core/error.h"

namespace zero::comm::detail {
namespace {

using Clock = std::chrono::steady_clock;

// How long to wait between polls after `waited`: the first 20 ms poll as
// fast as the transport can (MPI's non-blocking collectives only progress
// inside MPI calls, and most waits end there), yielding so that ranks sharing
// a core still run; a longer wait is for a slower rank, and polls every
// 200 us cost it nothing.
void pause(Clock::duration waited) {
  if (waited < std::chrono::milliseconds(20)) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

TrackedWork::TrackedWork(WorkPtr inner, std::uint64_t seq, std::shared_ptr<CommMonitor> monitor)
    : inner_(std::move(inner)), seq_(seq), monitor_(std::move(monitor)) {}

TrackedWork::~TrackedWork() {
  if (done_.load(std::memory_order_acquire)) return;
  if (inner_->is_completed()) {
    // Dropped unwaited: a failure is not thrown (a destructor), but it is
    // recorded, and the communicator fails so that the next op reports it.
    try {
      inner_->wait(std::chrono::milliseconds::max());  // done: returns at once or rethrows
      finish(OpState::kCompleted);
    } catch (const std::exception& e) {
      finish(OpState::kFailed);
      monitor_->mark_failed(e.what());
    }
    return;
  }
  if (std::uncaught_exceptions() > 0 || monitor_->failed() || monitor_->remote_failure_announced()) {
    // The job is failing: the other ranks may never join.
    monitor_->recorder().finish(seq_, OpState::kAbandoned);
    monitor_->abandon(seq_, std::move(inner_));
    return;
  }
  // A dropped op completes here (its buffers are in use until then), within
  // comm_timeout like any wait; a destructor cannot throw, so a failure marks
  // the communicator failed and the next op reports it.
  try {
    wait(std::chrono::milliseconds::max());
  } catch (const std::exception& e) {
    monitor_->mark_failed(e.what());
  }
}

void TrackedWork::finish(OpState state) {
  if (done_.exchange(true, std::memory_order_acq_rel)) return;
  monitor_->recorder().finish(seq_, state);
}

bool TrackedWork::is_completed() {
  if (done_.load(std::memory_order_acquire)) return true;
  return inner_->is_completed();
}

void TrackedWork::wait(std::chrono::milliseconds timeout) {
  if (done_.load(std::memory_order_acquire)) {
    if (error_) std::rethrow_exception(error_);
    if (inner_) inner_->wait(std::chrono::milliseconds::max());  // rethrows a stored failure
    return;
  }
  const bool fatal = timeout == std::chrono::milliseconds::max();
  const std::chrono::milliseconds limit = fatal ? monitor_->timeout() : timeout;
  const Clock::time_point start = Clock::now();
  Clock::time_point next_check = start;
  for (;;) {
    if (inner_->is_completed()) {
      try {
        inner_->wait(std::chrono::milliseconds::max());  // done: returns at once or rethrows
      } catch (const std::exception& e) {
        finish(OpState::kFailed);
        try {
          monitor_->throw_failure(seq_, e.what());
        } catch (...) {
          error_ = std::current_exception();
          throw;
        }
      }
      finish(OpState::kCompleted);
      return;
    }
    const Clock::time_point now = Clock::now();
    if (now >= next_check) {  // every 10 ms: did another rank fail?
      next_check = now + std::chrono::milliseconds(10);
      if (monitor_->failed()) {
        // An earlier op of this communicator timed out or failed: the ranks
        // are out of step and this op cannot complete either.
        monitor_->recorder().finish(seq_, OpState::kAbandoned);
        done_.store(true, std::memory_order_release);
        monitor_->abandon(seq_, std::move(inner_));
        try {
          monitor_->check_usable();
        } catch (...) {
          error_ = std::current_exception();
          throw;
        }
      }
      if (monitor_->remote_failure_announced()) {
        monitor_->recorder().finish(seq_, OpState::kAbandoned);
        done_.store(true, std::memory_order_release);
        monitor_->abandon(seq_, std::move(inner_));
        try {
          monitor_->throw_remote_failure("op #" + std::to_string(seq_));
        } catch (...) {
          error_ = std::current_exception();
          throw;
        }
      }
    }
    if (now - start >= limit) {
      if (!fatal) {
        const std::optional<OpRecord> r = monitor_->recorder().find(seq_);
        throw Error((r ? "collective #" + std::to_string(seq_) + " (" + describe(r->sig) + ")"
                       : "collective #" + std::to_string(seq_)) +
                    " did not complete within " +
                    std::to_string(timeout.count()) +
                    " ms; it is still pending (wait() again). If it never completes, check that "
                    "every rank issues the same collectives in the same order with the same sizes");
      }
      done_.store(true, std::memory_order_release);
      monitor_->recorder().finish(seq_, OpState::kTimedOut);
      monitor_->abandon(seq_, std::move(inner_));
      try {
        monitor_->throw_timeout(seq_);
      } catch (...) {
        error_ = std::current_exception();
        throw;
      }
    }
    pause(now - start);
  }
}

}  // namespace zero::comm::detail
