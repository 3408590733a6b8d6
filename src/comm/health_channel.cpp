#include "zero/comm/health_channel.h"

#include <cstring>

#include "zero/core/error.h"

namespace zero::comm {
namespace {

struct Header {
  std::uint64_t issued;
  std::uint64_t hash;
  std::uint64_t n;
};

}  // namespace

std::string serialize(const FlightRecord& record) {
  const Header h{record.issued, record.hash, record.records.size()};
  std::string blob(sizeof h + h.n * sizeof(OpRecord), '\0');
  std::memcpy(blob.data(), &h, sizeof h);
  if (h.n > 0) std::memcpy(blob.data() + sizeof h, record.records.data(), h.n * sizeof(OpRecord));
  return blob;
}

FlightRecord parse_flight_record(const std::string& blob) {
  Header h{};
  ZERO_CHECK(blob.size() >= sizeof h, "a flight record from another rank is truncated (",
             blob.size(), " bytes)");
  std::memcpy(&h, blob.data(), sizeof h);
  ZERO_CHECK(h.n <= (blob.size() - sizeof h) / sizeof(OpRecord) &&
                 blob.size() == sizeof h + h.n * sizeof(OpRecord),
             "a flight record from another rank has ", blob.size(), " bytes for ", h.n, " records");
  FlightRecord r;
  r.issued = h.issued;
  r.hash = h.hash;
  r.records.resize(h.n);
  if (h.n > 0) std::memcpy(r.records.data(), blob.data() + sizeof h, h.n * sizeof(OpRecord));
  return r;
}

}  // namespace zero::comm
