#include "any_rank.h"

#include <ATen/ops/full.h>

namespace zero::detail {

bool any_rank(comm::Communicator& comm, const c10::Device& device, bool mine) {
  if (comm.world_size() <= 1) return mine;
  at::Tensor flag = at::full({1}, mine ? 1.0f : 0.0f, at::TensorOptions().dtype(at::kFloat).device(device));
  comm.all_reduce(flag.data_ptr(), 1, DType::kFloat32, {comm::ReduceOp::kMax})->wait();
  return flag.item<float>() != 0.0f;
}

}  // namespace zero::detail
