// Collectives issued a piece at a time (the MPI backend's reduce-scatters
// and all-reduces), so that what MPI holds for them stays bounded by the
// piece, whatever the op's size.
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
// Each kind is a lane: the ops in the order they were submitted (the same on
// every rank, as the ops are), the next piece issued only when the one
// before has completed (its own op's next piece, or the first of the op
// behind it). Polling or waiting for any op drives every lane, so ranks that
// wait for their ops in different orders (or wait for an op of one kind
// while another rank waits for the other kind) still issue every piece.
// Progress happens when a Work of the queue is polled or waited for (as
// libnbc's own rounds progress only inside MPI calls).
//
// Failure: an MPI error, or an op abandoned while the job fails (its
// buffers may be gone), ends the queue: every op in it, and every op
// submitted later, fails with that error, and no piece is issued again (the
// ranks are out of step; issuing more would match pieces of different ops).
#pragma once

#include <mpi.h>

#include <array>
#include <atomic>
#include <chrono>
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
  enum Lane : std::size_t { kAllReduce, kReduceScatter, kNumLanes };

  struct Op {
    std::size_t pieces = 1;
    // Issues piece i (0 <= i < pieces) into *request; may throw (ZERO_MPI_CHECK).
    std::function<void(std::size_t, MPI_Request*)> issue;
    // After the last piece completed, before the op counts as done.
    std::function<void()> on_complete;
    // Filled by the queue (under its lock; `done` is read without it too).
    std::size_t next = 0;  // the next piece to issue
    MPI_Request current = MPI_REQUEST_NULL;
    bool in_flight = false;
    // The queue ended while a piece was in flight: MPI may still progress it
    // (inside any later MPI call), so what it uses must never be freed.
    bool left_in_flight = false;
    std::atomic<bool> done{false};
    std::exception_ptr error;
  };

  // Queues the op in its lane; its first piece is issued at once when
  // nothing is ahead of it.
  void submit(Lane lane, const std::shared_ptr<Op>& op);
  // Drives every lane without blocking; true once `op` is done (or failed).
  // Never blocks: while another thread drives the queue it says what it
  // knows.
  bool poll(const Op& op);
  // Drives every lane until `op` is done (or failed).
  void wait(const Op& op);
  // An op abandoned while the job fails: the queue ends (see above).
  void abandon(const Op& op, const std::string& why);

 private:
  // Completes what has completed and issues what may go, in every lane.
  void pump_locked();
  // The queue ends: every op in it fails with `error`, and later ones too.
  void end_locked(std::exception_ptr error);

  std::mutex mu_;
  std::array<std::deque<std::shared_ptr<Op>>, kNumLanes> lanes_;
  std::exception_ptr ended_;  // set: the queue has ended
};

// A piece's scratch (a reduce-scatter's pack, an all-reduce's staged copy):
// allocated when the op's first piece is issued, not when the op is queued
// behind others, and released after its last piece (the Work keeps the
// object, so MPI never writes into freed memory even when abandoned).
class PieceBuffer {
 public:
  explicit PieceBuffer(std::size_t bytes) : bytes_(bytes) {}
  unsigned char* get() {
    if (!data_) data_.reset(new unsigned char[bytes_]);
    return data_.get();
  }
  void release() { data_.reset(); }

 private:
  std::size_t bytes_;
  std::unique_ptr<unsigned char[]> data_;
};

// The Work of an op in a queue: done once its last piece has completed.
// Like MpiWork: a timed wait polls, and a Work destroyed unfinished is
// completed there, or, while an exception unwinds, abandoned (the queue
// ends: its buffers may be gone, and the other ranks may never join).
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
  void abandon() override;

 private:
  void rethrow_if_failed() const;
  std::shared_ptr<MpiPieceQueue> queue_;
  std::shared_ptr<MpiPieceQueue::Op> op_;
  std::string describe_;
  std::vector<std::shared_ptr<const void>> keepalive_;
};

}  // namespace zero::comm::detail
