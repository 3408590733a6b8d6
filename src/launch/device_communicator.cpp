#include "zero/launch/device_communicator.h"

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
  return cuda::make_nccl_communicator(host, cuda_device);
#else
  (void)cuda_device;
  ZERO_CHECK(false, "training on GPUs with ", host.world_size(),
             " ranks needs NCCL, and this build has none (ZERO_WITH_NCCL): rebuild with NCCL found "
             "(docs/gpu.md), or train on the CPU");
  return nullptr;
#endif
}

}  // namespace zero::launch
