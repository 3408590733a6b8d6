#include "optimizer_partition.h"

#include <algorithm>
#include <thread>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>

#include "planned_tensor.h"
#include "zero/core/error.h"
#include "zero/optim/cpu_adam.h"
#include "zero/zero/torch_dtype.h"

namespace zero::detail {

using memory::Tier;

OptimizerPartition::OptimizerPartition(const config::Config& config, const MemoryPlan& plan,
                                       const DeviceContext& ctx, Options options, memory::MemoryLedger& ledger)
    : opt_(config.optimizer), plan_(plan), layout_(plan.layout), ctx_(ctx), o_(options), ledger_(ledger),
      adagrad_(config.optimizer.is_adagrad()) {
  split_ = plan.offload_split;
  const bool device_share = split_ < layout_.partition_numel();
  if (ctx_.on_accelerator() && (!o_.offload || device_share)) {
    device_adam_ = optim::device_adam();
    ZERO_CHECK(device_adam_ != nullptr, "the module is on ", ctx_.device.str(),
               " but no device Adam is linked into this program: link zero_cuda (the zerocpp "
               "target does), or offload the optimizer, all of it (offload_optimizer.device=\"cpu\", ratio 1).");
    ZERO_CHECK(!adagrad_, "optimizer ", opt_.type, " has no kernel on ", ctx_.device.str(),
               ": use Adam/AdamW there, or offload the optimizer to the CPU, all of it "
               "(offload_optimizer.device=\"cpu\", ratio 1), where Adagrad runs.");
  }
  // On a GPU the CPU step leaves one core to the thread that feeds the GPU
  // (a fully busy CPU slowed the GPU's steps by up to 40% on the H100
  // machine, docs/PERFORMANCE.md); offload_optimizer.cpu_threads overrides.
  int threads = config.zero_optimization.offload_optimizer.cpu_threads;
  if (threads == 0 && o_.offload && ctx_.on_accelerator()) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
  }
  pool_ = std::make_unique<optim::ThreadPool>(threads);
  for (const Bucket& b : layout_.buckets()) {
    const std::size_t eighth = (b.chunk / 8 + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
    const std::size_t piece = std::clamp(eighth, kPieceAlign, kMaxPieceElements);
    for (std::size_t off = 0; off < b.chunk;) {
      std::size_t n = std::min(piece, b.chunk - off);
      const std::size_t at = b.partition_offset + off;
      if (at < split_) {
        n = std::min(n, split_ - at);  // a piece ends at the split
      } else {
        n = b.chunk - off;  // the device share: one kernel per bucket (nothing goes up piece by piece)
      }
      std::vector<Piece>& list = at < split_ ? pieces_ : device_pieces_;
      list.push_back(Piece{&b, off, n, list.size(), at < split_ ? Share::kMain : Share::kDevice});
      off += n;
    }
  }
}

// A buffer of the plan, allocated where the plan puts it (pinned host memory
// on a GPU) and registered as allocated.
at::Tensor OptimizerPartition::allocate(Buffer id, c10::ScalarType dtype, bool zero) {
  const PlannedBuffer& b = plan_[id];
  at::Tensor t = b.tier == Tier::kHost ? ctx_.host_tensor(b.elements, dtype)
                                       : at::empty({i64(b.elements)}, at::TensorOptions().dtype(dtype).device(ctx_.device));
  if (zero) t.zero_();
  register_planned(ledger_, regs_, b, t);
  return t;
}

at::Tensor OptimizerPartition::full_master() const {
  if (!dev_master_.defined()) return master_;
  return at::cat({master_, dev_master_.to(master_.device())});
}

void OptimizerPartition::seed_master(const at::Tensor& flat32) {
  allocate_master();
  for (const Bucket& b : layout_.buckets()) {
    seed_master_chunk(b, flat32.narrow(0, i64(b.offset + static_cast<std::size_t>(plan_.shard_rank) * b.chunk),
                                       i64(b.chunk)));
  }
}

void OptimizerPartition::allocate_master() {
  master_ = allocate(Buffer::kMaster, at::kFloat, /*zero=*/false);
  if (plan_[Buffer::kDevMaster].present) dev_master_ = allocate(Buffer::kDevMaster, at::kFloat, /*zero=*/false);
}

void OptimizerPartition::seed_master_chunk(const Bucket& b, const at::Tensor& chunk32) {
  const std::size_t host = chunk_before(b, split_), dev = b.chunk - host;
  if (host > 0) master_.narrow(0, i64(b.partition_offset), i64(host)).copy_(chunk32.narrow(0, 0, i64(host)));
  if (dev > 0) {
    dev_master_.narrow(0, i64(b.partition_offset + host - split_), i64(dev)).copy_(chunk32.narrow(0, i64(host), i64(dev)));
  }
}

void OptimizerPartition::allocate_moments() {
  exp_avg_ = allocate(Buffer::kExpAvg, at::kFloat, /*zero=*/true);
  if (adagrad_) {
    exp_avg_.fill_(opt_.initial_accumulator_value);
  } else {
    exp_avg_sq_ = allocate(Buffer::kExpAvgSq, at::kFloat, /*zero=*/true);
  }
  if (plan_[Buffer::kStaging].present) staging_ = allocate(Buffer::kStaging, o_.dtype, /*zero=*/false);
  if (plan_[Buffer::kDevExpAvg].present) {
    dev_exp_avg_ = allocate(Buffer::kDevExpAvg, at::kFloat, /*zero=*/true);
    if (adagrad_) {
      dev_exp_avg_.fill_(opt_.initial_accumulator_value);
    } else {
      dev_exp_avg_sq_ = allocate(Buffer::kDevExpAvgSq, at::kFloat, /*zero=*/true);
    }
  }
  if (plan_[Buffer::kDevStaging].present) dev_staging_ = allocate(Buffer::kDevStaging, o_.dtype, /*zero=*/false);
}

void OptimizerPartition::step(Share share, const GradsFn& grads, const HalfOutFn& half_out, float grad_scale,
                              float lr, std::int64_t step, const PieceDoneFn& after_piece) {
  if (pieces(share).empty()) return;
  const bool dev = share == Share::kDevice;
  // Where the share's state is, indexed from the share's start.
  const std::size_t base = dev ? split_ : 0;
  float* master = (dev ? dev_master_ : master_).data_ptr<float>();
  float* m1 = (dev ? dev_exp_avg_ : exp_avg_).data_ptr<float>();
  float* m2 = adagrad_ ? nullptr : (dev ? dev_exp_avg_sq_ : exp_avg_sq_).data_ptr<float>();
  // The device Adam where the share's state is on a GPU: the whole
  // partition without offload, the device share with it.
  const bool on_device = device_adam_ != nullptr && (dev || !o_.offload);
  for (const Piece& pc : pieces(share)) {
    const at::Tensor g = grads(pc);
    void* half = o_.dtype != at::kFloat ? half_out(pc, g) : nullptr;
    const std::size_t po = pc.at() - base;
    if (adagrad_) {
      optim::AdagradHyper h;
      h.lr = lr;
      h.eps = opt_.eps;
      h.weight_decay = opt_.weight_decay;
      h.step = step;
      optim::AdagradBuffers buf{master + po, g.data_ptr(), to_dtype(g.scalar_type()), m1 + po,
                                pc.n, grad_scale, half, to_dtype(o_.dtype)};
      optim::adagrad_step(h, buf, pool_.get());
    } else {
      optim::AdamHyper h;
      h.lr = lr;
      h.beta1 = opt_.beta1;
      h.beta2 = opt_.beta2;
      h.eps = opt_.eps;
      h.weight_decay = opt_.weight_decay;
      h.decoupled_weight_decay = opt_.decoupled_weight_decay();
      h.step = step;
      optim::AdamBuffers buf;
      buf.params = master + po;
      buf.grads = g.data_ptr();
      buf.grad_dtype = to_dtype(g.scalar_type());
      buf.exp_avg = m1 + po;
      buf.exp_avg_sq = m2 + po;
      buf.n = pc.n;
      buf.grad_scale = grad_scale;
      buf.half_out = half;
      buf.half_dtype = to_dtype(o_.dtype);
      if (on_device) {
        const c10::DeviceGuard on_device_guard(ctx_.device);
        device_adam_(h, buf, ctx_.native_stream());
      } else {
        optim::adam_step(h, buf, pool_.get());
      }
    }
    if (after_piece) after_piece(pc);
  }
}

}  // namespace zero::detail
