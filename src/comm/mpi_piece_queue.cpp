#include "mpi_piece_queue.h"

#include <cstdio>
#include <string>
#include <thread>

#include "mpi_runtime.h"
#include "zero/comm/mpi_check.h"
#include "zero/core/error.h"

namespace zero::comm::detail {

void MpiPieceQueue::submit(const std::shared_ptr<Op>& op) {
  std::lock_guard<std::mutex> lock(mu_);
  ops_.push_back(op);
  pump_locked(/*block=*/false);
}

bool MpiPieceQueue::poll(const Op& op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!op.done) pump_locked(/*block=*/false);
  return op.done;
}

void MpiPieceQueue::wait(const Op& op) {
  std::lock_guard<std::mutex> lock(mu_);
  while (!op.done) pump_locked(/*block=*/true);
}

void MpiPieceQueue::abandon(const Op& op) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = ops_.begin(); it != ops_.end(); ++it) {
    if (it->get() != &op) continue;
    // A piece in flight stays MPI's (its buffers may still be written, as
    // for any abandoned Work); nothing more is issued for it.
    (*it)->done = true;
    ops_.erase(it);
    return;
  }
}

void MpiPieceQueue::fail_locked(Op& op, std::exception_ptr error) {
  op.error = std::move(error);
  op.in_flight = false;
  op.done = true;
}

void MpiPieceQueue::pump_locked(bool block) {
  while (!ops_.empty()) {
    Op& head = *ops_.front();
    if (head.in_flight) {
      int flag = 0;
      const RequestCompletion ours;
      const int rc = block ? MPI_Wait(&head.current, MPI_STATUS_IGNORE)
                           : MPI_Test(&head.current, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        try {
          throw Error(std::string(block ? "MPI_Wait" : "MPI_Test") + " failed: " + mpi_error_string(rc));
        } catch (...) {
          fail_locked(head, std::current_exception());
        }
        ops_.pop_front();
        continue;
      }
      if (!block && !flag) return;
      head.in_flight = false;
      ++head.next;
    }
    if (head.next == head.pieces) {
      try {
        if (head.on_complete) head.on_complete();
      } catch (...) {
        head.error = std::current_exception();
      }
      head.done = true;
      ops_.pop_front();
      continue;  // the next op's first piece may go now
    }
    try {
      head.issue(head.next, &head.current);
      head.in_flight = true;
    } catch (...) {
      fail_locked(head, std::current_exception());
      ops_.pop_front();
      continue;
    }
    if (block) return;  // (the caller waits for it, or for its own op further back)
  }
}

MpiPieceWork::MpiPieceWork(std::shared_ptr<MpiPieceQueue> queue, std::shared_ptr<MpiPieceQueue::Op> op,
                           std::string describe, std::vector<std::shared_ptr<const void>> keepalive)
    : queue_(std::move(queue)), op_(std::move(op)), describe_(std::move(describe)), keepalive_(std::move(keepalive)) {}

MpiPieceWork::~MpiPieceWork() {
  if (mpi_finalized() || queue_->poll(*op_)) return;
  if (std::uncaught_exceptions() > 0) {
    std::fprintf(stderr,
                 "zerocpp: %s is abandoned unfinished while an exception propagates; its buffers may still be "
                 "written by MPI\n",
                 describe_.c_str());
    queue_->abandon(*op_);
    return;
  }
  queue_->wait(*op_);  // errors stay stored: a destructor must not throw
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
