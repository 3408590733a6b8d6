#include "train_device.h"

#include <torch/cuda.h>

#include "zero/core/error.h"
#include "zero/launch/device_communicator.h"

namespace zero::train {

TrainDevice choose_device(const std::string& choice, comm::Communicator& host) {
  ZERO_CHECK(choice == "auto" || choice == "cpu" || choice == "cuda", "--device must be auto, cpu or cuda, not '",
             choice, "'");
  TrainDevice t;
  if (choice == "cpu") {
    t.reason = "device: cpu (--device cpu)";
    return t;
  }
  const int gpus = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  const int local = host.local_rank();
  // Every rank needs a GPU of its own (NCCL refuses two ranks on one device);
  // the ranks agree, so that none trains on a GPU while another is on the CPU.
  float lacks_own = gpus > local ? 0.0f : 1.0f;
  host.all_reduce(&lacks_own, 1, DType::kFloat32, {comm::ReduceOp::kMax})->wait();
  if (lacks_own > 0.0f) {
    ZERO_CHECK(choice != "cuda", "--device cuda: rank ", host.rank(), " (local rank ", local, ") has ",
               gpus == 0 ? "no GPU (LibTorch sees none)" : "no GPU of its own (" + std::to_string(gpus) +
                                                                " on this node)",
               ": run at most as many ranks per node as there are GPUs, or use --device cpu");
    t.reason = gpus == 0 ? "device: cpu (no GPU found; --device cuda to insist)"
                         : "device: cpu (more ranks on a node than its " + std::to_string(gpus) +
                               " GPU(s); one rank per GPU trains there)";
    return t;
  }
  t.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local));
  t.device_comm = launch::make_device_communicator(host, local);
  t.reason = "device: cuda, one GPU per rank (" + std::to_string(gpus) + " on this node)" +
             (host.world_size() > 1 ? ", gradients over NCCL" : "");
  return t;
}

}  // namespace zero::train
