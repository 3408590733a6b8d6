#include "grad_path.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/StreamGuard.h>

#include "planned_tensor.h"

namespace zero::detail {

using memory::Tier;

GradPath::GradPath(const MemoryPlan& plan, const DeviceContext& ctx, Options options, comm::Communicator& comm,
                   memory::MemoryLedger& ledger, const at::Tensor& like)
    : layout_(plan.layout), ctx_(ctx), o_(options), gpu_offload_(options.offload && ctx.on_accelerator()),
      split_(plan.offload_split) {
  // Each buffer as the plan has it (zero/zero/memory_plan.h), registered as allocated.
  auto allocate = [&](Buffer id, at::Tensor& t) {
    const PlannedBuffer& b = plan[id];
    if (!b.present) return;
    const auto dtype = b.element_bytes == 4 ? at::kFloat : like.scalar_type();
    t = b.tier == Tier::kHost ? ctx.host_tensor(b.elements, dtype).zero_()
                              : at::zeros({i64(b.elements)}, like.options().dtype(dtype));
    register_planned(ledger, regs_, b, t);
  };
  allocate(Buffer::kFullGrads, full_grads_);
  allocate(Buffer::kPartGrads, part_grads_);
  allocate(Buffer::kHostGrads0, host_grads_[0]);
  allocate(Buffer::kHostGrads1, host_grads_[1]);
  allocate(Buffer::kDevAccum, dev_accum_);
  allocate(Buffer::kDevGrads, dev_grads_);
  GradReducer::Options ro;
  ro.overlap_comm = o_.overlap_comm;
  ro.max_in_flight = kPlanLiveBuckets - 1;  // the plan budgets this many buckets at once
  ro.kept_at_end = has_units(plan);          // and, then, every kept bucket besides
  ro.mode = full_grads_.defined() ? (o_.stage == 0 ? GradReduceMode::kAllReduceFull : GradReduceMode::kReduceScatterFull)
                                  : GradReduceMode::kReduceScatter;
  // fp16 buckets carry the ranks' mean (grad_reducer.h); bf16 and fp32
  // have fp32's range, and sum exactly as before.
  const at::ScalarType reduced = full_grads_.defined() ? full_grads_.scalar_type() : like.scalar_type();
  if (reduced == at::kHalf && comm.world_size() > 1) ro.predivide = static_cast<double>(comm.world_size());
  predivide_ = ro.predivide;
  reducer_ = std::make_unique<GradReducer>(layout_, comm, ledger, ro, full_grads_, at::empty({0}, like.options()),
                                           [this](int b, const at::Tensor& chunk) { consume(b, chunk); });
}

void GradPath::begin_backward(bool boundary) {
  boundary_ = boundary;
  reducer_->begin_backward(boundary);
}

void GradPath::on_grad(int index, const at::Tensor& grad) { reducer_->on_grad(index, grad); }
void GradPath::close_unit(int group) { reducer_->close_group(group); }
bool GradPath::closed(int index) const { return reducer_->closed(index); }
int GradPath::first_without_gradient() const { return reducer_->first_without_gradient(); }

void GradPath::end_backward() {
  reducer_->end_backward();
  window_first_ = false;
}

void GradPath::abort() {
  reducer_->abort();
  bucket_norms_.clear();
  window_first_ = true;
  if (full_grads_.defined()) full_grads_.zero_();
  if (part_grads_.defined()) part_grads_.zero_();
  if (host_grads_[static_cast<std::size_t>(cur_)].defined() && !gpu_offload_) {
    host_grads_[static_cast<std::size_t>(cur_)].zero_();
  }
  if (dev_grads_.defined() && !gpu_offload_) dev_grads_.zero_();
}

// Accumulates this rank's reduced chunk of bucket b into the partition.
void GradPath::consume(int b, const at::Tensor& chunk) {
  const Bucket& bucket = layout_.buckets()[static_cast<std::size_t>(b)];
  consume_into_partition(bucket, chunk);
  if (on_bucket_reduced_) on_bucket_reduced_(b);
}

void GradPath::consume_into_partition(const Bucket& bucket, const at::Tensor& chunk) {
  if (gpu_offload_) return consume_gpu_offload(bucket, chunk);
  if (o_.offload) {
    // D2H in the training precision (docs/design.md's 2 Psi/N bytes for bf16);
    // the host widens to fp32 as it accumulates. The device share stays.
    const std::size_t host = host_part(bucket);
    if (host > 0) {
      const at::Tensor part = chunk.narrow(0, 0, i64(host));
      const at::Tensor src = part.is_cpu() ? part : part.to(at::kCPU);
      host_grads_[static_cast<std::size_t>(cur_)].narrow(0, i64(bucket.partition_offset), i64(host)).add_(src);
      copied_ += src.nbytes();  // D2H
    }
    if (host < bucket.chunk) {
      dev_grads_.narrow(0, i64(bucket.partition_offset + host - split_), i64(bucket.chunk - host))
          .add_(chunk.narrow(0, i64(host), i64(bucket.chunk - host)));
    }
  } else {
    part_grads_.narrow(0, i64(bucket.partition_offset), i64(bucket.chunk)).add_(chunk);
  }
}

void GradPath::consume_gpu_offload(const Bucket& bucket, const at::Tensor& chunk) {
  const std::int64_t off = i64(bucket.partition_offset), n = i64(bucket.chunk);
  at::Tensor g = chunk;
  if (dev_accum_.defined()) {
    at::Tensor acc = dev_accum_.narrow(0, off, n);
    if (window_first_) {
      acc.copy_(chunk);
    } else {
      acc.add_(chunk);
    }
    if (!boundary_) return;
    g = acc;
  }
  bucket_norms_.push_back(at::linalg_vector_norm(g, 2, c10::nullopt, false, at::kFloat));
  const std::int64_t host = i64(host_part(bucket));
  if (host < n && !dev_accum_.defined()) {
    // The device share stays on the device (with accumulation the sum is there already).
    dev_grads_.narrow(0, off + host - i64(split_), n - host).copy_(g.narrow(0, host, n - host));
  }
  if (host == 0) return;
  // Down on the copy stream, after the compute stream has produced g.
  ctx_.record_on(ctx_.current_stream())->block(*ctx_.copy_stream);
  const at::Tensor down = g.narrow(0, 0, host);
  {
    const c10::StreamGuard on_copy(*ctx_.copy_stream);
    StepTimeline::on_stream(timeline_, *ctx_.copy_stream, "copy down", "bucket",
                            static_cast<std::size_t>(&bucket - layout_.buckets().data()), [&] {
                              host_grads_[static_cast<std::size_t>(cur_)].narrow(0, off, host).copy_(down, /*non_blocking=*/true);
                            });
  }
  // The reducer frees its bucket when this returns: the allocator must not
  // hand the memory out again before the copy stream has read it.
  if (!dev_accum_.defined()) g.record_stream(*ctx_.copy_stream);
  copied_ += down.nbytes();  // D2H
}

at::Tensor GradPath::device_share(std::size_t at, std::size_t n) const {
  if (dev_accum_.defined()) return dev_accum_.narrow(0, i64(at), i64(n));
  return dev_grads_.narrow(0, i64(at - split_), i64(n));
}

at::Tensor GradPath::piece(const Bucket& b, std::size_t offset, std::size_t n, int buf) const {
  const std::size_t at = b.partition_offset + offset;
  if (o_.offload) {
    if (at >= split_) return device_share(at, n);
    return host_grads_[static_cast<std::size_t>(buf)].narrow(0, i64(at), i64(n));
  }
  if (full_grads_.defined()) return full_grads_.narrow(0, i64(chunk_flat_offset(b) + offset), i64(n));
  return part_grads_.narrow(0, i64(at), i64(n));
}

at::Tensor GradPath::local_sq_norm(int buf) const {
  if (gpu_offload_) return at::stack(bucket_norms_).to(at::kDouble).square().sum();
  std::vector<at::Tensor> norms;
  norms.reserve(layout_.buckets().size() + 1);
  auto add = [&](const at::Tensor& t) {
    norms.push_back(at::linalg_vector_norm(t, 2, c10::nullopt, false, at::kFloat));
  };
  for (const Bucket& b : layout_.buckets()) {
    // A bucket across the split: each side's norm (their squares add up).
    const std::size_t host = o_.offload ? host_part(b) : b.chunk;
    if (host > 0) add(piece(b, 0, host, buf));
    if (host < b.chunk) add(piece(b, host, b.chunk - host, buf));
  }
  return at::stack(norms).to(at::kDouble).square().sum();
}

void GradPath::window_done(int buf) {
  if (gpu_offload_) down_done_[static_cast<std::size_t>(buf)] = ctx_.record_on(*ctx_.copy_stream);
}

void GradPath::wait_down(int buf) const {
  if (const auto& ev = down_done_[static_cast<std::size_t>(buf)]) ev->synchronize();
}

void GradPath::zero(int buf) {
  bucket_norms_.clear();
  window_first_ = true;
  // On a GPU the host gradients are overwritten by each window's copies.
  if (o_.offload && !gpu_offload_) host_grads_[static_cast<std::size_t>(buf)].zero_();
  if (dev_grads_.defined() && !gpu_offload_) dev_grads_.zero_();
  if (full_grads_.defined()) full_grads_.zero_();
  if (part_grads_.defined()) part_grads_.zero_();
}

void GradPath::release_buffers() {
  for (at::Tensor* t : {&full_grads_, &part_grads_, &host_grads_[0], &host_grads_[1], &dev_accum_, &dev_grads_}) {
    *t = at::Tensor();
  }
}

void GradPath::flip() { cur_ ^= 1; }

std::uint64_t GradPath::take_copied_bytes() {
  const std::uint64_t n = copied_;
  copied_ = 0;
  return n;
}

}  // namespace zero::detail
