#include "mpi_work.h"

#include <sstream>
#include <thread>

#include "mpi_runtime.h"
#include "zero/comm/mpi_check.h"
#include "zero/core/log.h"
#include "zero/core/error.h"

namespace zero::comm::detail {

MpiWork::MpiWork(MpiOpInfo info, std::vector<MPI_Request> requests,
                 std::vector<std::shared_ptr<const void>> keepalive,
                 std::function<void()> on_complete)
    : info_(info),
      requests_(std::move(requests)),
      keepalive_(std::move(keepalive)),
      on_complete_(std::move(on_complete)) {
  if (requests_.empty()) finish_locked();  // nothing to wait for (no other thread sees us yet)
}

MpiWork::~MpiWork() {
  if (done_.load(std::memory_order_acquire) || mpi_finalized()) return;
  if (std::uncaught_exceptions() > 0) {
    zero::detail::log_warning(zero::log_topic::comm,
                              "%s is abandoned unfinished while an exception propagates; its buffers "
                              "may still be written by MPI",
                              describe().c_str());
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  wait_locked();  // errors stay stored: a destructor must not throw
}

std::string MpiWork::describe() const {
  std::ostringstream os;
  os << "MPI " << collective_name(info_.kind);
  if (info_.kind != CollectiveKind::kBarrier) {
    os << " of " << info_.count << " " << dtype_name(info_.dtype) << " elements";
  }
  os << " on rank " << info_.rank << " of " << info_.world_size;
  return os.str();
}

void MpiWork::fail_locked(int error_code, const char* call) {
  try {
    throw Error(describe() + " failed in " + call + ": " + mpi_error_string(error_code));
  } catch (...) {
    error_ = std::current_exception();
  }
  // Requests after a failed one are left to MPI: the communicator is in error.
  done_.store(true, std::memory_order_release);
}

void MpiWork::finish_locked() {
  if (on_complete_) {
    try {
      on_complete_();
    } catch (...) {
      error_ = std::current_exception();
    }
    on_complete_ = nullptr;
  }
  done_.store(true, std::memory_order_release);
}

bool MpiWork::poll_locked() {
  if (done_.load(std::memory_order_relaxed)) return true;
  while (next_pending_ < requests_.size()) {
    int flag = 0;
    const RequestCompletion ours;
    const int rc = MPI_Test(&requests_[next_pending_], &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      fail_locked(rc, "MPI_Test");
      return true;
    }
    if (!flag) return false;
    ++next_pending_;
  }
  finish_locked();
  return true;
}

void MpiWork::wait_locked() {
  if (done_.load(std::memory_order_relaxed)) return;
  for (; next_pending_ < requests_.size(); ++next_pending_) {
    const RequestCompletion ours;
    const int rc = MPI_Wait(&requests_[next_pending_], MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      fail_locked(rc, "MPI_Wait");
      return;
    }
  }
  finish_locked();
}

void MpiWork::rethrow_if_failed() const {
  if (error_) std::rethrow_exception(error_);
}

void MpiWork::wait(std::chrono::milliseconds timeout) {
  if (done_.load(std::memory_order_acquire)) {
    rethrow_if_failed();
    return;
  }
  if (timeout == std::chrono::milliseconds::max()) {
    // MPI_Wait drives MPI's progress engine as fast as it can.
    std::lock_guard<std::mutex> lock(mutex_);
    wait_locked();
    rethrow_if_failed();
    return;
  }
  // A timed wait polls: MPI has no MPI_Wait with a deadline. Non-blocking
  // collectives only progress inside MPI calls, so poll without sleeping;
  // yield so that oversubscribed ranks on the same core still run.
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (poll_locked()) {
        rethrow_if_failed();
        return;
      }
    }
    const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    if (elapsed >= timeout) break;
    std::this_thread::yield();
  }
  throw Error(describe() + " did not complete within " + std::to_string(timeout.count()) +
              " ms; it is still pending (wait() again). If it never completes, check that every "
              "rank issues the same collectives in the same order with the same sizes");
}

bool MpiWork::is_completed() {
  if (done_.load(std::memory_order_acquire)) return true;
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return false;  // a waiter holds it and will see the completion
  return poll_locked();
}

}  // namespace zero::comm::detail
