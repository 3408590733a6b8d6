// Backend selection for a model on a GPU, above zero_comm_mpi and zero_cuda:
// the host communicator (comm::make_communicator(): MPI under a launcher,
// else one process) carries host scalars and bootstraps; the engine of a
// model on CUDA device `cuda_device` needs a communicator on device memory.
#pragma once

#include <memory>

#include "zero/comm/communicator.h"

namespace zero::launch {

// The engine's communicator for a model on CUDA device `cuda_device`: NCCL
// over `host` (collective over it) when there are several ranks; nullptr when
// `host` itself serves (one rank: no collective moves data). Throws
// zero::Error naming the fix when several ranks need NCCL and this build has
// none.
std::unique_ptr<comm::Communicator> make_device_communicator(comm::Communicator& host, int cuda_device);

// Whether this build can make an NCCL communicator.
bool have_nccl();

}  // namespace zero::launch
