// Gradient reduction in buckets while backward goes on (ZeRO stages 0-3).
//
// The engine hands every parameter's gradient to on_grad() as soon as autograd
// has finished it (a post-accumulate-grad hook). The gradient is added into
// its bucket, the parameter's own .grad is released by the caller, and a
// bucket whose parameters have all arrived is reduced asynchronously while
// backward continues (overlap_comm). Buckets are launched strictly in one
// launch order, the same on every rank, so every rank issues the same
// collectives in the same order even if autograd finishes parameters in a
// different order (or never, for a parameter that got no gradient: its slot
// stays zero and its bucket goes at end_backward()). The order is the
// layout's for the first reducing backward; at its end the ranks take rank
// 0's (one broadcast of 4 bytes per bucket, once): its buckets as they
// completed, then those that did not. A bucket that completes late, or
// never (an unused parameter registered last lands in the first bucket),
// would otherwise hold back every bucket after it, alive and unreduced, up
// to the whole gradient. (DDP rebuilds its buckets after the first
// iteration in the order gradients arrived, for the same reason.) Parameters
// used in some steps only (a layer skipped at random) still hold the buckets
// launched after theirs in the steps they are used late or not at all.
// At stage 3 with units (Options::kept_at_end) the buckets of no group
// (kept gathered) come last in the order and go out at end_backward(): the
// units' all-gathers interleave with the reductions during backward, and
// only a unit's buckets have a point that is the same on every rank
// (close_group()). They live until then, besides the bound below: the
// memory plan budgets them all.
//
// Three modes:
//  - kAllReduceFull (stage 0) and kReduceScatterFull (stage 1): buckets are
//    ranges of one persistent full gradient buffer, which also accumulates
//    micro-batches; on the micro-batch that ends the accumulation they are
//    all-reduced (stage 0) or reduce-scattered in place (stage 1: only the
//    rank's own chunk is needed, so ZeRO-1 sends 2 Psi in all, not 3 Psi; the
//    rest of the bucket is left as scratch and zeroed after the step).
//  - kReduceScatter (stage 2, and every offloaded stage): each bucket is a
//    transient buffer, reduce-scattered on every micro-batch; the rank's chunk
//    is handed to `consume` (which accumulates it into the gradient partition
//    on the device or the host) and the bucket is freed at once. At most
//    `max_in_flight` + 1 buckets exist at a time (besides, at stage 3 with
//    units, the kept ones: Options::kept_at_end) (ZeRO-R's constant-size
//    buffers: `max_in_flight` being reduced, one being filled): a new bucket
//    waits for the oldest reduction first. Only when autograd
//    leaves more buckets than that partially filled at once (an order far
//    from the launch order) do more exist.
// Without overlap_comm a bucket is reduced, blocking, as soon as it is full.
// Sums, not means: the engine folds 1/(world * accumulation) into the
// optimizer's grad_scale.
//
// On a device backend (NCCL) the host does not wait for a reduction during
// backward: the current stream waits for it on the device
// (Work::wait_on_device) before the chunk is consumed and the bucket freed,
// both in that stream's order; end_backward() then waits on the host for
// every reduction of the backward, once (where a failure or comm_timeout
// shows). On a host backend each reduction is waited for on the host, as
// the buffers are the host's.
#pragma once

#include <deque>
#include <functional>
#include <vector>

#include <ATen/Tensor.h>

#include "zero/comm/communicator.h"
#include "zero/memory/memory_ledger.h"
#include "zero/zero/flat_layout.h"

namespace zero {

enum class GradReduceMode { kAllReduceFull, kReduceScatterFull, kReduceScatter };

class GradReducer {
 public:
  // consume(bucket, chunk): kReduceScatter only; chunk is this rank's reduced
  // chunk of the bucket (bucket.chunk elements, gradient dtype), valid only
  // during the call.
  using Consumer = std::function<void(int bucket, const at::Tensor& chunk)>;

