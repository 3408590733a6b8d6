// What the NCCL communicator shares with its Works, and the Work of one NCCL
// collective: a CUDA event recorded on the communication stream after it.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "zero/comm/comm_stats.h"
#include "zero/comm/work.h"
#include "zero/core/dtype.h"

namespace zero::cuda::detail {

// Owned by the communicator and by every Work it issued, so that a Work may
// outlive its communicator (as with the MPI backend). Released by the last.
struct NcclResources {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;  // the communication stream
  cudaEvent_t ready = nullptr;    // recorded on the compute stream before each op
  int* barrier_word = nullptr;    // one device int, all-reduced by barrier()
  // Set once an asynchronous NCCL error was seen: the communicator is then
  // aborted, not destroyed (ncclCommDestroy could wait for peers for ever).
  std::atomic<bool> failed{false};
  // Set by abort(): `comm` is gone. Guarded by `mu` with every use of comm
  // outside the issuing thread (polls, the abort).
  bool aborted = false;
  std::mutex mu;

  // ncclCommAbort now (the communicator failed: a timeout, another rank's
  // failure): NCCL's kernels stop waiting for peers, the streams drain, and
  // every pending op's poll ends with an error. Idempotent, thread-safe.
  void abort();

  NcclResources() = default;
  NcclResources(const NcclResources&) = delete;
  NcclResources& operator=(const NcclResources&) = delete;
  ~NcclResources();
};

// What the op was, for error messages.
struct NcclOpInfo {
  comm::CollectiveKind kind = comm::CollectiveKind::kBarrier;
  std::size_t count = 0;
  DType dtype = DType::kFloat32;
  int rank = 0;
  int world_size = 1;
};

class NcclWork final : public comm::Work {
 public:
  // Takes ownership of `done` (destroyed with the Work; CUDA defers that
  // until the event has fired).
  NcclWork(NcclOpInfo info, cudaEvent_t done, std::shared_ptr<NcclResources> resources);
  // An unfinished Work waits here for its op (its buffers are in use until
  // then), without throwing, except while an exception unwinds the stack:
  // then it is abandoned with a warning, as MpiWork does.
  ~NcclWork() override;
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override;

  // cudaStreamWaitEvent(stream, done): orders `stream` after the op on the
  // device, without blocking the host.
  void wait_on_stream(cudaStream_t stream);
  bool wait_on_device(void* stream) override {
    wait_on_stream(static_cast<cudaStream_t>(stream));
    return true;
  }

 private:
  // Needs mutex_. Queries the event (and NCCL's asynchronous error); true
  // once the op is done, successfully or not.
  bool poll_locked();
  void fail_locked(const std::string& why);
  void rethrow_if_failed() const;
  std::string describe() const;

  NcclOpInfo info_;
  cudaEvent_t done_event_ = nullptr;
  std::shared_ptr<NcclResources> resources_;
  std::mutex mutex_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
};

}  // namespace zero::cuda::detail
