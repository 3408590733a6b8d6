#include "zero/zero/grad_reducer.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>

#include "zero/core/error.h"
#include "zero/zero/device_wait.h"
#include "zero/zero/torch_dtype.h"

namespace zero {

GradReducer::GradReducer(const FlatLayout& layout, comm::Communicator& comm,
                         memory::MemoryLedger& ledger, Options opts, at::Tensor full_grads,
                         const at::Tensor& like, Consumer consume)
    : layout_(layout),
      comm_(comm),
      ledger_(ledger),
      opts_(opts),
      full_grads_(std::move(full_grads)),
      like_(like),
      consume_(std::move(consume)),
      pending_(layout.buckets().size(), 0),
      arrived_(layout.params().size(), 0),
      order_(layout.buckets().size()),
      storage_(layout.buckets().size()),
      storage_reg_(layout.buckets().size()) {
  ZERO_INTERNAL_ASSERT(opts_.mode == GradReduceMode::kReduceScatter || full_grads_.defined());
  ZERO_INTERNAL_ASSERT(opts_.mode != GradReduceMode::kReduceScatter || (like_.defined() && consume_));
  ZERO_INTERNAL_ASSERT(opts_.max_in_flight >= 1);
  std::iota(order_.begin(), order_.end(), 0);
  put_kept_last();
}

bool GradReducer::kept(int b) const {
  return opts_.kept_at_end && layout_.buckets()[static_cast<std::size_t>(b)].group < 0;
}

void GradReducer::put_kept_last() {
  // Kept buckets wait for end_backward() (Options::kept_at_end): last in
  // the order, they hold back no unit's bucket.
  if (opts_.kept_at_end) std::stable_partition(order_.begin(), order_.end(), [&](int b) { return !kept(b); });
}

void GradReducer::begin_backward(bool reduce) {
  ZERO_INTERNAL_ASSERT(in_flight_.empty());
  reducing_ = reduce || opts_.mode == GradReduceMode::kReduceScatter;
  next_launch_ = 0;
  for (std::size_t b = 0; b < pending_.size(); ++b) {
    pending_[b] = static_cast<int>(layout_.buckets()[b].params.size());
  }
  std::fill(arrived_.begin(), arrived_.end(), 0);
  completed_.clear();
}

at::Tensor GradReducer::bucket_storage(int b) {
  const Bucket& bucket = layout_.buckets()[static_cast<std::size_t>(b)];
  if (opts_.mode != GradReduceMode::kReduceScatter) {
    return full_grads_.narrow(0, static_cast<std::int64_t>(bucket.offset),
                              static_cast<std::int64_t>(bucket.padded));
  }
  auto& s = storage_[static_cast<std::size_t>(b)];
  if (!s.defined()) {
    // ZeRO-R's constant-size buffers: before a new bucket is allocated, wait
    // for the oldest reduction so that at most max_in_flight reductions plus
    // the one bucket being filled exist. (Only buckets already launched can
    // be freed: if autograd leaves more buckets partially filled at once,
    // they all live.) Waiting already at max_in_flight live buckets would
    // leave a single reduction overlapping backward: stage 2 measured ~5%
    // slower than stage 1 that way (docs/PERFORMANCE.md).
    // Kept buckets (stage 3) wait for the units' and are not counted: they
    // are budgeted apart (memory_plan.cpp), and counting them would make
    // every unit bucket wait for the reductions before it.
    if (!kept(b)) {
      while (live_buckets_ > opts_.max_in_flight && !in_flight_.empty()) finish_oldest();
      ++live_buckets_;
    }
    at::Tensor t = at::zeros({static_cast<std::int64_t>(bucket.padded)}, like_.options());
    // The bucket's own bytes, as allocated (a refusal frees it again).
    // Not refused here: a refusal inside backward could hit one rank only
    // (bucket frees follow communication progress) while the others wait in
    // the reduce-scatter. The engine checks bucket_bound_bytes() against the
    // budget when it is built, on every rank alike.
    storage_reg_[static_cast<std::size_t>(b)] =
        ledger_.add(memory::Tier::kDevice, memory::Kind::kBuckets, static_cast<std::int64_t>(t.nbytes()),
                    "a gradient bucket", /*check_budget=*/false);
    s = std::move(t);
  }
  return s;
}

void GradReducer::on_grad(int param, const at::Tensor& grad) {
  const ParamSlot& slot = layout_.params()[static_cast<std::size_t>(param)];
  const Bucket& bucket = layout_.buckets()[static_cast<std::size_t>(slot.bucket)];
  at::Tensor dst = bucket_storage(slot.bucket)
                       .narrow(0, static_cast<std::int64_t>(slot.offset - bucket.offset),
                               static_cast<std::int64_t>(slot.numel));
  dst.add_(grad.reshape({-1}));
  int& pending = pending_[static_cast<std::size_t>(slot.bucket)];
  ZERO_INTERNAL_ASSERT(pending > 0, "parameter ", param, " produced two gradients in one backward");
  arrived_[static_cast<std::size_t>(param)] = 1;
  if (--pending == 0) complete(slot.bucket);
  progress();
}

void GradReducer::complete(int b) {
  if (reducing_ && !order_agreed_) completed_.push_back(b);
}

void GradReducer::close_group(int g) {
  if (!reducing_) return;
  bool any = false;
  for (const int b : layout_.group_buckets(g)) {
    int& pending = pending_[static_cast<std::size_t>(b)];
    if (pending == 0) continue;
    pending = 0;
    complete(b);
    any = true;
  }
  if (any) progress();
}

int GradReducer::first_without_gradient() const {
  const auto it = std::find(arrived_.begin(), arrived_.end(), 0);
  return it == arrived_.end() ? -1 : static_cast<int>(it - arrived_.begin());
}

bool GradReducer::closed(int param) const {
  // Complete without it: only close_group() completes a bucket that way.
  const std::size_t b = static_cast<std::size_t>(layout_.params()[static_cast<std::size_t>(param)].bucket);
  return pending_[b] == 0 && arrived_[static_cast<std::size_t>(param)] == 0;
}

void GradReducer::progress() {
  if (reducing_ && opts_.overlap_comm) {
    poll();
    launch_ready();
  } else if (reducing_) {
    // No overlap: a full bucket is reduced at once, blocking, so that buckets
    // are freed as they go instead of all living until end_backward().
    launch_ready();
    while (!in_flight_.empty()) finish_oldest();
  }
}

void GradReducer::launch_ready() {
  const int n = static_cast<int>(pending_.size());
  while (next_launch_ < n && pending_[static_cast<std::size_t>(order_[static_cast<std::size_t>(next_launch_)])] == 0) {
    if (kept(order_[static_cast<std::size_t>(next_launch_)])) break;  // at end_backward()
    launch(order_[static_cast<std::size_t>(next_launch_++)]);
  }
}

void GradReducer::launch(int b) {
  while (static_cast<int>(in_flight_.size()) >= opts_.max_in_flight) finish_oldest();
  const Bucket& bucket = layout_.buckets()[static_cast<std::size_t>(b)];
  at::Tensor s = bucket_storage(b);
  if (opts_.predivide != 1.0) s.div_(opts_.predivide);
  const DType dt = to_dtype(s.scalar_type());
  comm::WorkPtr work;
  if (opts_.mode == GradReduceMode::kAllReduceFull) {
    work = comm_.all_reduce(s.data_ptr(), bucket.padded, dt, {comm::ReduceOp::kSum, bucket_tag(b)});
  } else {
    // In place: this rank's chunk of the bucket receives the reduced chunk.
    auto* base = static_cast<char*>(s.data_ptr());
    void* out = base + static_cast<std::size_t>(comm_.rank()) * bucket.chunk * s.element_size();
    work = comm_.reduce_scatter(base, out, bucket.chunk, dt, {comm::ReduceOp::kSum, bucket_tag(b)});
  }
  in_flight_.push_back({b, std::move(work)});
}

void GradReducer::finish_oldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  // The consumer's work and the bucket's free follow on the current stream.
  wait_for_use(std::move(f.work), like_.device(), unconfirmed_);
  if (opts_.mode == GradReduceMode::kReduceScatter) {
    const Bucket& bucket = layout_.buckets()[static_cast<std::size_t>(f.bucket)];
    at::Tensor& s = storage_[static_cast<std::size_t>(f.bucket)];
    consume_(f.bucket, s.narrow(0, static_cast<std::int64_t>(comm_.rank() * bucket.chunk),
                                static_cast<std::int64_t>(bucket.chunk)));
    s = at::Tensor();
    storage_reg_[static_cast<std::size_t>(f.bucket)].release();
    if (!kept(f.bucket)) --live_buckets_;
  }
}