  struct Options {
    GradReduceMode mode = GradReduceMode::kAllReduceFull;
    bool overlap_comm = true;
    int max_in_flight = 2;
    // Each bucket is divided by this before its reduction (1: none). In
    // fp16 the engine divides by the number of ranks, so that the ranks'
    // mean, not their sum, goes through fp16's range (65504), as DeepSpeed's
    // ZeRO does: N ranks whose gradients fit would otherwise overflow their
    // sum, and the dynamic loss scale would settle log2(N) bits lower.
    double predivide = 1.0;
    // Stage 3 with units (of trainable or of frozen parameters): the
    // buckets of no group ("kept") go out at end_backward(), after every
    // unit's. The units' all-gathers run during backward, and a kept
    // bucket has no point that is the same on every rank (it completes
    // where its last gradient comes, or never on a rank that did not use
    // it): launched during backward it could pair with another rank's
    // all-gather.
    bool kept_at_end = false;
  };

  // full_grads: k*Full modes only, the flat gradient buffer
  // (layout.padded_numel() elements); for kReduceScatter, pass an undefined
  // tensor and a `like` tensor giving dtype and device of the buckets.
  GradReducer(const FlatLayout& layout, comm::Communicator& comm, memory::MemoryLedger& ledger,
              Options opts, at::Tensor full_grads, const at::Tensor& like, Consumer consume);

  // reduce: whether this backward communicates (kReduceScatter always does).
  void begin_backward(bool reduce);
  void on_grad(int param, const at::Tensor& grad);
  // Stage 3: the backward of group g (a unit) is over on this rank
  // (UnitSchedule::on_backward_done), at the same point on every rank: its
  // buckets are complete now, a parameter that got no gradient here (a
  // branch or an expert not taken on this rank) counting as zeros, and go
  // out in the launch order as on_grad()'s do. Without it such a bucket
  // would wait for end_backward() on this rank only, while the others
  // reduce it before the next unit's all-gather: the ranks' collectives
  // would diverge.
  void close_group(int g);
  // Whether parameter `param`'s bucket was closed by close_group() before
  // its gradient came (that gradient cannot be added any more).
  bool closed(int param) const;
  // The first parameter (layout order) that got no gradient in this
  // backward on this rank, or -1.
  int first_without_gradient() const;
  void end_backward();
  // After a backward that threw: waits for the collectives already started
  // (MPI cannot cancel them; every rank must have started the same ones, as
  // when all ranks hit the same error), drops their results and the buckets,
  // and is ready for the next begin_backward(). What this backward added to
  // full_grads is the caller's to discard.
  void abort();

 private:
  struct InFlight {
    int bucket;
    comm::WorkPtr work;
  };
  at::Tensor bucket_storage(int b);
  // Bucket b has all it will get in this backward.
  void complete(int b);
  // Launches what is ready (and, without overlap, waits for it).
  void progress();
  void launch_ready();
  void launch(int b);
  // After the first reducing backward: every rank takes rank 0's order.
  // Collective.
  void agree_order();
  // Stage 3: moves the kept buckets to the end of the launch order.
  void put_kept_last();
  // Bucket b holds parameters of no group, with Options::kept_at_end.
  bool kept(int b) const;
  void finish_oldest();
  void poll();
  // The reductions only the device waited for, waited for on the host.
  void confirm();

  const FlatLayout& layout_;
  comm::Communicator& comm_;
  memory::MemoryLedger& ledger_;
  Options opts_;
  at::Tensor full_grads_;
  at::Tensor like_;
  Consumer consume_;
  bool reducing_ = false;
  int next_launch_ = 0;        // into order_
  std::vector<int> pending_;  // parameters not yet arrived, per bucket
  std::vector<char> arrived_;  // per parameter: its gradient came in this backward
  std::vector<int> order_;    // the launch order: bucket numbers
  std::vector<int> completed_;  // buckets as they completed in this backward, until the order is agreed
  bool order_agreed_ = false;
  std::vector<at::Tensor> storage_;
  std::vector<memory::MemoryLedger::Registration> storage_reg_;
  std::deque<InFlight> in_flight_;
  std::deque<comm::WorkPtr> unconfirmed_;  // ordered on the device, not yet waited for on the host
  int live_buckets_ = 0;  // kReduceScatter: bucket buffers allocated now
};

}  // namespace zero
