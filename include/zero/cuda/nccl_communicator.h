// The NCCL backend of comm::Communicator: the same five collectives, on
// buffers in DEVICE memory, run by NCCL on a communication stream of its own.
// Built only with ZERO_WITH_NCCL (zero_cuda then defines ZERO_HAVE_NCCL).
//
// Every rule of zero/comm/communicator.h holds (order, buffer layouts, which
// are NCCL's own, count == 0, byte counters by comm::ring_bytes_sent), with
// "the op is done" meaning "done on the device":
//
//   issue   each op records an event on the compute stream (set_compute_stream;
//           default the legacy default stream 0), makes the communication
//           stream wait on it (cudaStreamWaitEvent: no host synchronisation,
//           as llm.c's zero.cuh does), launches the NCCL collective there and
//           records a completion event. The op therefore sees everything
//           enqueued on the compute stream before the call, and nothing after.
//   wait()  blocks the host until the completion event has fired, polling
//           cudaEventQuery and NCCL's asynchronous error (a failed or aborted
//           communicator becomes a zero::Error instead of a hang); a finite
//           timeout throws and leaves the op pending, as every backend does.
//   wait_on_stream(work, stream) orders a stream after the op on the device
//           without blocking the host: the way to consume results on the GPU.
//
// reduce_scatter/all_gather are NCCL's, in place when NCCL says so:
// recvbuff == sendbuff + rank * recvcount (reduce_scatter) and
// sendbuff == recvbuff + rank * sendcount (all_gather).
// ReduceOp::kMax is ncclMax: NaN handling is NCCL's (not the NaN-propagating
// max of reduce_op.h; not checked). barrier() is an all-reduce of one int on
// the communication stream, ordered after the compute stream like any op.
#pragma once

#include <memory>

#include "zero/comm/communicator.h"
#include "zero/comm/work.h"

namespace zero::cuda {

class NcclCommunicator : public comm::Communicator {
 public:
  // set_compute_stream()/compute_stream() (comm::Communicator's): the
  // stream whose work every later op waits for (cudaStreamPerThread works too).
  // The communicator's own stream (non-blocking, on device()).
  virtual void* comm_stream() const = 0;
  virtual int device() const = 0;
};

// Collective over `bootstrap` (every rank calls it, with its own device): rank
// 0 creates an NCCL unique id, broadcasts its 128 bytes through
// bootstrap.broadcast (as 32 fp32 elements, plus one status element so that a
// failure on rank 0 becomes an error on every rank instead of a hang), then
// every rank joins with ncclCommInitRank(world_size, id, rank): ranks, world
// size and local rank are the bootstrap's. `device` is the CUDA device this
// rank uses (typically bootstrap.local_rank()); it becomes the calling
// thread's current device. Two ranks may not share a device. The bootstrap
// is only used during this call. Throws zero::Error.
std::unique_ptr<NcclCommunicator> make_nccl_communicator(comm::Communicator& bootstrap, int device);

// Makes `stream` (void* cudaStream_t) wait on the device until `work` is done,
// without blocking the host. `work` must come from an NcclCommunicator, or be
// already complete (what an op with count 0 returns); otherwise zero::Error.
void wait_on_stream(comm::Work& work, void* stream);

}  // namespace zero::cuda
