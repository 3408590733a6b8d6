// HealthChannel: a side channel between the ranks of a job, apart from the
// data path, through which a rank learns what the others are doing when a
// collective hangs, tells them that it fails, and compares its collective
// sequence with theirs. The MPI backend's is mpi_health_channel.cpp: two
// communicators of its own and a watchdog thread per rank that answers.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "zero/comm/flight_recorder.h"

namespace zero::comm {

struct AnnouncedFailure {
  int rank = 0;
  std::string key;      // CommError::key(), or the message of any other error
  std::string message;  // as the failing rank raised it
};

class HealthChannel {
 public:
  virtual ~HealthChannel() = default;

  // Asks every other rank for the last `records` ops of its flight recorder
  // and waits at most `grace` for the answers. Element q is rank q's answer,
  // nullopt if it did not answer (stopped, killed, unreachable); this rank's
  // own element is its own record. Answered by the other ranks' watchdogs,
  // so a rank that is computing (or blocked in anything but a dead process)
  // answers too.
  virtual std::vector<std::optional<FlightRecord>> query_peers(std::size_t records,
                                                               std::chrono::milliseconds grace) = 0;

  // Collective over the channel (not the data path): every rank's blob, in
  // rank order. Throws zero::Error if not every rank joins within `timeout`.
  virtual std::vector<std::string> all_gather(const std::string& blob,
                                              std::chrono::milliseconds timeout) = 0;

  // Tells every other rank that this one fails; returns once the messages
  // are sent or after `grace`.
  virtual void announce_failure(const std::string& key, const std::string& message,
                                std::chrono::milliseconds grace) = 0;
  // What other ranks announced so far, in arrival order.
  virtual std::vector<AnnouncedFailure> announced_failures() const = 0;
  virtual bool failure_announced() const = 0;
};

// Byte-wise (de)serialisation of a FlightRecord, for channels between ranks
// of one job (same binary, same layout). parse throws zero::Error on a blob
// that is not one.
std::string serialize(const FlightRecord& record);
FlightRecord parse_flight_record(const std::string& blob);

}  // namespace zero::comm
