// FlightRecorder: the last N collectives a communicator issued, with their
// state, like c10d's flight recorder: what a rank was doing when a job hung
// or failed. Also keeps the running hash and count of every op issued, which
// the sequence check compares across ranks.
//
// Thread-safe: ops are issued from one thread at a time, but completions are
// seen on any thread, and the watchdog reads it to answer other ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "zero/comm/op_record.h"

namespace zero::comm {

struct FlightRecord {
  std::uint64_t issued = 0;                  // ops issued so far (the next op's seq)
  std::uint64_t hash = kEmptySequenceHash;   // running hash over all of them
  std::vector<OpRecord> records;             // the last ones, oldest first

  // Op `seq`'s record, or nullptr if it is not among `records`.
  const OpRecord* find(std::uint64_t seq) const;
};

class FlightRecorder {
 public:
  static constexpr std::size_t kDefaultCapacity = 1024;
  explicit FlightRecorder(std::size_t capacity = kDefaultCapacity);

  // Records a new op as issued and returns its sequence number.
  std::uint64_t issue(const OpSignature& sig, std::uint64_t bytes);
  // Sets the state of op `seq` (ignored once it has left the ring, or if it
  // already has a final state other than kIssued).
  void finish(std::uint64_t seq, OpState state);

  // Op `seq`'s record, if it is still kept.
  std::optional<OpRecord> find(std::uint64_t seq) const;
  FlightRecord snapshot() const;
  // The last `n` records (fewer if fewer are kept), oldest first.
  FlightRecord tail(std::size_t n) const;
  std::uint64_t issued() const;
  std::size_t capacity() const;
  // Keeps the newest min(size, capacity) records.
  void set_capacity(std::size_t capacity);

  // The text written to a flight-recorder file: a header line per fact, then
  // one line per record, oldest first.
  std::string format(int rank, int world_size, const std::string& reason) const;

 private:
  mutable std::mutex mu_;
  std::vector<OpRecord> ring_;  // slot seq % capacity
  std::uint64_t issued_ = 0;
  std::uint64_t hash_ = kEmptySequenceHash;
};

}  // namespace zero::comm
