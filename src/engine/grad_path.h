// Where gradients go: from autograd's hooks into the reducer's buckets, over
// the communicator, into this rank's gradient buffer — the full flat buffer
// (stages 0/1), a device partition (stage 2), or host memory (offload) —
// and how the optimizer then reads them (piece()) and their norm.
//
// ZeRO-Offload on a GPU: each reduced chunk of the micro-batch that ends the
// accumulation window goes down to pinned host memory on the copy stream
// while backward goes on: in the training precision, or, when micro-batches
// accumulate, as the window's fp32 sum, built on the device by the earlier
// ones. The host gradients are therefore never summed on the CPU, and their
// norm is taken on the device as the chunks pass. window_done() records
// when the copies of a window are done; wait_down() waits for it on the
// host (before the CPU step reads them). With DPU two host buffers
// alternate (flip()).
//
// Offload with a device share (offload_optimizer.ratio < 1): the part of
// each chunk past MemoryPlan::offload_split stays on the device (a device
// gradient buffer, or the accumulation sum), and only the rest goes down.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Event.h>

#include "device_context.h"
#include "step_timeline.h"
#include "zero/comm/communicator.h"
#include "zero/memory/memory_ledger.h"
#include "zero/zero/flat_layout.h"
#include "zero/zero/grad_reducer.h"
#include "zero/zero/memory_plan.h"

namespace zero::detail {

class GradPath {
 public:
  struct Options {
    int stage = 0;
    bool offload = false;
    bool dpu = false;
    int accumulation = 1;
    bool overlap_comm = true;
    int shard_rank = 0;
    // bf16/fp16 offload on a GPU without accumulation: the CPU step writes
    // the updated parameters over the host gradients (adam.h allows it),
    // and that buffer goes up (update_in_grads()).
    bool update_in_grads = false;
  };
  // like: a tensor with the dtype and device of the training-precision
  // parameters. Allocates this rank's buffers and the reducer.
  GradPath(const MemoryPlan& plan, const DeviceContext& ctx, Options options, comm::Communicator& comm,
           memory::MemoryLedger& ledger, const at::Tensor& like);

  void begin_backward(bool boundary);
  // Autograd has finished parameter `index`'s gradient.
  void on_grad(int index, const at::Tensor& grad);
  // Stage 3: unit `group`'s backward is over (GradReducer::close_group).
  void close_unit(int group);
  // Whether parameter `index`'s unit was closed before its gradient came.
  bool closed(int index) const;
  // The first parameter with no gradient in this backward on this rank, or -1.
  int first_without_gradient() const;
  void end_backward();
  // After a backward that threw: waits for what the reducer started, drops
  // the window's gradients (the caller resets the parameters' .grad).
  void abort();

  // This rank's gradients of bucket b's chunk, elements [offset, offset + n),
  // in buffer `buf` (host buffers alternate under DPU; 0 otherwise), as the
  // optimizer reads them. The range lies on one side of the split.
  at::Tensor piece(const Bucket& b, std::size_t offset, std::size_t n, int buf) const;
  // The squared L2 norm of this rank's (summed, still scaled) gradients, a
  // one-element fp64 tensor where they are (no host read on a GPU); inf or
  // NaN when any element is not finite. Each bucket's norm is fp32, their
  // squares are summed in fp64.
  at::Tensor local_sq_norm(int buf) const;
  // What the buffers' sum over the ranks was divided by already (the
  // reducer's predivide): the ranks' count in fp16, else 1.
  double predivided() const { return predivide_; }
  // The window's gradients are complete: on a GPU with offload, records
  // their copies' completion.
  void window_done(int buf);
  // Blocks until the window's copies into `buf` are done (GPU offload).
  void wait_down(int buf) const;
  // Clears buffer `buf` (and the window's state) for the next window.
  void zero(int buf);

  // The engine is going: the gradient buffers are freed now (before the
  // module gets fp32 tensors of its own back). Nothing may use them after.
  void release_buffers();

  int current() const { return cur_; }
  // DPU: the next window's gradients go to the other host buffer.
  void flip();
  bool update_in_grads() const { return o_.update_in_grads; }
  const at::Tensor& host(int buf) const { return host_grads_[static_cast<std::size_t>(buf)]; }
  // Bytes copied device -> host since the last call.
  std::uint64_t take_copied_bytes();
  // Where the copies down are traced (Engine::trace()); null: nowhere.
  void set_timeline(StepTimeline* timeline) { timeline_ = timeline; }
  // Called with bucket b once this rank's chunk of its reduced gradient has
  // been taken (queued down on a GPU): backward reads b's parameters no
  // more. (offload_optimizer.publish_in_backward.)
  void set_on_bucket_reduced(std::function<void(int)> f) { on_bucket_reduced_ = std::move(f); }

 private:
  void consume(int b, const at::Tensor& chunk);
  void consume_into_partition(const Bucket& bucket, const at::Tensor& chunk);
  void consume_gpu_offload(const Bucket& bucket, const at::Tensor& chunk);
  // Bucket b's chunk as the host share's elements (the first `host`) and
  // the device share's (the rest).
  std::size_t host_part(const Bucket& b) const { return chunk_before(b, split_); }
  // The device share's gradients of [at, at + n) of the partition.
  at::Tensor device_share(std::size_t at, std::size_t n) const;
  std::size_t chunk_flat_offset(const Bucket& b) const {
    return b.offset + static_cast<std::size_t>(o_.shard_rank) * b.chunk;
  }

  const FlatLayout& layout_;
  const DeviceContext& ctx_;
  Options o_;
  bool gpu_offload_ = false;
  at::Tensor full_grads_;                 // stage 0/1 without offload: device, padded
  at::Tensor part_grads_;                 // stage 2 without offload: device partition
  std::array<at::Tensor, 2> host_grads_;  // offload: host partition (two with DPU)
  at::Tensor dev_accum_;                  // GPU offload with accumulation: fp32 device partition
  at::Tensor dev_grads_;                  // offload: the device share's gradients (unless dev_accum_ has them)
  std::size_t split_ = 0;                 // where the device share begins (MemoryPlan::offload_split)
  int cur_ = 0;
  bool boundary_ = false;      // the backward now running ends the window
  bool window_first_ = true;   // ...and is its first (dev_accum_ is overwritten)
  std::vector<at::Tensor> bucket_norms_;  // GPU offload: fp32 device scalars of the window
  std::array<std::shared_ptr<c10::Event>, 2> down_done_;
  std::uint64_t copied_ = 0;
  StepTimeline* timeline_ = nullptr;
  std::function<void(int)> on_bucket_reduced_;
  std::vector<memory::MemoryLedger::Registration> regs_;
  double predivide_ = 1.0;
  std::unique_ptr<GradReducer> reducer_;  // last: its consumer calls back into this object
};

}  // namespace zero::detail
