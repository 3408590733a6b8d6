// Work: the handle of an asynchronous collective, like c10d's Work.
//
// Every Communicator op returns one as soon as the op is issued. The buffers
// the op was given belong to the op until wait() returns (or is_completed()
// has returned true): do not read, write or free them before.
#pragma once

#include <chrono>
#include <memory>

namespace zero::comm {

class Work {
 public:
  virtual ~Work() = default;

  // Blocks until the op is done. Throws zero::Error:
  //  - the stored error, every time wait() is called, if the op failed;
  //  - an error naming the op and the timeout if it is not done in `timeout`.
  //    The op is then still pending (a timeout cancels nothing): wait() again.
  // The default timeout waits for ever.
  virtual void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::max()) = 0;

  // Never blocks. True once the op is done, also when it failed (wait() then
  // throws). False while another thread is inside wait() of this Work
  // (that thread will see the completion).
  virtual bool is_completed() = 0;

  // Device backends (NCCL): makes `stream` (a cudaStream_t as void*) wait
  // for the op on the device, without blocking the host, and returns true:
  // what that stream runs next sees the op's results. The host must still
  // wait() (or see is_completed()) before it reads or frees the buffers
  // itself, and that wait is where a failure or a timeout shows. Host
  // backends have nothing to order and return false: wait() then.
  virtual bool wait_on_device(void* stream) {
    (void)stream;
    return false;
  }

  // The job is failing and the op will not be waited for (the communicator
  // keeps the Work, never completed: comm_monitor.h): a backend that would
  // still issue parts of it later stops, since its buffers may be gone.
  // Default: nothing to stop.
  virtual void abandon() {}

  // The backend's Work inside a wrapper (every Communicator op returns its
  // backend's Work wrapped, see communicator.h), or nullptr for a backend's
  // own Work. For backend-specific calls such as cuda::wait_on_stream.
  virtual Work* wrapped() { return nullptr; }
};

using WorkPtr = std::shared_ptr<Work>;

// A Work that is already done: what an op with nothing to move returns
// (count == 0, or any op of the single-process backend).
WorkPtr make_completed_work();

}  // namespace zero::comm
