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

}  // namespace zero::train
