#include "zero/comm/op_record.h"

#include <chrono>
#include <cstdio>
#include <sstream>

namespace zero::comm {
namespace {

// splitmix64's finaliser: every input bit moves every output bit.
std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

std::string format_duration(std::int64_t ns) {
  char buf[32];
  if (ns < 1'000'000) {
    std::snprintf(buf, sizeof buf, "%.1f us", static_cast<double>(ns) / 1e3);
  } else if (ns < 1'000'000'000) {
    std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(ns) / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ns) / 1e9);
  }
  return buf;
}

}  // namespace

std::string_view op_state_name(OpState s) {
  switch (s) {
    case OpState::kIssued:
      return "issued";
    case OpState::kCompleted:
      return "completed";
    case OpState::kFailed:
      return "failed";
    case OpState::kTimedOut:
      return "timed out";
    case OpState::kAbandoned:
      return "abandoned";
  }
  return "?";
}

std::uint64_t extend_sequence_hash(std::uint64_t hash, const OpSignature& sig) {
  std::uint64_t h = hash;
  h = mix(h ^ (static_cast<std::uint64_t>(sig.kind) | static_cast<std::uint64_t>(sig.reduce) << 8 |
               static_cast<std::uint64_t>(sig.dtype) << 16 |
               static_cast<std::uint64_t>(static_cast<std::uint32_t>(sig.root)) << 24));
  h = mix(h ^ sig.count);
  if (sig.tag != 0) h = mix(h ^ (static_cast<std::uint64_t>(sig.tag) | 1ULL << 40));
  return h;
}

std::string describe(const OpSignature& sig) {
  std::ostringstream os;
  os << collective_name(sig.kind);
  if (sig.kind == CollectiveKind::kBarrier) return sig.tag != 0 ? os.str() + ", tag " + std::to_string(sig.tag) : os.str();
  if (sig.kind == CollectiveKind::kAllReduce || sig.kind == CollectiveKind::kReduceScatter) {
    os << " " << reduce_op_name(sig.reduce);
  }
  os << " " << dtype_name(sig.dtype) << " x " << sig.count;
  if (sig.kind == CollectiveKind::kReduceScatter || sig.kind == CollectiveKind::kAllGather) {
    os << " per rank";
  }
  if (sig.kind == CollectiveKind::kBroadcast) os << " from rank " << sig.root;
  if (sig.tag != 0) os << ", tag " << sig.tag;
  return os.str();
}

std::string describe(const OpRecord& r, std::int64_t now_ns) {
  std::ostringstream os;
  os << "#" << r.seq << " " << describe(r.sig) << " (" << r.bytes << " B sent), "
     << op_state_name(r.state);
  if (r.state == OpState::kIssued) {
    os << " " << format_duration(now_ns - r.issued_ns) << " ago";
  } else if (r.finished_ns != 0) {
    os << " after " << format_duration(r.finished_ns - r.issued_ns);
  }
  return os.str();
}

std::int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace zero::comm
