// OpRecord: what one collective was, as the flight recorder keeps it and as
// ranks compare it when they check that they issued the same sequence.
//
// An op's signature is (kind, reduce op, dtype, count, root, tag): what every rank
// must agree on for the op to be correct (communicator.h's first rule). Its
// sequence number counts the ops a communicator has issued, from 0, the
// same on every rank of a correct program.
#pragma once

#include <cstdint>
#include <string>

#include "zero/comm/comm_stats.h"
#include "zero/comm/reduce_op.h"
#include "zero/core/dtype.h"

namespace zero::comm {

enum class OpState : std::uint8_t {
  kIssued,     // handed to the transport, not yet seen complete
  kCompleted,  // seen complete by wait() or is_completed()
  kFailed,     // the transport reported an error
  kTimedOut,   // not complete within comm_timeout
  kAbandoned,  // dropped unfinished while the job was failing
};
std::string_view op_state_name(OpState s);  // "issued", "completed", ...

struct OpSignature {
  CollectiveKind kind = CollectiveKind::kBarrier;
  ReduceOp reduce = ReduceOp::kSum;  // all_reduce and reduce_scatter only; kSum otherwise
  DType dtype = DType::kFloat32;     // kFloat32 for barrier
  std::uint64_t count = 0;           // the op's count argument (0 for barrier)
  std::int32_t root = -1;            // broadcast only; -1 otherwise
  std::uint32_t tag = 0;             // the caller's name for the op (communicator.h), 0 = none

  bool operator==(const OpSignature&) const = default;
};

// Plain data (copied byte-wise between ranks of one job).
struct OpRecord {
  std::uint64_t seq = 0;
  OpSignature sig;
  OpState state = OpState::kIssued;
  std::uint64_t bytes = 0;        // ring_bytes_sent(...) of the op
  std::int64_t issued_ns = 0;     // steady clock
  std::int64_t finished_ns = 0;   // steady clock; 0 while issued
};

// The running hash of a sequence of signatures: h' = mix(h, sig). Equal
// sequences give equal hashes on every rank (no pointers, no padding bytes).
std::uint64_t extend_sequence_hash(std::uint64_t hash, const OpSignature& sig);
inline constexpr std::uint64_t kEmptySequenceHash = 0x9e3779b97f4a7c15ULL;

// "all_reduce sum fp32 x 4", "broadcast fp32 x 10 from rank 0", "barrier",
// "all_gather fp32 x 512 per rank, tag 3".
std::string describe(const OpSignature& sig);
// "#57 all_reduce sum fp32 x 4 (24 B sent), completed in 1.2 ms".
std::string describe(const OpRecord& r, std::int64_t now_ns);

std::int64_t steady_now_ns();

}  // namespace zero::comm
