// The Work of an MPI non-blocking collective: one or more MPI requests (an op
// split into several MPI calls has several), completed by MPI_Test/MPI_Wait.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "zero/comm/comm_stats.h"
#include "zero/comm/work.h"
#include "zero/core/dtype.h"

namespace zero::comm::detail {

// What the op was, for error messages (built only when one is thrown).
struct MpiOpInfo {
  CollectiveKind kind = CollectiveKind::kBarrier;
  std::size_t count = 0;
  DType dtype = DType::kFloat32;
  int rank = 0;
  int world_size = 1;
};

class MpiWork final : public Work {
 public:
  // `keepalive` holds what the requests use and the caller does not own (the
  // MPI communicator and ops, scratch buffers). `on_complete` runs once,
  // after every request has completed successfully, on the thread that sees
  // the completion.
  MpiWork(MpiOpInfo info, std::vector<MPI_Request> requests,
          std::vector<std::shared_ptr<const void>> keepalive,
          std::function<void()> on_complete = {});
  // An unfinished Work is completed here (its buffers are in use until then),
  // except while an exception unwinds the stack: then the other ranks may
  // never join, so it is abandoned with a warning on stderr rather than
  // hanging the process before the exception can report.
  ~MpiWork() override;

  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override;

 private:
  // Both need mutex_ held. poll_locked tests the pending requests and returns
  // true once the Work is done (successfully or not); wait_locked blocks.
  bool poll_locked();
  void wait_locked();
  void finish_locked();
  void fail_locked(int error_code, const char* call);
  void rethrow_if_failed() const;
  std::string describe() const;

  MpiOpInfo info_;
  std::mutex mutex_;
  std::atomic<bool> done_{false};
  std::vector<MPI_Request> requests_;
  std::size_t next_pending_ = 0;  // requests before it have completed
  std::vector<std::shared_ptr<const void>> keepalive_;
  std::function<void()> on_complete_;
  std::exception_ptr error_;
};

}  // namespace zero::comm::detail
