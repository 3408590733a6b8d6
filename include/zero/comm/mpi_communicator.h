// The MPI backend's knobs. make_mpi_communicator() (communicator.h) uses the
// defaults; this overload is for tests and tools that change them.
#pragma once

#include <climits>
#include <cstddef>
#include <memory>

#include "zero/comm/communicator.h"

namespace zero::comm {

struct MpiCommunicatorOptions {
  // MPI counts are ints. all_reduce, reduce_scatter and broadcast split a
  // larger buffer into several MPI calls of at most this many elements (per
  // rank's slot, for reduce_scatter; the result is the same); all_gather
  // cannot be split that way and throws a zero::Error above it (use smaller
  // buckets). Tests lower it to exercise the split.
  std::size_t max_elements_per_call = INT_MAX;

  // all_reduce and reduce_scatter go to MPI in pieces of at most this many
  // bytes (reduce_scatter: all ranks' slots of a piece together), one piece
  // of each kind in flight at a time, in the order the ops were issued
  // (src/comm/mpi_piece_queue.h): Open MPI's non-blocking reduce-scatter
  // holds two scratch copies of what it reduces on rank 0, and its in-place
  // all-reduce one on the tree's inner ranks, so whole 400 MB buckets held
  // 800 MB more on rank 0 than the engine's plan. A piece at a time, that is
  // at most two pieces (and a pack buffer of one). Tests lower it.
  std::size_t piece_bytes = std::size_t{16} << 20;

  // Open MPI only: an all_reduce piece of 64 KiB up to this many bytes on 4
  // or more ranks first copies its input to a scratch buffer (one piece's,
  // held until the Work completes), because Open MPI runs the in-place form as a binomial tree
  // and only the out-of-place form as a ring (2 (N-1)/N of the buffer sent
  // per rank instead of up to log2(N) times all of it). Larger ops stay in
  // place rather than double their memory; 0 turns staging off.
  std::size_t all_reduce_staging_max_bytes = std::size_t{64} << 20;

  // A health channel (health_channel.h; with more than one rank): timeouts
  // name the ranks that did not join, check_sequence() works, failures are
  // announced. Costs a watchdog thread that wakes every 10 ms.
  bool health_channel = true;
};

std::unique_ptr<Communicator> make_mpi_communicator(const MpiCommunicatorOptions& options);

// Gives `owner`, a communicator of another backend over the same ranks (NCCL
// bootstrapped over `transport`), a health channel carried by `transport`
// (an MPI communicator; the channel duplicates its MPI communicator, so
// nothing it sends can match transport's ops) that answers from owner's
// flight recorder: owner's timeouts name the ranks that did not join,
// owner.check_sequence() works, fail_job(owner, ...) is announced. Collective
// over transport. Throws zero::Error where transport is not MPI, the ranks
// differ, or owner has a channel already.
void attach_mpi_health_channel(Communicator& transport, Communicator& owner);

}  // namespace zero::comm
