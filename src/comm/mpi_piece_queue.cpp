#include "mpi_piece_queue.h"

#include <string>
#include <thread>

#include "mpi_runtime.h"
#include "zero/comm/mpi_check.h"
#include "zero/core/log.h"
#include "zero/core/error.h"

namespace zero::comm::detail {

void MpiPieceQueue::submit(Lane lane, const std::shared_ptr<Op>& op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) {
    op->error = ended_;
    op->done.store(true, std::memory_order_release);
    return;
  }
  lanes_[lane].push_back(op);
  pump_locked();
}

bool MpiPieceQueue::poll(const Op& op) {
  if (op.done.load(std::memory_order_acquire)) return true;
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return op.done.load(std::memory_order_acquire);  // another thread drives it
  pump_locked();
  return op.done.load(std::memory_order_acquire);
}

void MpiPieceQueue::wait(const Op& op) {
  // Polls every lane (not MPI_Wait on this op's piece: the piece another
  // rank waits for may be in the other lane, or behind one that only a
  // poll issues), yielding so that oversubscribed ranks on a core still run.
  while (!op.done.load(std::memory_order_acquire)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pump_locked();
    }
    if (!op.done.load(std::memory_order_acquire)) std::this_thread::yield();
  }
}

void MpiPieceQueue::abandon(const Op& op, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (op.done.load(std::memory_order_acquire) || ended_) return;
  try {
    throw Error("an earlier collective was abandoned (" + why +
                "): the ranks are out of step, and no more pieces of reduce-scatters or all-reduces are issued");
  } catch (...) {
    end_locked(std::current_exception());
  }
}

void MpiPieceQueue::end_locked(std::exception_ptr error) {
  ended_ = error;
  for (auto& lane : lanes_) {
    for (const std::shared_ptr<Op>& op : lane) {
      // A piece in flight stays MPI's (its buffers may still be written, as
      // for any abandoned Work); nothing more is issued.
      op->error = error;
      op->left_in_flight = op->in_flight;
      op->in_flight = false;
      op->done.store(true, std::memory_order_release);
    }
    lane.clear();
  }
}

void MpiPieceQueue::pump_locked() {
  for (auto& lane : lanes_) {
    while (!lane.empty() && !ended_) {
      Op& head = *lane.front();
      if (head.in_flight) {
        int flag = 0;
        const RequestCompletion ours;
        const int rc = MPI_Test(&head.current, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
          try {
            throw Error(std::string("MPI_Test failed: ") + mpi_error_string(rc));
          } catch (...) {
            end_locked(std::current_exception());
          }
          return;
        }
        if (!flag) break;  // this lane waits; the next one may move
        head.in_flight = false;
        ++head.next;
      }
      if (head.next == head.pieces) {
        try {
          if (head.on_complete) head.on_complete();
        } catch (...) {
          head.error = std::current_exception();
        }
        head.done.store(true, std::memory_order_release);
        lane.pop_front();
        continue;  // the next op's first piece may go now
      }
      try {
        head.issue(head.next, &head.current);
        head.in_flight = true;
      } catch (...) {
        end_locked(std::current_exception());
        return;
      }
    }
  }
}

MpiPieceWork::MpiPieceWork(std::shared_ptr<MpiPieceQueue> queue, std::shared_ptr<MpiPieceQueue::Op> op,
                           std::string describe, std::vector<std::shared_ptr<const void>> keepalive)
    : queue_(std::move(queue)), op_(std::move(op)), describe_(std::move(describe)), keepalive_(std::move(keepalive)) {}

MpiPieceWork::~MpiPieceWork() {
  if (op_->left_in_flight) {
    // Leaked on purpose (as the comm monitor keeps abandoned Works): MPI may
    // still progress the piece, reading and writing these buffers on the
    // MPI communicator they keep alive; freed, a later MPI call would crash.
    static std::mutex mu;
    static auto* kept = new std::vector<std::shared_ptr<const void>>();  // (reachable for good)
    std::lock_guard<std::mutex> lock(mu);
    for (auto& k : keepalive_) kept->push_back(std::move(k));
    return;
  }
  if (mpi_finalized() || op_->done.load(std::memory_order_acquire)) return;
  if (std::uncaught_exceptions() > 0) {
    zero::detail::log_warning(zero::log_topic::comm,
                              "%s is abandoned unfinished while an exception propagates; its buffers may still be "
                              "written by MPI",
                              describe_.c_str());
    queue_->abandon(*op_, describe_ + " dropped while an exception propagated");
    return;
  }
  queue_->wait(*op_);  // errors stay stored: a destructor must not throw
}

void MpiPieceWork::abandon() {
  queue_->abandon(*op_, describe_ + " abandoned (the job is failing)");
}

void MpiPieceWork::rethrow_if_failed() const {
  if (op_->error) {
    try {
      std::rethrow_exception(op_->error);
    } catch (const std::exception& e) {
      throw Error(describe_ + " failed: " + e.what());
    }
  }
}

void MpiPieceWork::wait(std::chrono::milliseconds timeout) {
  if (timeout == std::chrono::milliseconds::max()) {
    queue_->wait(*op_);
    rethrow_if_failed();
    return;
  }
  // A timed wait polls (MPI has no MPI_Wait with a deadline), yielding so
  // that oversubscribed ranks on the same core still run.
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (queue_->poll(*op_)) {
      rethrow_if_failed();
      return;
    }
    if (std::chrono::steady_clock::now() - start >= timeout) break;
    std::this_thread::yield();
  }
  throw Error(describe_ + " did not complete within " + std::to_string(timeout.count()) +
              " ms; it is still pending (wait() again). If it never completes, check that every rank issues the "
              "same collectives in the same order with the same sizes");
}

bool MpiPieceWork::is_completed() { return queue_->poll(*op_); }

}  // namespace zero::comm::detail
