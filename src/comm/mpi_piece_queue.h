// Collectives of one kind issued a piece at a time (the MPI backend's
// reduce-scatters and all-reduces), so that what MPI holds for them stays
// bounded by the piece, whatever the op's size.
//
// Why: Open MPI's non-blocking reduce-scatter (libnbc) reduces the whole
// buffer on rank 0 through two scratch buffers of the buffer's size, and its
// in-place all-reduce through one on the tree's inner ranks, allocated when
// the op is issued. A 400 MB gradient bucket made rank 0 hold 800 MB more
// than the engine's plan (measured: docs/PERFORMANCE.md), which neither the
// ledger nor zero-estimate could see. Issued in pieces of a few MiB, one at
// a time, the scratch is a few MiB.
//
// Order: MPI matches the collectives of a communicator by their order, so
// every rank must issue the pieces of all ops of a kind in the same order.
// The queue keeps them in the order the ops were submitted (the same on
// every rank, as the ops are) and issues the next piece only when the one
// before has completed: its own op's next piece, or the first of the op
// behind it. Progress happens when a Work of the kind is polled or waited
// for (as libnbc's own rounds progress only inside MPI calls).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zero/comm/work.h"

namespace zero::comm::detail {

class MpiPieceQueue {
 public:
  struct Op {
    std::size_t pieces = 1;
    // Issues piece i (0 <= i < pieces) into *request; may throw (MPI_CHECK).
    std::function<void(std::size_t, MPI_Request*)> issue;
    // After the last piece completed, before the op counts as done.
    std::function<void()> on_complete;
    // Filled by the queue (under its lock).
    std::size_t next = 0;  // the next piece to issue
    MPI_Request current = MPI_REQUEST_NULL;
    bool in_flight = false;
    bool done = false;
    std::exception_ptr error;
  };

  // Queues the op; its first piece is issued at once when nothing is ahead.
  void submit(const std::shared_ptr<Op>& op);
  // Drives the queue without blocking; true once `op` is done (or failed).
  bool poll(const Op& op);
  // Drives the queue, blocking in MPI, until `op` is done (or failed).
  void wait(const Op& op);
  // The op's pieces not issued yet are never issued (an op abandoned while
  // an exception unwinds: the other ranks have failed or will time out).
  void abandon(const Op& op);

 private:
  // Completes what has completed and issues what may go; `block`: waits for
  // the head's piece in flight instead of testing it.
  void pump_locked(bool block);
  void fail_locked(Op& op, std::exception_ptr error);

  std::mutex mu_;
  std::deque<std::shared_ptr<Op>> ops_;
};

// The Work of an op in a queue: done once its last piece has completed.
// Like MpiWork: a timed wait polls, and a Work destroyed unfinished is
// completed there, or abandoned (its pieces not yet issued never are) while
// an exception unwinds.
class MpiPieceWork final : public Work {
 public:
  // `describe`: the op in words, for errors; `keepalive`: what the pieces
  // use that the caller does not own (the queue, the MPI communicator and
  // ops, scratch buffers).
  MpiPieceWork(std::shared_ptr<MpiPieceQueue> queue, std::shared_ptr<MpiPieceQueue::Op> op, std::string describe,
               std::vector<std::shared_ptr<const void>> keepalive);
  ~MpiPieceWork() override;
  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override;

 private:
  void rethrow_if_failed() const;
  std::shared_ptr<MpiPieceQueue> queue_;
  std::shared_ptr<MpiPieceQueue::Op> op_;
  std::string describe_;
  std::vector<std::shared_ptr<const void>> keepalive_;
};

}  // namespace zero::comm::detail
