// The NCCL backend: device buffers, NCCL collectives on a communication
// stream ordered after the compute stream by an event (nccl_communicator.h).
#include "zero/cuda/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "zero/comm/detail/collective_args.h"  // the argument checks every backend shares
#include "cuda_check.h"
#include "device_guard.h"
#include "nccl_work.h"
#include "zero/core/error.h"
#include "zero/cuda/device_info.h"

namespace zero::cuda {
namespace {

using comm::CollectiveKind;
using comm::WorkPtr;
using detail::DeviceGuard;
using detail::NcclResources;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat16: return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(comm::ReduceOp op) {
  return op == comm::ReduceOp::kMax ? ncclMax : ncclSum;
}

// What rank 0 broadcasts: the unique id and whether making it worked, so
// that a failure there is an error on every rank rather than a hang.
struct Bootstrap {
  ncclUniqueId id;
  std::uint32_t ok;
};
static_assert(sizeof(ncclUniqueId) == 128, "the bootstrap sends the id as 32 fp32 elements");
static_assert(sizeof(Bootstrap) % sizeof(float) == 0);

// An event owned until handed to a Work.
struct EventOwner {
  cudaEvent_t event = nullptr;
  ~EventOwner() {
    if (event != nullptr) (void)cudaEventDestroy(event);
  }
  cudaEvent_t release() { return std::exchange(event, nullptr); }
};

class NcclCommunicatorImpl final : public NcclCommunicator {
 public:
  NcclCommunicatorImpl(comm::Communicator& bootstrap, int device)
      : rank_(bootstrap.rank()),
        world_size_(bootstrap.world_size()),
        local_rank_(bootstrap.local_rank()) {
    // Every step before ncclCommInitRank is local and may fail on one rank
    // only; its error is kept, the rank still takes part in the bootstrap
    // collectives, and every rank throws together. Otherwise the others
    // would wait for it in the broadcast or in ncclCommInitRank for ever.
    Bootstrap boot{};
    std::exception_ptr local_error;
    try {
      const int devices = cuda_device_count();
      ZERO_CHECK(device >= 0 && device < devices, "make_nccl_communicator: device ", device,
                 " is not a CUDA device of this process (it sees ", devices,
                 devices == 0 ? ": no driver or no GPU" : "",
                 "); pass one in [0, device count), typically the bootstrap's local_rank()");
      set_cuda_device(device);  // the documented effect, and where everything below lives
      resources_ = std::make_shared<NcclResources>();
      resources_->device = device;
      CUDA_CHECK(cudaStreamCreateWithFlags(&resources_->stream, cudaStreamNonBlocking));
      CUDA_CHECK(cudaEventCreateWithFlags(&resources_->ready, cudaEventDisableTiming));
      CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&resources_->barrier_word), sizeof(int)));
      if (rank_ == 0) {
        NCCL_CHECK(ncclGetUniqueId(&boot.id));
        boot.ok = 1;
      }
    } catch (...) {
      local_error = std::current_exception();
    }
    bootstrap.broadcast(&boot, sizeof(boot) / sizeof(float), DType::kFloat32, {0})->wait();
    float failed = (local_error || boot.ok != 1) ? 1.0f : 0.0f;
    bootstrap.all_reduce(&failed, 1, DType::kFloat32, {comm::ReduceOp::kMax})->wait();
    if (local_error) std::rethrow_exception(local_error);
    ZERO_CHECK(boot.ok == 1, "make_nccl_communicator: rank 0 could not set up its device or "
               "the NCCL unique id (see its error)");
    ZERO_CHECK(failed == 0.0f, "make_nccl_communicator: another rank could not set up its "
               "device (see its error)");
    NCCL_CHECK(ncclCommInitRank(&resources_->comm, world_size_, boot.id, rank_));
    // When this communicator fails (comm_timeout, another rank's announced
    // failure), NCCL's kernels are stopped rather than left spinning.
    set_abort_hook([resources = resources_] { resources->abort(); });
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int local_rank() const override { return local_rank_; }
  std::string backend_name() const override { return "nccl"; }

  void set_compute_stream(void* stream) override {
    compute_stream_ = static_cast<cudaStream_t>(stream);
  }
  void* compute_stream() const override { return compute_stream_; }
  void* comm_stream() const override { return resources_->stream; }
  int device() const override { return resources_->device; }

