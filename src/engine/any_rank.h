// "Did any rank ...?": one flag, all-reduced with max over the engine's
// communicator, so that every rank takes the same branch (a refusal, a
// fallback, a commit) and none is left waiting in a collective.
#pragma once

#include <c10/core/Device.h>

#include "zero/comm/communicator.h"

namespace zero::detail {

// Collective. `device`: where the communicator's buffers live (the engine's
// device: NCCL works on device memory). One rank: `mine`.
bool any_rank(comm::Communicator& comm, const c10::Device& device, bool mine);
// The lowest rank for which `mine` is true, or -1 when it is true for none
// (one all-reduce): for an error that names the rank that raised it.
int first_rank(comm::Communicator& comm, const c10::Device& device, bool mine);

}  // namespace zero::detail
