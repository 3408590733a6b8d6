// Communicator: the collectives zerocpp's data parallelism is built on, on
// flat buffers of host memory (MPI backend) or of one process (single-process
// backend). Modelled on c10d's Backend: each op takes one options struct and
// returns a Work (work.h).
//
// Rules every op follows:
//  - Ops are asynchronous. They must be issued in the same order on every
//    rank, with the same count, dtype and options (the MPI backend does not
//    check this: a mismatch hangs or corrupts). Issue ops from one thread at a
//    time; wait() may be called from any thread.
//  - Buffers stay alive and untouched until the Work's wait() returns.
//  - count == 0 is allowed (pointers may then be null): no data moves, the
//    returned Work is already complete, and the call is still counted.
//  - Buffer layouts, as NCCL documents them (N = world_size, r = rank):
//      all_reduce      in place on data[0, count).
//      reduce_scatter  input holds N * count_per_rank elements; output gets
//                      count_per_rank elements: the reduction over every rank
//                      of input[r * count_per_rank, (r + 1) * count_per_rank).
//                      In place when output == input + r * count_per_rank;
//                      the rest of input is then unspecified afterwards (MPI
//                      uses it as scratch). Otherwise input and output must
//                      not overlap.
//      all_gather      input holds count_per_rank elements; output gets
//                      N * count_per_rank: rank q's input at
//                      output + q * count_per_rank. In place when
//                      input == output + r * count_per_rank. Otherwise input
//                      and output must not overlap.
//      broadcast       data[0, count) of `root` is copied to every rank.
//    A buffer partitioned with zero::shard_of (core/shard.h) fits both:
//    reduce_scatter(padded, padded + shard.offset, shard.per_rank) leaves rank
//    r its reduced range in place, and all_gather(padded + shard.offset,
//    padded, shard.per_rank) rebuilds the padded buffer in place.
//  - Errors are zero::Error: bad arguments throw from the call; a failure of
//    the transport is stored in the Work and thrown by wait().
//  - Byte counters: see comm_stats.h.
//  - Timeouts, the flight recorder and the sequence check: see "Failures"
//    below and docs/reliability.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "zero/comm/comm_stats.h"
#include "zero/comm/flight_recorder.h"
#include "zero/comm/health_channel.h"
#include "zero/comm/reduce_op.h"
#include "zero/comm/work.h"
#include "zero/core/dtype.h"

namespace zero::comm {

namespace detail {
class CommMonitor;
}

// `tag` (every op): what the caller calls this op, 0 for nothing. It moves
// no data; it is part of the op's signature, so the ranks must agree on it
// as on the count, and the collective-sequence check tells apart ops that
// differ only in it (the engine tags a bucket's collectives with the
// bucket's number + 1: at stage 3, two units of the same size gathered in
// another order on one rank).
struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  std::uint32_t tag = 0;
};

struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  std::uint32_t tag = 0;
};

struct AllGatherOptions {
  std::uint32_t tag = 0;
};

struct BroadcastOptions {
  int root = 0;
  std::uint32_t tag = 0;
};

class Communicator {
 public:
  Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  virtual ~Communicator();

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Rank among the processes of this node: from MPI's shared-memory split
  // (MPI backend); 0 for the single-process backend.
  virtual int local_rank() const = 0;
  virtual std::string backend_name() const = 0;  // "mpi", "single", "nccl"
  // Device backends (NCCL): every later op follows the work queued on this
  // stream before the op is issued (a cudaStream_t as void*; nullptr, the
  // default, is the legacy default stream). Set it from the thread that
  // issues ops, between ops. Host backends have no streams: they ignore it
  // and say nullptr.
  virtual void set_compute_stream(void* stream) { (void)stream; }
  virtual void* compute_stream() const { return nullptr; }

  // The collectives. Each checks that the communicator is usable (see
  // "Failures" below), records the op in the flight recorder, counts its
  // bytes, and returns the backend's Work wrapped so that its completion is
  // recorded too.
  WorkPtr all_reduce(void* data, std::size_t count, DType dtype,
                     const AllReduceOptions& options = {});
  WorkPtr reduce_scatter(const void* input, void* output, std::size_t count_per_rank, DType dtype,
                         const ReduceScatterOptions& options = {});
  WorkPtr all_gather(const void* input, void* output, std::size_t count_per_rank, DType dtype,
                     const AllGatherOptions& options = {});
  WorkPtr broadcast(void* data, std::size_t count, DType dtype, const BroadcastOptions& options = {});
  WorkPtr barrier();

  // The counters since construction or the last reset_stats(). stats() hands
  // out the live struct: read it while no op is being issued. stats_snapshot()
  // copies it under the lock, safe at any time.
  const CommStats& stats() const { return stats_; }
  CommStats stats_snapshot() const;
  void reset_stats();

