// The --report JSON of zero-train: per-rank memory by tier and kind (peak and
// final), communication bytes per step by collective, losses and speed.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero/comm/communicator.h"
#include "zero/memory/memory_ledger.h"

namespace zero::train {

// Every rank's values, exactly (the communicator carries floats: each value
// travels as three 16-bit pieces). All ranks must call it.
std::vector<std::vector<std::int64_t>> gather_int64(comm::Communicator& comm,
                                                    const std::vector<std::int64_t>& mine);

// Flattens a snapshot as [current..., peak...] over tier x kind.
std::vector<std::int64_t> flatten_ledger(const memory::LedgerSnapshot& s);
nlohmann::json ledger_json(const std::vector<std::int64_t>& flat);
nlohmann::json comm_json(const comm::CommStats& c);
// The same for gather_int64: [bytes..., calls...] over the collective kinds.
std::vector<std::int64_t> flatten_comm(const comm::CommStats& c);
comm::CommStats unflatten_comm(const std::vector<std::int64_t>& flat);
// {"all_reduce": bytes, ...} for ops with calls, for one metrics line.
nlohmann::json comm_bytes_json(const comm::CommStats& c);
// Running sum over steps.
void add_comm(comm::CommStats& sum, const comm::CommStats& step);

}  // namespace zero::train
