#include "zero/launch/device_communicator.h"

#include "zero/comm/mpi_communicator.h"
#include "zero/core/error.h"
#if ZERO_HAVE_NCCL
#include "zero/cuda/nccl_communicator.h"
#endif

namespace zero::launch {

bool have_nccl() {
#if ZERO_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<comm::Communicator> make_device_communicator(comm::Communicator& host, int cuda_device) {
  if (host.world_size() == 1) return nullptr;
#if ZERO_HAVE_NCCL
  std::unique_ptr<comm::Communicator> nccl = cuda::make_nccl_communicator(host, cuda_device);
  // NCCL has no side channel: the host's MPI carries one for it (timeouts
  // name the ranks that did not join, the sequence check, announced failures).
  if (host.backend_name() == "mpi") comm::attach_mpi_health_channel(host, *nccl);
  return nccl;
#else
  (void)cuda_device;
  ZERO_CHECK(false, "training on GPUs with ", host.world_size(),
             " ranks needs NCCL, and this build has none (ZERO_WITH_NCCL): rebuild with NCCL found "
             "(docs/gpu.md), or train on the CPU");
  return nullptr;
#endif
}

}  // namespace zero::launch