  WorkPtr do_all_reduce(void* data, std::size_t count, DType dtype,
                     const comm::AllReduceOptions& options) override {
    comm::detail::check_buffer(data, count, "all_reduce", "data");
    return enqueue(CollectiveKind::kAllReduce, count, dtype, [&](cudaStream_t s) {
      return ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(options.op),
                           resources_->comm, s);
    });
  }

  WorkPtr do_reduce_scatter(const void* input, void* output, std::size_t count_per_rank, DType dtype,
                         const comm::ReduceScatterOptions& options) override {
    const char* name = "reduce_scatter";
    comm::detail::check_buffer(input, count_per_rank, name, "input");
    comm::detail::check_buffer(output, count_per_rank, name, "output");
    comm::detail::checked_mul(count_per_rank, static_cast<std::size_t>(world_size_), name);
    // In place (NCCL's rule, ours too) or not overlapping; throws otherwise.
    comm::detail::is_in_place(input, output, count_per_rank, dtype, world_size_, rank_, name);
    return enqueue(CollectiveKind::kReduceScatter, count_per_rank, dtype, [&](cudaStream_t s) {
      return ncclReduceScatter(input, output, count_per_rank, nccl_type(dtype),
                               nccl_op(options.op), resources_->comm, s);
    });
  }

  WorkPtr do_all_gather(const void* input, void* output, std::size_t count_per_rank,
                     DType dtype) override {
    const char* name = "all_gather";
    comm::detail::check_buffer(input, count_per_rank, name, "input");
    comm::detail::check_buffer(output, count_per_rank, name, "output");
    comm::detail::checked_mul(count_per_rank, static_cast<std::size_t>(world_size_), name);
    comm::detail::is_in_place(output, input, count_per_rank, dtype, world_size_, rank_, name);
    return enqueue(CollectiveKind::kAllGather, count_per_rank, dtype, [&](cudaStream_t s) {
      return ncclAllGather(input, output, count_per_rank, nccl_type(dtype), resources_->comm, s);
    });
  }

  WorkPtr do_broadcast(void* data, std::size_t count, DType dtype,
                    const comm::BroadcastOptions& options) override {
    comm::detail::check_buffer(data, count, "broadcast", "data");
    ZERO_CHECK(options.root >= 0 && options.root < world_size_, "broadcast: root ", options.root,
               " is not a rank of this communicator (world size ", world_size_, ")");
    return enqueue(CollectiveKind::kBroadcast, count, dtype, [&](cudaStream_t s) {
      return ncclBroadcast(data, data, count, nccl_type(dtype), options.root, resources_->comm, s);
    });
  }

  WorkPtr do_barrier() override {
    // One int all-reduced on the communication stream: done when every rank
    // got there (and, as for every op, after this rank's compute stream).
    return enqueue(CollectiveKind::kBarrier, 1, DType::kFloat32, [&](cudaStream_t s) {
      return ncclAllReduce(resources_->barrier_word, resources_->barrier_word, 1, ncclInt32,
                           ncclSum, resources_->comm, s);
    });
  }

 private:
  // Unless it moves nothing, orders the op after the compute
  // stream, launches it on the communication stream and returns its Work.
  template <typename Launch>
  WorkPtr enqueue(CollectiveKind kind, std::size_t n, DType dtype, Launch launch) {
    if (n == 0) return comm::make_completed_work();
    DeviceGuard guard(resources_->device);
    EventOwner done;
    CUDA_CHECK(cudaEventCreateWithFlags(&done.event, cudaEventDisableTiming));
    // The event wait is on the device: the host does not block (llm.c zero.cuh).
    // Re-recording `ready` for the next op does not affect this wait, which
    // is bound to the record it follows.
    CUDA_CHECK(cudaEventRecord(resources_->ready, compute_stream_));
    CUDA_CHECK(cudaStreamWaitEvent(resources_->stream, resources_->ready, 0));
    NCCL_CHECK(launch(resources_->stream));
    CUDA_CHECK(cudaEventRecord(done.event, resources_->stream));
    const std::size_t reported = kind == CollectiveKind::kBarrier ? 0 : n;
    return std::make_shared<detail::NcclWork>(
        detail::NcclOpInfo{kind, reported, dtype, rank_, world_size_}, done.release(), resources_);
  }

  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  cudaStream_t compute_stream_ = nullptr;  // the legacy default stream
  std::shared_ptr<NcclResources> resources_;
};

}  // namespace

std::unique_ptr<NcclCommunicator> make_nccl_communicator(comm::Communicator& bootstrap,
                                                         int device) {
  return std::make_unique<NcclCommunicatorImpl>(bootstrap, device);
}

void wait_on_stream(comm::Work& work, void* stream) {
  if (work.wait_on_device(stream)) return;
  ZERO_CHECK(work.is_completed(),
             "wait_on_stream: the Work is not from an NcclCommunicator and not complete; wait() "
             "on it instead");
}

}  // namespace zero::cuda
