#include "any_rank.h"

#include <ATen/ops/full.h>

namespace zero::detail {

bool any_rank(comm::Communicator& comm, const c10::Device& device, bool mine) {
  if (comm.world_size() <= 1) return mine;
  at::Tensor flag = at::full({1}, mine ? 1.0f : 0.0f, at::TensorOptions().dtype(at::kFloat).device(device));
  comm.all_reduce(flag.data_ptr(), 1, DType::kFloat32, {comm::ReduceOp::kMax})->wait();
  return flag.item<float>() != 0.0f;
}

int first_rank(comm::Communicator& comm, const c10::Device& device, bool mine) {
  const int world = comm.world_size();
  if (world <= 1) return mine ? 0 : -1;
  // The max of the negated ranks is the lowest (exact in a float up to 2^24).
  at::Tensor r = at::full({1}, -static_cast<float>(mine ? comm.rank() : world),
                          at::TensorOptions().dtype(at::kFloat).device(device));
  comm.all_reduce(r.data_ptr(), 1, DType::kFloat32, {comm::ReduceOp::kMax})->wait();
  const int first = -static_cast<int>(r.item<float>());
  return first < world ? first : -1;
}

}  // namespace zero::detail
