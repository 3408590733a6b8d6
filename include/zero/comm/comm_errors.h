// The errors of a failing job, as the communicator raises them. Each carries
// a key: ranks that raise errors with the same key are reporting the same
// failure, and fail_job (fail_job.h) prints it once.
#pragma once

#include <cstdint>
#include <string>

#include "zero/core/error.h"

namespace zero::comm {

class CommError : public Error {
 public:
  CommError(const std::string& message, std::string key) : Error(message), key_(std::move(key)) {}
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

// A collective did not complete within comm_timeout. key: "timeout #<seq>".
class CollectiveTimeout : public CommError {
 public:
  CollectiveTimeout(const std::string& message, std::uint64_t seq)
      : CommError(message, "timeout #" + std::to_string(seq)), seq_(seq) {}
  std::uint64_t seq() const { return seq_; }

 private:
  std::uint64_t seq_;
};

// A collective failed in the transport (MPI returned an error for it).
// key: "failed #<seq>".
class CollectiveFailed : public CommError {
 public:
  CollectiveFailed(const std::string& message, std::uint64_t seq)
      : CommError(message, "failed #" + std::to_string(seq)), seq_(seq) {}
  std::uint64_t seq() const { return seq_; }

 private:
  std::uint64_t seq_;
};

// The ranks issued different collectives. The message is the same on every
// rank (it is computed from the same exchanged records); it is the key.
class SequenceMismatch : public CommError {
 public:
  explicit SequenceMismatch(const std::string& message) : CommError(message, message) {}
  // Found by one rank while an op timed out or failed: the message says
  // where, the key is what every rank finds alike.
  SequenceMismatch(const std::string& message, std::string key) : CommError(message, std::move(key)) {}
};

// Another rank announced that it failed; this rank stops because of it. Its
// message repeats the other rank's; fail_job does not print it again.
class RemoteFailure : public CommError {
 public:
  RemoteFailure(const std::string& message, int origin_rank)
      : CommError(message, "remote"), origin_rank_(origin_rank) {}
  int origin_rank() const { return origin_rank_; }

 private:
  int origin_rank_;
};

// An error a rank raises because another rank failed first (a rank
// agreement: "saving failed on rank 3: ..."), the other rank raising its own:
// fail_job leaves the printing to that rank, so that the job shows the
// failure once. A marker beside the error's own type (ForAnotherRank<E>).
class RaisedForAnotherRank {
 public:
  explicit RaisedForAnotherRank(int failed_rank) : failed_rank_(failed_rank) {}
  virtual ~RaisedForAnotherRank() = default;
  int failed_rank() const { return failed_rank_; }

 private:
  int failed_rank_;
};

template <class E>
class ForAnotherRank : public E, public RaisedForAnotherRank {
 public:
  ForAnotherRank(const std::string& message, int failed_rank) : E(message), RaisedForAnotherRank(failed_rank) {}
};

}  // namespace zero::comm
