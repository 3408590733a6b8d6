#include "optimizer_partition.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <utility>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>

#include "planned_tensor.h"
#include "zero/comm/launcher_env.h"
#include "zero/core/cpu_cores.h"
#include "zero/core/error.h"
#include "zero/optim/cpu_adam.h"
#include "zero/zero/torch_dtype.h"

namespace zero::detail {

using memory::Tier;

OptimizerPartition::OptimizerPartition(const config::Config& config, const MemoryPlan& plan,
                                       const DeviceContext& ctx, Options options, memory::MemoryLedger& ledger)
    : opt_(config.optimizer), plan_(plan), layout_(plan.layout), ctx_(ctx), o_(options), ledger_(ledger) {
  split_ = plan.offload_split;
  const bool device_share = split_ < layout_.partition_numel();
  if (ctx_.on_accelerator() && (!o_.offload || device_share)) {
    ZERO_CHECK(!opt_.is_adagrad(), "optimizer ", opt_.type, " has no kernel on ", ctx_.device.str(),
               ": use Adam/AdamW or Lion there, or offload the optimizer to the CPU, all of it "
               "(offload_optimizer.device=\"cpu\", ratio 1), where ", opt_.type, " runs.");
    if (opt_.is_lion()) {
      device_lion_ = optim::device_lion();
    } else {
      device_adam_ = optim::device_adam();
    }
    ZERO_CHECK(device_adam_ != nullptr || device_lion_ != nullptr, "the module is on ", ctx_.device.str(),
               " but no device ", opt_.type, " is linked into this program: link zero_cuda (the zerocpp "
               "target does), or offload the optimizer, all of it (offload_optimizer.device=\"cpu\", ratio 1).");
  }
  // By default this rank's share of the cores it may run on (its affinity
  // mask over the ranks on this node: ranks that each took every core
  // would contend for them in the steps they run together). On a GPU the
  // CPU step leaves one core of it to the thread that feeds the GPU (a fully
  // busy CPU slowed the GPU's steps by up to 40% on the H100 machine,
  // docs/PERFORMANCE.md); offload_optimizer.cpu_threads overrides.
  int threads = config.zero_optimization.offload_optimizer.cpu_threads;
  if (threads == 0) {
    threads = cores_per_local_rank(comm::launcher_local_size().value_or(1));
    if (o_.offload && ctx_.on_accelerator()) threads = std::max(1, threads - 1);
  }
  pool_ = std::make_unique<optim::ThreadPool>(threads);
  if (!o_.hypers.empty()) runs_ = PartitionRuns(layout_, plan.shard_rank, o_.hypers.of_param);
  const auto& oo = config.zero_optimization.offload_optimizer;
  if (o_.nvme) {
    ZERO_CHECK(split_ == layout_.partition_numel(), "offload_optimizer.ratio applies to device \"cpu\" only");
    aio_.io_threads = config.aio.thread_count;
    aio_.block_bytes = static_cast<std::size_t>(config.aio.block_size);
    swap_path_ = (std::filesystem::path(oo.nvme_path) /
                  ("zerocpp-optimizer-rank" + std::to_string(plan.shard_rank) + ".swap")).string();
  }
  const std::size_t cap = o_.nvme ? static_cast<std::size_t>(config.zero_optimization.sub_group_size)
                                  : std::numeric_limits<std::size_t>::max();
  for (const Bucket& b : layout_.buckets()) {
    const std::size_t piece = step_piece_elements(b, cap);
    for (std::size_t off = 0; off < b.chunk;) {
      std::size_t n = std::min(piece, b.chunk - off);
      const std::size_t at = b.partition_offset + off;
      if (at < split_) {
        n = std::min(n, split_ - at);  // a piece ends at the split
      } else {
        n = b.chunk - off;  // the device share: a piece per bucket (nothing goes up piece by piece)
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
  if (swapped()) return state(State::kMaster).front();
  if (!dev_master_.defined()) return master_;
  return at::cat({master_, dev_master_.to(master_.device())});
}

at::Tensor OptimizerPartition::state_slice(State s, std::size_t offset, std::size_t n) const {
  ZERO_INTERNAL_ASSERT(s != State::kExpAvgSq || moments() == 2, opt_.type, " has no second moment");
  ZERO_INTERNAL_ASSERT(offset + n <= layout_.partition_numel(), "state_slice past the partition");
  if (!swapped()) {
    // Each share's part of the range, where the main share is.
    const std::vector<at::Tensor> shares = state(s);
    std::vector<at::Tensor> pieces;
    std::size_t at = 0;
    for (const at::Tensor& share : shares) {
      const std::size_t size = static_cast<std::size_t>(share.numel());
      const std::size_t lo = std::max(offset, at), hi = std::min(offset + n, at + size);
      if (lo < hi) pieces.push_back(share.narrow(0, i64(lo - at), i64(hi - lo)).to(shares.front().device()));
      at += size;
    }
    if (pieces.empty()) return at::empty({0}, at::TensorOptions().dtype(at::kFloat).device(shares.front().device()));
    return pieces.size() == 1 ? pieces.front().clone() : at::cat(pieces);
  }
  constexpr std::size_t kBlock = std::size_t{1} << 20;
  at::Tensor out = at::empty({i64(n)}, at::kFloat);
  const at::Tensor scratch = at::empty({i64(std::min(kBlock, swap_align_up(n * sizeof(float))) + 2 * kSwapAlignBytes)},
                                       at::kByte);
  char* buf = swap_aligned(static_cast<char*>(scratch.data_ptr()));
  const std::size_t cap = static_cast<std::size_t>(scratch.nbytes()) - kSwapAlignBytes;
  char* to = static_cast<char*>(out.data_ptr());
  std::uint64_t byte = offset * sizeof(float);
  for (std::size_t left = n * sizeof(float); left > 0;) {
    const auto [from, took] = read_state_bytes(s, byte, left, buf, cap);
    std::memcpy(to, from, took);
    to += took;
    byte += took;
    left -= took;
  }
  return out;
}

void OptimizerPartition::write_state_slice(State s, std::size_t offset, const at::Tensor& values) {
  ZERO_INTERNAL_ASSERT(s != State::kExpAvgSq || moments() == 2, opt_.type, " has no second moment");
  const std::size_t n = static_cast<std::size_t>(values.numel());
  ZERO_INTERNAL_ASSERT(offset + n <= layout_.partition_numel(), "write_state_slice past the partition");
  if (swapped()) {
    const at::Tensor host = values.to(at::kFloat).to(at::kCPU).contiguous();
    write_state_bytes(s, offset * sizeof(float), host.data_ptr(), n * sizeof(float));
    finish_state_writes();
    return;
  }
  std::size_t at = 0;
  for (const at::Tensor& share : state(s)) {
    const std::size_t size = static_cast<std::size_t>(share.numel());
    const std::size_t lo = std::max(offset, at), hi = std::min(offset + n, at + size);
    if (lo < hi) share.narrow(0, i64(lo - at), i64(hi - lo)).copy_(values.narrow(0, i64(lo - offset), i64(hi - lo)));
    at += size;
  }
}

void OptimizerPartition::release_state() {
  for (at::Tensor* t : {&master_, &exp_avg_, &exp_avg_sq_, &staging_, &dev_master_, &dev_exp_avg_, &dev_exp_avg_sq_,
                        &dev_staging_}) {
    *t = at::Tensor();
  }
}

void OptimizerPartition::seed_master(const at::Tensor& flat32) {
  allocate_master();
  for (const Bucket& b : layout_.buckets()) {
    seed_master_chunk(b, flat32.narrow(0, i64(b.offset + static_cast<std::size_t>(plan_.shard_rank) * b.chunk),
                                       i64(b.chunk)));
  }
}

void OptimizerPartition::allocate_master() {
  if (o_.nvme) {
    open_swap();
    return;
  }
  master_ = allocate(Buffer::kMaster, at::kFloat, /*zero=*/false);
  if (plan_[Buffer::kDevMaster].present) dev_master_ = allocate(Buffer::kDevMaster, at::kFloat, /*zero=*/false);
}

void OptimizerPartition::seed_master_chunk(const Bucket& b, const at::Tensor& chunk32) {
  if (swapped()) {
    // Each of the bucket's pieces into its slot, through the first buffer.
    char* buf = swap_buffer(0);
    for (const Piece& pc : pieces_) {
      if (pc.bucket->offset != b.offset) continue;  // (b may be another copy of the layout's bucket)
      const std::size_t region = swap_region_bytes(pc.n);
      std::memset(buf, 0, region);
      // (chunk32 is on the engine's device: a GPU's copies it down.)
      at::from_blob(buf, {i64(pc.n)}, at::kFloat).copy_(chunk32.narrow(0, i64(pc.offset), i64(pc.n)));
      swap_->wait(swap_->write(slots_[pc.index], buf, region));
    }
    return;
  }
  const std::size_t host = chunk_before(b, split_), dev = b.chunk - host;
  if (host > 0) master_.narrow(0, i64(b.partition_offset), i64(host)).copy_(chunk32.narrow(0, 0, i64(host)));
  if (dev > 0) {
    dev_master_.narrow(0, i64(b.partition_offset + host - split_), i64(dev)).copy_(chunk32.narrow(0, i64(host), i64(dev)));
  }
}

void OptimizerPartition::allocate_moments() {
  if (swapped()) {
    // Each piece's moment regions: zeros (Adagrad: its initial sum).
    char* buf = swap_buffer(0);
    for (const Piece& pc : pieces_) {
      const std::size_t region = swap_region_bytes(pc.n);
      std::memset(buf, 0, region * static_cast<std::size_t>(moments()));
      if (opt_.is_adagrad()) std::fill_n(reinterpret_cast<float*>(buf), pc.n, opt_.initial_accumulator_value);
      swap_->wait(swap_->write(region_at(pc, State::kExpAvg), buf, region * static_cast<std::size_t>(moments())));
    }
  } else {
    exp_avg_ = allocate(Buffer::kExpAvg, at::kFloat, /*zero=*/true);
    if (opt_.is_adagrad()) exp_avg_.fill_(opt_.initial_accumulator_value);
    if (moments() == 2) exp_avg_sq_ = allocate(Buffer::kExpAvgSq, at::kFloat, /*zero=*/true);
  }
  if (plan_[Buffer::kStaging].present) staging_ = allocate(Buffer::kStaging, o_.dtype, /*zero=*/false);
  if (plan_[Buffer::kDevExpAvg].present) {
    dev_exp_avg_ = allocate(Buffer::kDevExpAvg, at::kFloat, /*zero=*/true);
    if (opt_.is_adagrad()) dev_exp_avg_.fill_(opt_.initial_accumulator_value);
    if (moments() == 2) dev_exp_avg_sq_ = allocate(Buffer::kDevExpAvgSq, at::kFloat, /*zero=*/true);
  }
  if (plan_[Buffer::kDevStaging].present) dev_staging_ = allocate(Buffer::kDevStaging, o_.dtype, /*zero=*/false);
}

void OptimizerPartition::step(Share share, const GradsFn& grads, const HalfOutFn& half_out, float grad_scale,
                              const StepRates& rates, std::int64_t step, const PieceDoneFn& after_piece) {
  if (pieces(share).empty()) return;
  const bool dev = share == Share::kDevice;
  if (!dev && swapped()) {
    step_swapped(grads, half_out, grad_scale, rates, step, after_piece);
    return;
  }
  // Where the share's state is, indexed from the share's start.
  const std::size_t base = dev ? split_ : 0;
  float* master = (dev ? dev_master_ : master_).data_ptr<float>();
  float* m1 = (dev ? dev_exp_avg_ : exp_avg_).data_ptr<float>();
  float* m2 = moments() == 1 ? nullptr : (dev ? dev_exp_avg_sq_ : exp_avg_sq_).data_ptr<float>();
  // The device Adam where the share's state is on a GPU: the whole
  // partition without offload, the device share with it.
  const bool on_device = (device_adam_ != nullptr || device_lion_ != nullptr) && (dev || !o_.offload);
  for (const Piece& pc : pieces(share)) {
    const at::Tensor g = grads(pc);
    void* half = o_.dtype != at::kFloat ? half_out(pc, g) : nullptr;
    const std::size_t po = pc.at() - base;
    step_piece(pc, master + po, m1 + po, m2 == nullptr ? nullptr : m2 + po, g, half, grad_scale, rates, step, on_device);
    if (after_piece) after_piece(pc);
  }
}

void OptimizerPartition::step_piece(const Piece& pc, float* master, float* m1, float* m2, const at::Tensor& g,
                                    void* half, float grad_scale, const StepRates& rates, std::int64_t step,
                                    bool on_device) {
  // One kernel call per run of equal settings (one for the whole piece
  // unless EngineOptions' rules give parameters settings of their own).
  const std::size_t grad_bytes = g.element_size(), half_bytes = c10::elementSize(o_.dtype);
  auto run = [&](std::size_t k, std::size_t n, float weight_decay, float run_lr, optim::ThreadPool* pool) {
    const void* grads = static_cast<const char*>(g.data_ptr()) + k * grad_bytes;
    void* half_k = half == nullptr ? nullptr : static_cast<char*>(half) + k * half_bytes;
    step_run(master + k, m1 + k, m2 == nullptr ? nullptr : m2 + k, grads, to_dtype(g.scalar_type()), half_k, n,
             weight_decay, grad_scale, StepRates{run_lr, rates.beta1, rates.beta2}, step, on_device, pool);
  };
  if (runs_.empty()) {
    run(0, pc.n, opt_.weight_decay, rates.lr, pool_.get());
    return;
  }
  auto muon = [&](const PartitionRun& r) { return o_.hypers.classes[static_cast<std::size_t>(r.value)].muon != 0; };
  // Muon's two halves step at their own share of the rate.
  auto half_lr = [&](const PartitionRun& r) {
    return !opt_.is_muon() ? 1.0f : muon(r) ? o_.muon_lr_scale : o_.adam_lr_scale;
  };
  auto run_part = [&](const PartitionRun& r, optim::ThreadPool* pool) {
    const ParamHyper& h = o_.hypers.classes[static_cast<std::size_t>(r.value)];
    const std::size_t k = r.begin - pc.at();
    const float lr = rates.lr * h.lr_scale * half_lr(r);
    if (muon(r)) {
      void* half_k = half == nullptr ? nullptr : static_cast<char*>(half) + k * c10::elementSize(o_.dtype);
      apply_muon(master + k, m2 + k, half_k, r.end - r.begin, h.weight_decay, lr, on_device);
      return;
    }
    run(k, r.end - r.begin, h.weight_decay, lr, pool);
  };
  const std::vector<PartitionRun> runs = runs_.within(pc.at(), pc.n);
  if (on_device || runs.size() == 1) {
    for (const PartitionRun& r : runs) run_part(r, pool_.get());
    return;
  }
  // On the CPU, one dispatch of the pool for the whole piece, each tile
  // stepping the parts of the runs it holds: a run per dispatch would step
  // every short run (a bias, a norm) on one thread, one after another.
  // (Muon's runs after it, each whole: LibTorch spreads them.)
  pool_->parallel_for(pc.n, optim::kTileElements, [&](std::size_t begin, std::size_t end) {
    for (const PartitionRun& r : runs_.within(pc.at() + begin, end - begin)) {
      if (!muon(r)) run_part(r, nullptr);
    }
  });
  for (const PartitionRun& r : runs) {
    if (muon(r)) run_part(r, nullptr);
  }
}

void OptimizerPartition::apply_muon(float* master, const float* update, void* half, std::size_t n,
                                    float weight_decay, float lr, bool on_device) const {
  const auto where = at::TensorOptions().device(on_device ? ctx_.device : c10::Device(c10::kCPU));
  const auto count = static_cast<std::int64_t>(n);
  at::Tensor p = at::from_blob(master, {count}, where.dtype(at::kFloat));
  const at::Tensor u = at::from_blob(const_cast<float*>(update), {count}, where.dtype(at::kFloat));
  p.mul_(1.0f - lr * weight_decay).sub_(u, lr);
  if (half != nullptr) at::from_blob(half, {count}, where.dtype(o_.dtype)).copy_(p);
}

void OptimizerPartition::step_run(float* master, float* m1, float* m2, const void* grads, DType grad_dtype,
                                  void* half, std::size_t n, float weight_decay, float grad_scale,
                                  const StepRates& rates,
                                  std::int64_t step, bool on_device, optim::ThreadPool* pool) {
  if (opt_.is_lion()) {
    optim::LionHyper h;
    h.lr = rates.lr;
    h.beta1 = rates.beta1;
    h.beta2 = rates.beta2;
    h.weight_decay = weight_decay;
    optim::LionBuffers buf{master, grads, grad_dtype, m1, n, grad_scale, half, to_dtype(o_.dtype)};
    if (on_device) {
      const c10::DeviceGuard on_device_guard(ctx_.device);
      device_lion_(h, buf, ctx_.native_stream());
    } else {
      optim::lion_step(h, buf, pool);
    }
    return;
  }
  if (opt_.is_adagrad()) {
    optim::AdagradHyper h;
    h.lr = rates.lr;
    h.eps = opt_.eps;
    h.weight_decay = weight_decay;
    h.step = step;
    optim::AdagradBuffers buf{master, grads, grad_dtype, m1, n, grad_scale, half, to_dtype(o_.dtype)};
    optim::adagrad_step(h, buf, pool);
    return;
  }
  optim::AdamHyper h;
  h.lr = rates.lr;
  h.beta1 = rates.beta1;
  h.beta2 = rates.beta2;
  h.eps = opt_.eps;
  h.weight_decay = weight_decay;
  h.decoupled_weight_decay = opt_.decoupled_weight_decay();
  h.bias_correction = opt_.bias_correction;
  h.step = step;
  optim::AdamBuffers buf;
  buf.params = master;
  buf.grads = grads;
  buf.grad_dtype = grad_dtype;
  buf.exp_avg = m1;
  buf.exp_avg_sq = m2;
  buf.n = n;
  buf.grad_scale = grad_scale;
  buf.half_out = half;
  buf.half_dtype = to_dtype(o_.dtype);
  if (on_device) {
    const c10::DeviceGuard on_device_guard(ctx_.device);
    device_adam_(h, buf, ctx_.native_stream());
  } else {
    optim::adam_step(h, buf, pool);
  }
}

// ---- NVMe ----------------------------------------------------------------

void OptimizerPartition::open_swap() {
  if (swap_) return;
  // Each main piece's slot: its master, then its moments, each a region
  // rounded up to 4096 bytes (the plan's kMaster/kExpAvg/kExpAvgSq sizes).
  std::size_t bytes = 0, largest = 0;
  slots_.clear();
  for (const Piece& pc : pieces_) {
    slots_.push_back(bytes);
    const std::size_t region = swap_region_bytes(pc.n);
    largest = std::max(largest, region);
    bytes += region * static_cast<std::size_t>(1 + moments());
  }
  swap_buffer_bytes_ = largest * static_cast<std::size_t>(1 + moments()) + kSwapAlignBytes;
  const PlannedBuffer& planned = plan_[Buffer::kSwapBuffers];
  ZERO_INTERNAL_ASSERT(planned.present && planned.bytes() % static_cast<std::int64_t>(swap_buffer_bytes_) == 0,
                       "the plan's NVMe swap buffers (", planned.bytes(), " bytes) are not whole buffers of ",
                       swap_buffer_bytes_);
  swap_buffer_count_ = static_cast<std::size_t>(planned.bytes()) / swap_buffer_bytes_;
  swap_buffers_ = allocate(Buffer::kSwapBuffers, at::kByte, /*zero=*/true);
  swap_ = std::make_unique<offload::SwapFile>(swap_path_, bytes, aio_);
  // The file, as the plan has it: each state's regions (valid and padding).
  for (Buffer id : {Buffer::kMaster, Buffer::kExpAvg, Buffer::kExpAvgSq}) {
    const PlannedBuffer& b = plan_[id];
    if (!b.present) continue;
    regs_.push_back(ledger_.add(b.tier, b.kind, b.valid_bytes(), b.what));
    regs_.push_back(ledger_.add(b.tier, memory::Kind::kPadding, b.bytes() - b.valid_bytes(), b.what));
  }
}

std::size_t OptimizerPartition::region_at(const Piece& pc, State s) const {
  return slots_[pc.index] + swap_region_bytes(pc.n) * static_cast<std::size_t>(s);
}

char* OptimizerPartition::swap_buffer(std::size_t k) const {
  return swap_aligned(static_cast<char*>(swap_buffers_.data_ptr()) + k * swap_buffer_bytes_);
}

// Piece i is stepped in buffer i % K. Reads run K - 1 pieces ahead: the read
// of piece i + K - 1 goes into the buffer piece i - 1 was stepped in, once
// that piece's write is done. The last writes are waited for before the
// step returns, so that the file holds the finished step (one that fails
// part-way leaves pieces of both; the engine then refuses to train on).
void OptimizerPartition::step_swapped(const GradsFn& grads, const HalfOutFn& half_out, float grad_scale,
                                      const StepRates& rates, std::int64_t step, const PieceDoneFn& after_piece) {
  const std::size_t count = pieces_.size(), k = swap_buffer_count_;
  std::vector<offload::SwapFile::Ticket> reads(count, 0), writes(count, 0);
  auto slot_bytes = [&](const Piece& pc) { return swap_region_bytes(pc.n) * static_cast<std::size_t>(1 + moments()); };
  auto read = [&](std::size_t i) {
    reads[i] = swap_->read(slots_[i], swap_buffer(i % k), slot_bytes(pieces_[i]));
  };
  try {
    for (std::size_t i = 0; i + 1 < k && i < count; ++i) read(i);
    for (std::size_t i = 0; i < count; ++i) {
      const Piece& pc = pieces_[i];
      const std::size_t ahead = i + k - 1;
      if (ahead < count) {
        if (i >= 1) {
          swap_->wait(writes[i - 1]);
          writes[i - 1] = 0;
        }
        read(ahead);
      }
      swap_->wait(reads[i]);
      reads[i] = 0;
      char* buf = swap_buffer(i % k);
      const std::size_t region = swap_region_bytes(pc.n);
      auto* master = reinterpret_cast<float*>(buf);
      auto* m1 = reinterpret_cast<float*>(buf + region);
      auto* m2 = moments() == 1 ? nullptr : reinterpret_cast<float*>(buf + 2 * region);
      const at::Tensor g = grads(pc);
      void* half = o_.dtype != at::kFloat ? half_out(pc, g) : nullptr;
      step_piece(pc, master, m1, m2, g, half, grad_scale, rates, step, /*on_device=*/false);
      if (o_.dtype == at::kFloat) {  // fp32 publishes from the staging copy
        std::memcpy(staging_.data_ptr<float>() + pc.at(), master, pc.n * sizeof(float));
      }
      writes[i] = swap_->write(slots_[i], buf, slot_bytes(pc));
      if (after_piece) after_piece(pc);
    }
    for (std::size_t i = 0; i < count; ++i) {
      if (writes[i] != 0) swap_->wait(writes[i]);
      writes[i] = 0;
    }
  } catch (...) {
    // No request may still write into (or read from) the buffers.
    try {
      swap_->wait_all();
    } catch (...) {
    }
    throw;
  }
}

std::vector<at::Tensor> OptimizerPartition::state(State s) const {
  const at::Tensor& main = s == State::kMaster ? master_ : s == State::kExpAvg ? exp_avg_ : exp_avg_sq_;
  const at::Tensor& dev = s == State::kMaster ? dev_master_ : s == State::kExpAvg ? dev_exp_avg_ : dev_exp_avg_sq_;
  if (!swapped()) return parts(main, dev);
  ZERO_INTERNAL_ASSERT(s != State::kExpAvgSq || moments() == 2, opt_.type, " has no second moment");
  at::Tensor out = at::empty({i64(layout_.partition_numel())}, at::kFloat);
  char* buf = swap_buffer(0);
  for (const Piece& pc : pieces_) {
    const std::size_t region = swap_region_bytes(pc.n);
    swap_->wait(swap_->read(region_at(pc, s), buf, region));
    std::memcpy(out.data_ptr<float>() + pc.at(), buf, pc.n * sizeof(float));
  }
  return {out};
}

const OptimizerPartition::Piece& OptimizerPartition::piece_holding(std::size_t element) const {
  // (The main pieces are in partition order, one after another.)
  const auto next = std::upper_bound(pieces_.begin(), pieces_.end(), element,
                                     [](std::size_t e, const Piece& pc) { return e < pc.at(); });
  ZERO_INTERNAL_ASSERT(next != pieces_.begin() && element < std::prev(next)->at() + std::prev(next)->n,
                       "no piece of the partition holds element ", element);
  return *std::prev(next);
}

OptimizerPartition::StateRun OptimizerPartition::state_run(State s, std::uint64_t offset, std::size_t n) const {
  const Piece& pc = piece_holding(static_cast<std::size_t>(offset / sizeof(float)));
  const std::size_t in_piece = static_cast<std::size_t>(offset) - pc.at() * sizeof(float);
  return {region_at(pc, s) + in_piece, std::min(n, pc.n * sizeof(float) - in_piece)};
}

std::pair<const char*, std::size_t> OptimizerPartition::read_state_bytes(State s, std::uint64_t offset,
                                                                        std::size_t n, char* buf,
                                                                        std::size_t cap) const {
  ZERO_INTERNAL_ASSERT(swapped() && (s != State::kExpAvgSq || moments() == 2), "no such state in the swap file");
  ZERO_INTERNAL_ASSERT(offset + n <= layout_.partition_numel() * sizeof(float), "read_state_bytes past the partition");
  // (The region is rounded up to 4096 bytes: the aligned read stays inside it.)
  const StateRun run = state_run(s, offset, n);
  return offload::read_span(*swap_, run.pos, run.n, buf, cap);
}

void OptimizerPartition::write_state_bytes(State s, std::uint64_t offset, const void* src, std::size_t n) {
  ZERO_INTERNAL_ASSERT(swapped() && (s != State::kExpAvgSq || moments() == 2), "no such state in the swap file");
  ZERO_INTERNAL_ASSERT(offset + n <= layout_.partition_numel() * sizeof(float), "write_state_bytes past the partition");
  if (s == State::kMaster && o_.dtype == at::kFloat) {
    std::memcpy(static_cast<char*>(staging_.data_ptr()) + offset, src, n);
  }
  if (!stream_writer_) {
    stream_writer_ = std::make_unique<offload::SwapStreamWriter>(
        *swap_, std::array<char*, 2>{swap_buffer(0), swap_buffer_count_ > 1 ? swap_buffer(1) : nullptr},
        swap_buffer_bytes_ - kSwapAlignBytes);
  }
  const char* from = static_cast<const char*>(src);
  while (n > 0) {
    const StateRun run = state_run(s, offset, n);
    const std::size_t took = stream_writer_->write(run.pos, from, run.n);
    from += took;
    offset += took;
    n -= took;
  }
}

void OptimizerPartition::finish_state_writes() {
  if (stream_writer_) stream_writer_->finish();
}

}  // namespace zero::detail