void GradReducer::poll() {
  // Non-blocking MPI collectives progress only inside MPI calls: testing the
  // oldest one from the hook keeps them moving while backward computes.
  while (!in_flight_.empty() && in_flight_.front().work->is_completed()) finish_oldest();
}

void GradReducer::end_backward() {
  if (reducing_) {
    const int n = static_cast<int>(pending_.size());
    while (next_launch_ < n) launch(order_[static_cast<std::size_t>(next_launch_++)]);
    while (!in_flight_.empty()) finish_oldest();
  }
  confirm();
  if (reducing_ && !order_agreed_) agree_order();
  reducing_ = false;
}

void GradReducer::agree_order() {
  // Rank 0's order: its buckets as they completed, then those that did not
  // (a parameter without a gradient), in layout order. Every rank takes it,
  // so all issue the same collectives in the same order from now on.
  const std::size_t n = order_.size();
  std::vector<std::int32_t> order(completed_.begin(), completed_.end());
  for (std::size_t b = 0; b < n; ++b) {
    if (pending_[b] != 0) order.push_back(static_cast<std::int32_t>(b));  // never completed
  }
  ZERO_INTERNAL_ASSERT(order.size() == n);
  if (comm_.world_size() > 1) {
    // Bucket numbers, sent as 4-byte words (a broadcast copies them; the
    // buffer lives where the communicator reads: device memory for NCCL).
    const auto count = static_cast<std::int64_t>(n);
    at::Tensor words = at::from_blob(order.data(), {count}, at::kInt).to(like_.device(), false, /*copy=*/true);
    wait_for_use(comm_.broadcast(words.data_ptr(), n, DType::kFloat32, {/*root=*/0, /*tag=*/0}), like_.device(),
                 unconfirmed_);
    confirm();
    words = words.to(at::kCPU);
    std::copy(words.data_ptr<std::int32_t>(), words.data_ptr<std::int32_t>() + count, order.begin());
  }
  std::vector<char> seen(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int32_t b = order[i];
    ZERO_INTERNAL_ASSERT(b >= 0 && static_cast<std::size_t>(b) < n && !seen[static_cast<std::size_t>(b)],
                         "the launch order from rank 0 is not a permutation of the buckets");
    seen[static_cast<std::size_t>(b)] = 1;
    order_[i] = b;
  }
  put_kept_last();
  order_agreed_ = true;
}

void GradReducer::confirm() {
  while (!unconfirmed_.empty()) {
    comm::WorkPtr w = unconfirmed_.front();
    w->wait();
    unconfirmed_.pop_front();
  }
}

void GradReducer::abort() {
  std::vector<comm::WorkPtr> started;  // oldest first
  for (comm::WorkPtr& w : unconfirmed_) started.push_back(std::move(w));
  for (InFlight& f : in_flight_) started.push_back(std::move(f.work));
  in_flight_.clear();
  unconfirmed_.clear();
  for (const comm::WorkPtr& w : started) {
    try {
      w->wait();
    } catch (...) {
      // The backward's own error is the one the caller reports.
    }
  }
  for (std::size_t b = 0; b < storage_.size(); ++b) {
    storage_[b] = at::Tensor();
    storage_reg_[b].release();
  }
  live_buckets_ = 0;
  reducing_ = false;
  next_launch_ = 0;
}

}  // namespace zero