  // Failures (docs/reliability.md). No wait() without a timeout waits longer
  // than timeout() (default 600 s; the engine sets it from comm_timeout): the
  // op then fails with CollectiveTimeout (comm_errors.h), which names the op,
  // its sequence number and bytes, and the ranks that have not joined it
  // (asked through the health channel, where the backend has one), and this
  // rank's flight recorder is written to flight_recorder_path(). A wait also
  // ends, with RemoteFailure, as soon as another rank announces that it
  // fails (fail_job.h). After either, every new op throws.
  void set_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const;
  // The last `entries` ops are kept; their file goes to `dir` ("" = the
  // default: $ZERO_FLIGHT_RECORDER_DIR, else
  // $TMPDIR/zerocpp-flight-recorder-<job id>).
  void set_flight_recorder(std::size_t entries, const std::string& dir);
  const FlightRecorder& flight_recorder() const;
  std::string flight_recorder_path() const;
  // Writes this rank's flight recorder now; returns the path (or why not).
  std::string dump_flight_recorder(const std::string& reason);

  // Collective, over the health channel (not the data path): the ranks
  // compare the number and running hash of the ops each has issued. A
  // difference throws SequenceMismatch on every rank, naming the first op
  // where they differ and what each rank issued there. Nothing to do for
  // one rank or a backend without a health channel.
  void check_sequence();

  // The side channel to the other ranks, or nullptr (single-process backend).
  HealthChannel* health_channel() const;
  // Gives a communicator without a side channel of its own (NCCL's) one
  // carried by another communicator over the same ranks
  // (attach_mpi_health_channel in mpi_communicator.h). Throws zero::Error
  // where it has one already.
  void adopt_health_channel(std::shared_ptr<HealthChannel> channel);

 protected:
  // What each backend implements: the op itself, its arguments checked,
  // returning the backend's Work (make_completed_work() when nothing moves).
  virtual WorkPtr do_all_reduce(void* data, std::size_t count, DType dtype,
                                const AllReduceOptions& options) = 0;
  virtual WorkPtr do_reduce_scatter(const void* input, void* output, std::size_t count_per_rank,
                                    DType dtype, const ReduceScatterOptions& options) = 0;
  virtual WorkPtr do_all_gather(const void* input, void* output, std::size_t count_per_rank,
                                DType dtype) = 0;
  virtual WorkPtr do_broadcast(void* data, std::size_t count, DType dtype,
                               const BroadcastOptions& options) = 0;
  virtual WorkPtr do_barrier() = 0;

  // A backend with a way to reach the other ranks apart from its data path
  // installs it here, in its constructor.
  void set_health_channel(std::shared_ptr<HealthChannel> channel);
  // A backend that can stop its transport's pending ops (NCCL's
  // ncclCommAbort) installs that here: called once, on the thread that finds
  // the failure, when the communicator fails (a timeout, another rank's
  // announced failure, a failed op), so that no kernel or thread stays
  // blocked in an op that cannot complete.
  void set_abort_hook(std::function<void()> abort);
  // The flight recorder a backend's health channel answers from (it lives
  // as long as the channel installed above).
  FlightRecorder& mutable_flight_recorder();

 private:
  template <typename Issue>
  WorkPtr tracked(const OpSignature& sig, Issue issue);

  mutable std::mutex stats_mutex_;
  CommStats stats_;
  std::shared_ptr<detail::CommMonitor> monitor_;
};

// The factory functions below are in zero_comm_mpi (they need MPI); the
// interface, the byte counters and the single-process backend are in
// zero_comm, which links no MPI.
//
// Picks the backend, in this order:
//  1. ZERO_COMM_BACKEND=mpi or =single in the environment;
//  2. MPI when launched by mpirun/mpiexec/srun (OMPI_COMM_WORLD_SIZE,
//     PMI_SIZE, PMIX_RANK or SLURM_PROCID set) or when MPI is already
//     initialised;
//  3. the single-process backend.
std::unique_ptr<Communicator> make_communicator();
// The backend make_communicator() would pick now: "mpi" or "single".
std::string default_backend_name();

// MPI over a duplicate of MPI_COMM_WORLD. Initialises MPI with
// MPI_THREAD_MULTIPLE unless it is already initialised (then it must have
// been with MPI_THREAD_MULTIPLE), and finalises it at exit only if it
// initialised it. Collective over MPI_COMM_WORLD. More options:
// mpi_communicator.h.
std::unique_ptr<Communicator> make_mpi_communicator();
// World 1, rank 0: reduce ops copy (or do nothing in place); counts 0 bytes.
std::unique_ptr<Communicator> make_single_process_communicator();

}  // namespace zero::comm
