#include "nccl_work.h"

#include <sstream>
#include <thread>
#include <utility>

#include "zero/core/error.h"
#include "zero/core/log.h"

namespace zero::cuda::detail {

NcclResources::~NcclResources() {
  // Errors are ignored: a destructor must not throw, and each call below
  // releases something whatever the others did.
  int previous = 0;
  const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
  (void)cudaSetDevice(device);
  if (comm != nullptr && !aborted) {
    if (failed.load()) {
      (void)ncclCommAbort(comm);
    } else {
      // Let issued ops finish before the communicator goes.
      if (stream != nullptr) (void)cudaStreamSynchronize(stream);
      (void)ncclCommDestroy(comm);
    }
  }
  if (barrier_word != nullptr) (void)cudaFree(barrier_word);
  if (ready != nullptr) (void)cudaEventDestroy(ready);
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  if (have_previous) (void)cudaSetDevice(previous);
  (void)cudaGetLastError();
}

void NcclResources::abort() {
  const std::lock_guard<std::mutex> lock(mu);
  failed.store(true);
  if (aborted || comm == nullptr) return;
  int previous = 0;
  const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
  (void)cudaSetDevice(device);
  (void)ncclCommAbort(comm);
  aborted = true;
  if (have_previous) (void)cudaSetDevice(previous);
  (void)cudaGetLastError();
}

NcclWork::NcclWork(NcclOpInfo info, cudaEvent_t done, std::shared_ptr<NcclResources> resources)
    : info_(info), done_event_(done), resources_(std::move(resources)) {}

NcclWork::~NcclWork() {
  if (!done_.load(std::memory_order_acquire)) {
    if (std::uncaught_exceptions() > 0) {
      zero::detail::log_warning(zero::log_topic::comm,
                                "%s is abandoned unfinished while an exception propagates; its "
                                "buffers may still be written by NCCL",
                                describe().c_str());
    } else {
      std::lock_guard<std::mutex> lock(mutex_);
      while (!poll_locked()) {  // errors stay stored: a destructor must not throw
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }
  (void)cudaEventDestroy(done_event_);
}

std::string NcclWork::describe() const {
  std::ostringstream os;
  os << "NCCL " << comm::collective_name(info_.kind);
  if (info_.kind != comm::CollectiveKind::kBarrier) {
    os << " of " << info_.count << " " << dtype_name(info_.dtype) << " elements";
  }
  os << " on rank " << info_.rank << " of " << info_.world_size << " (device "
     << resources_->device << ")";
  return os.str();
}

void NcclWork::fail_locked(const std::string& why) {
  try {
    throw Error(describe() + " failed: " + why);
  } catch (...) {
    error_ = std::current_exception();
  }
  done_.store(true, std::memory_order_release);
}

bool NcclWork::poll_locked() {
  if (done_.load(std::memory_order_relaxed)) return true;
  const cudaError_t rc = cudaEventQuery(done_event_);
  if (rc == cudaSuccess) {
    done_.store(true, std::memory_order_release);
    return true;
  }
  if (rc != cudaErrorNotReady) {
    (void)cudaGetLastError();
    fail_locked(std::string("cudaEventQuery: ") + cudaGetErrorName(rc) + ": " +
                cudaGetErrorString(rc));
    return true;
  }
  // Still running. A peer that died or a network failure never fires the
  // event: NCCL reports it here instead.
  const std::lock_guard<std::mutex> comm_lock(resources_->mu);
  if (resources_->aborted) {
    fail_locked("the communicator was aborted (it failed: a timeout or another rank's failure)");
    return true;
  }
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(resources_->comm, &async) == ncclSuccess && async != ncclSuccess &&
      async != ncclInProgress) {
    resources_->failed.store(true);
    std::string why = std::string("NCCL asynchronous error: ") + ncclGetErrorString(async);
    const char* last = ncclGetLastError(resources_->comm);
    if (last != nullptr && last[0] != '\0') why += std::string(" (") + last + ")";
    fail_locked(why);
    return true;
  }
  return false;
}

void NcclWork::rethrow_if_failed() const {
  if (error_) std::rethrow_exception(error_);
}

void NcclWork::wait(std::chrono::milliseconds timeout) {
  if (done_.load(std::memory_order_acquire)) {
    rethrow_if_failed();
    return;
  }
  // Poll rather than cudaEventSynchronize: that would block for ever on a
  // communicator that failed. Spin (yielding) for the first millisecond,
  // where most waits end, then sleep briefly between polls so that a long
  // wait does not take a core from the CPU optimizer.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  constexpr auto kSpin = std::chrono::milliseconds(1);
  constexpr auto kSleep = std::chrono::microseconds(50);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (poll_locked()) {
        rethrow_if_failed();
        return;
      }
    }
    const auto elapsed = Clock::now() - start;
    // Compared in milliseconds: milliseconds::max() (wait for ever) would
    // overflow if converted to the clock's nanoseconds.
    if (std::chrono::duration_cast<std::chrono::milliseconds>(elapsed) >= timeout) break;
    if (elapsed < kSpin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kSleep);
    }
  }
  throw Error(describe() + " did not complete within " + std::to_string(timeout.count()) +
              " ms; it is still pending (wait() again). If it never completes, check that every "
              "rank issues the same collectives in the same order with the same sizes");
}

bool NcclWork::is_completed() {
  if (done_.load(std::memory_order_acquire)) return true;
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return false;  // a waiter holds it and will see the completion
  return poll_locked();
}

void NcclWork::wait_on_stream(cudaStream_t stream) {
  const cudaError_t rc = cudaStreamWaitEvent(stream, done_event_, 0);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(describe() + ": cudaStreamWaitEvent failed: " + cudaGetErrorName(rc) + ": " +
                cudaGetErrorString(rc));
  }
}

}  // namespace zero::cuda::detail
