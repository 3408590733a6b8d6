// The single-process backend: world 1, rank 0. Every op is complete when it
// returns; reductions over one rank are the identity, so they copy (or do
// nothing in place). No byte leaves the process, so every op counts 0 bytes.
#include <cstring>

#include "zero/comm/detail/collective_args.h"
#include "zero/comm/communicator.h"
#include "zero/core/error.h"

namespace zero::comm {
namespace {

class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  std::string backend_name() const override { return "single"; }

  WorkPtr do_all_reduce(void* data, std::size_t count, DType dtype, const AllReduceOptions&) override {
    detail::check_buffer(data, count, "all_reduce", "data");
    return make_completed_work();
  }

  WorkPtr do_reduce_scatter(const void* input, void* output, std::size_t count_per_rank, DType dtype,
                         const ReduceScatterOptions&) override {
    const char* name = "reduce_scatter";
    detail::check_buffer(input, count_per_rank, name, "input");
    detail::check_buffer(output, count_per_rank, name, "output");
    // The same checks as the MPI backend, so that a call that works here
    // works under mpirun.
    if (!detail::is_in_place(input, output, count_per_rank, dtype, 1, 0, name)) {
      copy(output, input, count_per_rank, dtype);
    }
    return make_completed_work();
  }

  WorkPtr do_all_gather(const void* input, void* output, std::size_t count_per_rank,
                     DType dtype) override {
    const char* name = "all_gather";
    detail::check_buffer(input, count_per_rank, name, "input");
    detail::check_buffer(output, count_per_rank, name, "output");
    if (!detail::is_in_place(output, input, count_per_rank, dtype, 1, 0, name)) {
      copy(output, input, count_per_rank, dtype);
    }
    return make_completed_work();
  }

  WorkPtr do_broadcast(void* data, std::size_t count, DType dtype,
                    const BroadcastOptions& options) override {
    detail::check_buffer(data, count, "broadcast", "data");
    ZERO_CHECK(options.root == 0, "broadcast: root ", options.root,
               " is not a rank of this communicator (world size 1)");
    return make_completed_work();
  }

  WorkPtr do_barrier() override { return make_completed_work(); }

 private:
  static void copy(void* to, const void* from, std::size_t n, DType dtype) {
    if (n > 0) std::memcpy(to, from, n * element_size(dtype));
  }

};

}  // namespace

std::unique_ptr<Communicator> make_single_process_communicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

}  // namespace zero::comm
