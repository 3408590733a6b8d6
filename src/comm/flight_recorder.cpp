#include "zero/comm/flight_recorder.h"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "zero/core/error.h"

namespace zero::comm {

const OpRecord* FlightRecord::find(std::uint64_t seq) const {
  if (records.empty() || seq < records.front().seq) return nullptr;
  const std::uint64_t i = seq - records.front().seq;
  if (i >= records.size() || records[i].seq != seq) return nullptr;
  return &records[i];
}

FlightRecorder::FlightRecorder(std::size_t capacity) {
  ZERO_CHECK(capacity > 0, "the flight recorder needs room for at least one op, got ", capacity);
  ring_.resize(capacity);
}

std::uint64_t FlightRecorder::issue(const OpSignature& sig, std::uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t seq = issued_++;
  hash_ = extend_sequence_hash(hash_, sig);
  OpRecord& r = ring_[seq % ring_.size()];
  r = OpRecord{};
  r.seq = seq;
  r.sig = sig;
  r.bytes = bytes;
  r.issued_ns = steady_now_ns();
  return seq;
}

void FlightRecorder::finish(std::uint64_t seq, OpState state) {
  std::lock_guard<std::mutex> lock(mu_);
  OpRecord& r = ring_[seq % ring_.size()];
  if (r.seq != seq || seq >= issued_ || r.state != OpState::kIssued) return;
  r.state = state;
  r.finished_ns = steady_now_ns();
}

std::optional<OpRecord> FlightRecorder::find(std::uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  const OpRecord& r = ring_[seq % ring_.size()];
  if (seq >= issued_ || r.seq != seq) return std::nullopt;
  return r;
}

FlightRecord FlightRecorder::tail(std::size_t n) const {
  std::lock_guard<std::mutex> lock(mu_);
  FlightRecord out;
  out.issued = issued_;
  out.hash = hash_;
  const std::uint64_t kept = std::min<std::uint64_t>({issued_, ring_.size(), n});
  out.records.reserve(kept);
  for (std::uint64_t seq = issued_ - kept; seq < issued_; ++seq) {
    out.records.push_back(ring_[seq % ring_.size()]);
  }
  return out;
}

FlightRecord FlightRecorder::snapshot() const { return tail(SIZE_MAX); }

std::uint64_t FlightRecorder::issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return issued_;
}

std::size_t FlightRecorder::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ring_.size();
}

void FlightRecorder::set_capacity(std::size_t capacity) {
  ZERO_CHECK(capacity > 0, "the flight recorder needs room for at least one op, got ", capacity);
  std::lock_guard<std::mutex> lock(mu_);
  if (capacity == ring_.size()) return;
  std::vector<OpRecord> ring(capacity);
  const std::uint64_t kept = std::min<std::uint64_t>({issued_, ring_.size(), capacity});
  for (std::uint64_t seq = issued_ - kept; seq < issued_; ++seq) {
    ring[seq % capacity] = ring_[seq % ring_.size()];
  }
  ring_ = std::move(ring);
}

std::string FlightRecorder::format(int rank, int world_size, const std::string& reason) const {
  const FlightRecord rec = snapshot();
  const std::int64_t now = steady_now_ns();
  std::ostringstream os;
  os << "zerocpp flight recorder\n"
     << "rank: " << rank << " of " << world_size << "\n"
     << "reason: " << reason << "\n"
     << "ops issued: " << rec.issued << "\n"
     << "sequence hash: " << std::hex << rec.hash << std::dec << "\n"
     << "last " << rec.records.size() << " ops, oldest first:\n";
  for (const OpRecord& r : rec.records) os << "  " << describe(r, now) << "\n";
  return os.str();
}

}  // namespace zero::comm
