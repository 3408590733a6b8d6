// CommMonitor: what a Communicator knows about its own health, shared with
// the Works it hands out (they may outlive it): the flight recorder, the
// timeout, the side channel to the other ranks, and whether it has failed.
// It turns a hang into a CollectiveTimeout that names the ranks that did not
// join, and writes the flight-recorder file the error points to.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "zero/comm/comm_errors.h"
#include "zero/comm/flight_recorder.h"
#include "zero/comm/health_channel.h"
#include "zero/comm/work.h"

namespace zero::comm::detail {

class CommMonitor {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{600'000};

  FlightRecorder& recorder() { return recorder_; }
  void set_identity(int rank, int world_size);
  int rank() const { return rank_.load(); }
  int world_size() const { return world_.load(); }

  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed));
  }
  void set_timeout(std::chrono::milliseconds t);
  void set_dump_dir(std::string dir);
  std::string dump_path() const;  // this rank's file

  void set_channel(std::shared_ptr<HealthChannel> channel);
  HealthChannel* channel() const { return channel_.get(); }
  // Called once, by the first mark_failed (Communicator::set_abort_hook).
  void set_abort_hook(std::function<void()> abort);

  // Throws if another rank announced a failure (RemoteFailure) or if this
  // communicator failed before (zero::Error naming that failure).
  void check_usable();
  bool remote_failure_announced() const;
  [[noreturn]] void throw_remote_failure(const std::string& during);
  void mark_failed(const std::string& why);
  bool failed() const { return failed_.load(); }

  // Op `seq` did not complete within the timeout: asks the other ranks what
  // they are doing, writes the flight recorder, and throws CollectiveTimeout.
  [[noreturn]] void throw_timeout(std::uint64_t seq);
  // Op `seq` failed in the transport (`error`, the backend's words): asks
  // the other ranks what they issued as that op (a failure such as MPI's
  // truncation is usually ranks that issued different sizes), writes the
  // flight recorder, and throws CollectiveFailed.
  [[noreturn]] void throw_failure(std::uint64_t seq, const std::string& error);

  // The collective-sequence check (Communicator::check_sequence).
  void check_sequence();

  // Writes this rank's flight recorder; returns the path, or a sentence
  // saying why it could not be written.
  std::string dump(const std::string& reason);

  // Keeps an unfinished op's Work alive for the rest of the process: its
  // buffers may still be written by the transport, and destroying it would
  // wait for an op that never completes.
  void abandon(std::uint64_t seq, WorkPtr work);

 private:
  // What the other ranks' watchdogs said when asked about op `seq`.
  struct PeerReport {
    // "; rank 3 has not joined it; rank 2 issued ... as op #seq (the ranks'
    // sequences diverge); ..."
    std::string text;
    // find_issued_divergence over every rank's records when all answered:
    // the first op the ranks issued differently ("" if none), and its key.
    std::string divergence, divergence_key;
  };
  PeerReport ask_peers(std::uint64_t seq, const std::optional<OpRecord>& mine);
  // The ranks issued different ops (found while op `seq` timed out or
  // failed): throws SequenceMismatch, keyed by the divergence so that the
  // job prints it once.
  [[noreturn]] void throw_divergence(const std::string& during, const PeerReport& peers);

  FlightRecorder recorder_;
  std::atomic<int> rank_{0}, world_{1};
  std::atomic<std::int64_t> timeout_ms_{kDefaultTimeout.count()};
  std::shared_ptr<HealthChannel> channel_;
  mutable std::mutex mu_;  // dump_dir_, failure_
  std::string dump_dir_;
  std::string failure_;
  std::function<void()> abort_hook_;
  std::atomic<bool> failed_{false};
};

}  // namespace zero::comm::detail
