// Where stage 3's copies of this rank's partition into a bucket run when
// they should not hold up the compute: on a GPU with offload_param, the
// partition is in pinned host memory, and a unit's copy up (then its
// all-gather) goes on a stream of its own, so that the units fetched ahead
// come up while the current one computes, and the host never waits for a
// copy.
//
// The order the lane keeps, whatever it runs on:
//  - a copy starts after the work the compute stream had queued when it was
//    given (its destination was just allocated there);
//  - a collective issued through issue_after() follows the lane's copies;
//  - the compute stream uses a bucket only after compute_waits() on the
//    mark taken after its copy;
//  - the host writes the partition (the optimizer's update, a checkpoint
//    load) only after host_waits(): a copy may still be reading it.
//
// Two lanes: make_stream_lane() on a device with streams (CUDA), and
// make_deferred_lane() on the CPU, which checks that order: it runs each
// copy only when something waits for it, so that reading a bucket before
// its wait reads what the lane wrote in the meantime (NaN: the destination
// is poisoned when the copy is queued), and a partition written before
// host_waits() goes into the copies still queued. The engine uses it when
// ZERO_TEST_DEFERRED_GATHERS=1 (tests; docs/testing.md).
// Private to zero_engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include <ATen/Tensor.h>
#include <c10/core/Event.h>

#include "device_context.h"
#include "step_timeline.h"
#include "zero/comm/communicator.h"

namespace zero::detail {

class GatherLane {
 public:
  // A point on the lane: everything queued before it.
  struct Mark {
    std::shared_ptr<c10::Event> event;  // stream lane
    std::uint64_t queued = 0;           // deferred lane: copies queued before it
  };
  virtual ~GatherLane() = default;
  // Queues dst <- src (same size). `owner`: the bucket's tensor, whose
  // storage holds dst's bytes while the bucket is gathered. Traced as
  // "bucket <bucket>" of lane "gather" on `timeline` when it is tracing
  // (null: not traced).
  virtual void copy(const at::Tensor& dst, const at::Tensor& src, const at::Tensor& owner, std::size_t bucket,
                    StepTimeline* timeline) = 0;
  virtual Mark mark() = 0;
  // The compute stream (the host, on the CPU) goes on only after `m`.
  virtual void compute_waits(const Mark& m) = 0;
  // Issues a collective (issue() calls the communicator) after the lane's
  // copies, and returns its work.
  virtual comm::WorkPtr issue_after(comm::Communicator& comm, const std::function<comm::WorkPtr()>& issue) = 0;
  // Blocks the host until every copy queued so far is done.
  virtual void host_waits() = 0;
  // Blocks the host until the copies queued before `m` are done.
  virtual void host_waits(const Mark& m) = 0;
};

// A side stream of ctx.device (not the copy stream of ZeRO-Offload's
// gradients and updates: both directions then run at once). `ctx` must
// outlive the lane.
std::unique_ptr<GatherLane> make_stream_lane(const DeviceContext& ctx);
std::unique_ptr<GatherLane> make_deferred_lane();
// Whether ZERO_TEST_DEFERRED_GATHERS asks for the deferred lane.
bool deferred_gathers_requested();

}  // namespace zero::detail
