#include "zero/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>
#include <thread>
#include <unordered_set>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "zero/core/error.h"
#include "zero/core/pinned_host_allocator.h"
#include "zero/offload/background_worker.h"
#include "zero/optim/cpu_adam.h"
#include "zero/optim/device_adam_registry.h"
#include "zero/zero/flat_layout.h"
#include "zero/zero/grad_reducer.h"
#include "zero/zero/torch_dtype.h"

#include "module_guard.h"

namespace zero {

using memory::Kind;
using memory::Tier;

namespace {

// Partitions are padded so that every rank's chunk starts on a 64-byte line.
constexpr std::size_t kAlignElements = 32;

std::int64_t i64(std::size_t n) { return static_cast<std::int64_t>(n); }

}  // namespace

struct Engine::Impl {
  Engine& e;
  std::shared_ptr<torch::nn::Module> module;
  std::vector<at::Tensor> params;  // trainable, unique, in the module's order
  FlatLayout layout;
  int world = 1, rank = 0, shard_rank = 0;
  int stage = 0;
  bool offload = false, dpu = false;
  int dpu_warmup = 0;
  bool adagrad = false;
  // Where the module lives, and with it the flat parameter and gradient
  // buffers and every collective's buffer. On an accelerator the optimizer
  // partition is there too (the registered device Adam steps it) unless it is
  // offloaded, and the host buffers of offload are pinned.
  at::Device device{at::kCPU};
  bool on_accelerator = false;
  optim::DeviceAdamFn device_adam = nullptr;

  // ZeRO-Offload on a GPU (offload && on_accelerator). Each reduced chunk of
  // the micro-batch that ends the accumulation window goes to pinned host
  // memory on a copy stream while backward goes on: in the training
  // precision (2 bytes per parameter in bf16/fp16), or, when
  // gradient_accumulation_steps > 1, as the window's fp32 sum, which the
  // earlier micro-batches built on the device (dev_accum). The host
  // gradients are therefore never summed on the CPU, and their norm is taken
  // on the device as the chunks pass (bucket_norms). The updated parameters go up on the copy
  // stream too. Events order it all; the host waits only where the CPU reads
  // what a copy wrote (d2h_done, before the CPU Adam) or writes what a copy
  // still reads (h2d_done, before the CPU Adam rewrites the staging buffer).
  bool gpu_offload = false;
  std::optional<c10::Stream> copy_stream;
  at::Tensor dev_accum;
  std::vector<at::Tensor> bucket_norms;  // fp32 scalars on the device, one per bucket of the window
  bool boundary_backward = false;        // the backward now running ends the accumulation window
  bool window_first = true;              // ...and it is the window's first (dev_accum is overwritten)
  std::array<std::shared_ptr<c10::Event>, 2> d2h_done;
  std::shared_ptr<c10::Event> h2d_done;
  // bf16/fp16 without accumulation: the CPU Adam writes the updated
  // parameters over the gradients they came from (adam.h allows it), and
  // that buffer goes up: one host buffer per step for both directions
  // (16 bytes per parameter with DPU), and no wait for the last upload
  // before the next CPU step (the copy stream orders the upload before the
  // next download into the same buffer).
  bool update_in_grads = false;
  int update_index = 0;  // the host_grads buffer that holds the update to apply

  // n elements of `dtype` in host memory: pinned, of exactly that size, when
  // the module is on a GPU (see zero/core/pinned_host_allocator.h).
  at::Tensor host_tensor(std::size_t n, c10::ScalarType dtype) const {
    const auto opts = at::TensorOptions().dtype(dtype);
    if (!on_accelerator) return at::empty({i64(n)}, opts);
    if (const PinnedHostAllocator* a = pinned_host_allocator()) {
      void* ptr = a->allocate(n * c10::elementSize(dtype));
      auto release = a->release;
      return at::from_blob(ptr, {i64(n)}, [release](void* q) { release(q); }, opts);
    }
    return at::empty({i64(n)}, opts.pinned_memory(true));
  }

  c10::Stream compute_stream() const {
    return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
  }
  std::shared_ptr<c10::Event> record_on(const c10::Stream& stream) const {
    auto ev = std::make_shared<c10::Event>(device.type());
    ev->record(stream);
    return ev;
  }
  c10::ScalarType dtype = c10::ScalarType::Float;
  LossScaler scaler;

  at::Tensor flat_params;                // device, training precision, layout.padded_numel()
  at::Tensor full_grads;                 // stage 0/1 without offload: device, like flat_params
  at::Tensor part_grads;                 // stage 2 without offload: device, training precision
  std::array<at::Tensor, 2> host_grads;  // offload: host fp32 partition (two with DPU)
  int host_cur = 0;
  at::Tensor master, exp_avg, exp_avg_sq;  // the rank's partition, fp32
  at::Tensor staging;                      // offload, half precision: CPU Adam's copy-out
  std::vector<memory::MemoryLedger::Registration> regs;

  std::unique_ptr<GradReducer> reducer;
  std::unique_ptr<optim::ThreadPool> pool;
  std::unique_ptr<offload::BackgroundWorker> worker;
  bool update_pending = false;
  std::int64_t micro_step = 0;
  std::int64_t optimizer_step = 0;  // the optimizer's own step count (bias correction)
  comm::CommStats comm_at_step_start;

  std::uint64_t offload_bytes = 0;  // D2H + H2D copies since the last step
  // A delayed update that failed: the master weights may be half written,
  // so every later step(), flush() and gather rethrows it (it sticks).
  std::exception_ptr update_error;

  // Drops the gradients of the current accumulation window (after a backward
  // that threw): the buffers are zeroed and the window restarts.
  void discard_window() {
    bucket_norms.clear();
    window_first = true;
    if (full_grads.defined()) full_grads.zero_();
    if (part_grads.defined()) part_grads.zero_();
    if (host_grads[host_cur].defined() && !gpu_offload) host_grads[host_cur].zero_();
    for (auto& p : params) p.mutable_grad().reset();
    micro_step -= micro_step % e.config_.gradient_accumulation_steps;
  }

  // Waits for the pending delayed update (if any; at once when there is
  // none). Its error sticks: a failed update is rethrown by every call.
  void wait_for_update() {
    if (update_error) std::rethrow_exception(update_error);
    if (!worker) return;
    try {
      worker->wait();
    } catch (...) {
      update_error = std::current_exception();
      update_pending = false;
      throw;
    }
  }

  // Declared last, so destroyed first: the hooks go before what they call,
  // and the module gets its own tensors back while the flat buffer is alive.
  detail::ModuleGuard guard;

  explicit Impl(Engine& engine) : e(engine) {}

  // Fires once per backward for each parameter, after autograd has
  // accumulated its gradient (also for a parameter used twice).
  struct GradHook : torch::autograd::PostAccumulateGradHook {
    GradHook(Impl* impl, int index) : impl_(impl), index_(index) {}
    void operator()(const at::Tensor& p) override { impl_->on_grad(index_, p); }
    Impl* impl_;
    int index_;
  };

  // Registers an allocated buffer by what was allocated: the tensor's own
  // nbytes(), of which `valid` elements are `kind` and the rest padding. A
  // buffer allocated at the wrong size therefore shows in the ledger (and in
  // every figure built on it), instead of the ledger repeating the sizes the
  // allocation was meant to have.
  void register_tensor(Tier tier, Kind kind, const at::Tensor& t, std::size_t valid, const char* what) {
    const std::int64_t total = i64(t.nbytes());
    const std::int64_t used = std::min(total, i64(valid * t.element_size()));
    regs.push_back(e.ledger_.add(tier, kind, used, what));
    regs.push_back(e.ledger_.add(tier, Kind::kPadding, total - used, what));
  }

  std::size_t chunk_flat_offset(const Bucket& b) const {
    return b.offset + static_cast<std::size_t>(shard_rank) * b.chunk;
  }

  void on_grad(int index, const at::Tensor& p) {
    reducer->on_grad(index, p.grad());
    // The gradient now lives in its bucket; release the tensor at once.
    p.mutable_grad().reset();
  }

  // Accumulates this rank's reduced chunk of bucket b into the partition.
  void consume_chunk(int b, const at::Tensor& chunk) {
    const Bucket& bucket = layout.buckets()[static_cast<std::size_t>(b)];
    if (gpu_offload) return consume_chunk_gpu_offload(bucket, chunk);
    if (offload) {
      // D2H in the training precision (docs/design.md's 2 Psi/N bytes for bf16);
      // the host widens to fp32 as it accumulates.
      const at::Tensor src = chunk.is_cpu() ? chunk : chunk.to(at::kCPU);
      host_grads[host_cur].narrow(0, i64(bucket.partition_offset), i64(bucket.chunk)).add_(src);
      offload_bytes += src.nbytes();  // D2H
    } else {
      part_grads.narrow(0, i64(bucket.partition_offset), i64(bucket.chunk)).add_(chunk);
    }
  }

  void consume_chunk_gpu_offload(const Bucket& bucket, const at::Tensor& chunk) {
    const std::int64_t off = i64(bucket.partition_offset), n = i64(bucket.chunk);
    at::Tensor g = chunk;
    if (dev_accum.defined()) {
      at::Tensor acc = dev_accum.narrow(0, off, n);
      if (window_first) {
        acc.copy_(chunk);
      } else {
        acc.add_(chunk);
      }
      if (!boundary_backward) return;
      g = acc;
    }
    bucket_norms.push_back(at::linalg_vector_norm(g, 2, c10::nullopt, false, at::kFloat));
    // Down on the copy stream, after the compute stream has produced g.
    const c10::Stream compute = compute_stream();
    record_on(compute)->block(*copy_stream);
    {
      const c10::StreamGuard on_copy(*copy_stream);
      host_grads[host_cur].narrow(0, off, n).copy_(g, /*non_blocking=*/true);
    }
    // The reducer frees its bucket when this returns: the allocator must not
    // hand the memory out again before the copy stream has read it.
    if (!dev_accum.defined()) g.record_stream(*copy_stream);
    offload_bytes += g.nbytes();  // D2H
  }

  // The gradient of this rank's chunk of bucket b, as the optimizer reads it.
  at::Tensor grad_chunk(const Bucket& b, int host_index) const {
    if (offload) return host_grads[host_index].narrow(0, i64(b.partition_offset), i64(b.chunk));
    if (full_grads.defined()) return full_grads.narrow(0, i64(chunk_flat_offset(b)), i64(b.chunk));
    return part_grads.narrow(0, i64(b.partition_offset), i64(b.chunk));
  }

  void zero_grads(int host_index) {
    bucket_norms.clear();
    window_first = true;
    // On a GPU the host gradients are overwritten by each window's copies.
    if (offload && !gpu_offload) host_grads[host_index].zero_();
    if (full_grads.defined()) full_grads.zero_();
    if (part_grads.defined()) part_grads.zero_();
  }

  // Squared L2 norm of this rank's (summed, still scaled) gradient partition,
  // a one-element fp64 tensor where the gradients are (so that on a GPU it
  // is computed without a host read); inf or NaN when any element is not
  // finite. Each bucket's norm is fp32, their squares are summed in fp64.
  at::Tensor local_grad_sq_norm(int host_index) const {
    std::vector<at::Tensor> norms;
    norms.reserve(layout.buckets().size());
    for (const Bucket& b : layout.buckets()) {
      norms.push_back(at::linalg_vector_norm(grad_chunk(b, host_index), 2, c10::nullopt, false, at::kFloat));
    }
    return at::stack(norms).to(at::kDouble).square().sum();
  }

  // The stream the module's work runs on (a cudaStream_t as void* on CUDA):
  // the device Adam is enqueued there, after the gradients it reads.
  void* current_stream() const {
    return c10::impl::getDeviceGuardImpl(device.type())->getStream(device).native_handle();
  }

  // The optimizer on this rank's partition; runs on the main thread or on
  // the DPU worker. No collectives in here.
  void run_optimizer(int host_index, float grad_scale, float lr, std::int64_t step) {
    const config::OptimizerConfig& o = e.config_.optimizer;
    if (gpu_offload) {
      // The CPU reads the gradients the copy stream brought down, and
      // rewrites the staging (or, in fp32, master) memory that the last
      // upload read from.
      if (d2h_done[host_index]) d2h_done[host_index]->synchronize();
      if (h2d_done && !update_in_grads) h2d_done->synchronize();
    }
    for (const Bucket& b : layout.buckets()) {
      at::Tensor g = grad_chunk(b, host_index);
      const std::size_t po = b.partition_offset;
      void* half_out = nullptr;
      if (dtype != at::kFloat) {
        half_out = update_in_grads ? g.data_ptr()
                   : offload       ? static_cast<char*>(staging.data_ptr()) + po * staging.element_size()
                                   : static_cast<char*>(flat_params.data_ptr()) +
                                         chunk_flat_offset(b) * flat_params.element_size();
      }
      float* p = master.data_ptr<float>() + po;
      if (adagrad) {
        optim::AdagradHyper h;
        h.lr = lr;
        h.eps = o.eps;
        h.weight_decay = o.weight_decay;
        h.step = step;
        optim::AdagradBuffers buf{p, g.data_ptr(), to_dtype(g.scalar_type()),
                                  exp_avg.data_ptr<float>() + po, b.chunk, grad_scale, half_out,
                                  to_dtype(dtype)};
        optim::adagrad_step(h, buf, pool.get());
      } else {
        optim::AdamHyper h;
        h.lr = lr;
        h.beta1 = o.beta1;
        h.beta2 = o.beta2;
        h.eps = o.eps;
        h.weight_decay = o.weight_decay;
        h.decoupled_weight_decay = o.decoupled_weight_decay();
        h.step = step;
        optim::AdamBuffers buf;
        buf.params = p;
        buf.grads = g.data_ptr();
        buf.grad_dtype = to_dtype(g.scalar_type());
        buf.exp_avg = exp_avg.data_ptr<float>() + po;
        buf.exp_avg_sq = exp_avg_sq.data_ptr<float>() + po;
        buf.n = b.chunk;
        buf.grad_scale = grad_scale;
        buf.half_out = half_out;
        buf.half_dtype = to_dtype(dtype);
        if (on_accelerator && !offload) {
          const c10::DeviceGuard on_device(device);
          device_adam(h, buf, current_stream());
        } else {
          optim::adam_step(h, buf, pool.get());
        }
      }
    }
  }

  // Brings the updated partition to the model: offload copies the half
  // partition host -> device, then the chunks are all-gathered (stage >= 1).
  void apply_update() {
    if (gpu_offload) {
      // Up on the copy stream; the compute stream (the next forward, the
      // all-gather) waits on the device, not the host.
      const c10::Stream compute = compute_stream();
      record_on(compute)->block(*copy_stream);
      {
        const c10::StreamGuard on_copy(*copy_stream);
        for (const Bucket& b : layout.buckets()) {
          at::Tensor dst = flat_params.narrow(0, i64(chunk_flat_offset(b)), i64(b.chunk));
          const at::Tensor& src = update_in_grads ? host_grads[update_index] : dtype == at::kFloat ? master : staging;
          dst.copy_(src.narrow(0, i64(b.partition_offset), i64(b.chunk)), /*non_blocking=*/true);
          offload_bytes += b.chunk * flat_params.element_size();  // H2D
        }
      }
      h2d_done = record_on(*copy_stream);
      h2d_done->block(compute);
      all_gather_params();
      return;
    }
    for (const Bucket& b : layout.buckets()) {
      at::Tensor dst = flat_params.narrow(0, i64(chunk_flat_offset(b)), i64(b.chunk));
      if (dtype == at::kFloat) {
        dst.copy_(master.narrow(0, i64(b.partition_offset), i64(b.chunk)));
      } else if (offload) {
        dst.copy_(staging.narrow(0, i64(b.partition_offset), i64(b.chunk)));
      }
      if (offload) offload_bytes += b.chunk * flat_params.element_size();  // H2D
    }
    all_gather_params();
  }

  // Stage >= 1: every rank's updated chunks to every rank.
  void all_gather_params() {
    if (layout.shard_world() > 1) {
      std::vector<comm::WorkPtr> works;
      for (const Bucket& b : layout.buckets()) {
        auto* base = static_cast<char*>(flat_params.data_ptr()) + b.offset * flat_params.element_size();
        auto* mine = base + static_cast<std::size_t>(rank) * b.chunk * flat_params.element_size();
        works.push_back(e.comm_.all_gather(mine, base, b.chunk, to_dtype(dtype)));
      }
      for (auto& w : works) w->wait();
    }
  }
};

Engine::Engine(std::shared_ptr<torch::nn::Module> module, config::Config config,
               comm::Communicator& comm)
    : config_(std::move(config)), comm_(comm), impl_(std::make_unique<Impl>(*this)) {
  Impl& m = *impl_;
  ZERO_CHECK(module != nullptr, "zero::Engine needs a module, got a null pointer");
  m.module = std::move(module);
  m.world = comm_.world_size();
  m.rank = comm_.rank();
  const auto& z = config_.zero_optimization;
  m.stage = z.stage;
  ZERO_CHECK(m.stage <= 2, "zero_optimization.stage=", m.stage,
             " is not available in this build of the engine: use stage 0, 1 or 2");
  m.offload = z.offload_optimizer.device == "cpu";
  ZERO_CHECK(z.offload_optimizer.device != "nvme",
             "offload_optimizer.device=\"nvme\" is not available yet: use \"cpu\" or \"none\"");
  ZERO_CHECK(!m.offload || m.stage >= 1,
             "offload_optimizer.device=\"cpu\" needs zero_optimization.stage 1 or 2 (ZeRO-Offload "
             "offloads the rank's optimizer partition)");
  m.dpu = m.offload && z.offload_optimizer.delayed_param_update;
  m.dpu_warmup = z.offload_optimizer.delayed_param_update_warmup_steps;
  m.adagrad = config_.optimizer.is_adagrad();
  m.dtype = config_.bf16.enabled   ? at::kBFloat16
            : config_.fp16.enabled ? at::kHalf
                                   : at::kFloat;
  LossScalerOptions so;
  if (config_.fp16.enabled) {
    so.dynamic = config_.fp16.loss_scale == 0.0f;
    so.static_scale = so.dynamic ? 1.0f : config_.fp16.loss_scale;
    so.initial_scale_power = config_.fp16.initial_scale_power;
    so.loss_scale_window = config_.fp16.loss_scale_window;
    so.hysteresis = config_.fp16.hysteresis;
    so.min_loss_scale = config_.fp16.min_loss_scale;
  }
  m.scaler = LossScaler(so);
  lr_ = config_.optimizer.lr;
  ledger_.set_device_limit(config_.device_memory_limit);

  // Trainable parameters, each once (tied weights appear twice in the module).
  std::unordered_set<const void*> seen;
  std::int64_t frozen = 0;
  for (const at::Tensor& p : m.module->parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) {
      ++frozen;
      continue;
    }
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    ZERO_CHECK(p.scalar_type() == at::kFloat, "parameter ", m.params.size(), " is ",
               c10::toString(p.scalar_type()),
               ": give zero::Engine an fp32 module; it makes the bf16/fp16 copy itself");
    m.params.push_back(p);
  }
  ZERO_CHECK(!m.params.empty(), "the module has no trainable parameters (", frozen,
             " frozen): nothing to train. Check requires_grad on its parameters.");
  const at::Device device = m.params.front().device();
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    ZERO_CHECK(m.params[i].device() == device, "parameter ", i, " is on ", m.params[i].device().str(),
               " but parameter 0 is on ", device.str(),
               ": zero::Engine trains a module on one device. Move it there first (module->to(device)).");
  }
  m.device = device;
  m.on_accelerator = !device.is_cpu();
  m.gpu_offload = m.offload && m.on_accelerator;
  const std::string backend = comm_.backend_name();
  if (m.on_accelerator) {
    // Refuse before allocating anything. Every collective runs on the flat
    // buffers, which live where the module is.
    ZERO_CHECK(device.is_cuda(), "the module is on ", device.str(),
               ": zero::Engine trains on the CPU or on a CUDA GPU. Move it to one of them.");
    ZERO_CHECK(backend == "nccl" || (backend == "single" && m.world == 1), "the module is on ",
               device.str(), " but the communicator is '", backend,
               "', whose collectives work on host memory: give the engine an NCCL communicator "
               "(zero::cuda::make_nccl_communicator(bootstrap, local_rank), as zero-train --device cuda "
               "does), or for one process the single-process one.");
    m.device_adam = optim::device_adam();
    ZERO_CHECK(m.offload || m.device_adam != nullptr, "the module is on ", device.str(),
               " but no device Adam is linked into this program: link zero_cuda (the zerocpp "
               "target does), or offload the optimizer (offload_optimizer.device=\"cpu\").");
    ZERO_CHECK(m.offload || !m.adagrad, "optimizer ", config_.optimizer.type, " has no kernel on ",
               device.str(), ": use Adam/AdamW there, or offload the optimizer to the CPU "
               "(offload_optimizer.device=\"cpu\"), where Adagrad runs.");
  } else {
    ZERO_CHECK(backend != "nccl", "the communicator is NCCL but the module is on the CPU: move the "
               "module to its GPU (module->to(torch::Device(torch::kCUDA, local_rank))), or use the "
               "MPI or single-process communicator (zero::comm::make_communicator()).");
  }

  std::vector<std::size_t> numels;
  for (const auto& p : m.params) numels.push_back(static_cast<std::size_t>(p.numel()));
  const int shard_world = m.stage == 0 ? 1 : m.world;
  m.shard_rank = m.stage == 0 ? 0 : m.rank;
  ZERO_CHECK(z.reduce_bucket_size > 0, "zero_optimization.reduce_bucket_size must be positive");
  m.layout = FlatLayout(numels, static_cast<std::size_t>(z.reduce_bucket_size), m.world,
                        shard_world, kAlignElements);
  const FlatLayout& L = m.layout;
  const std::size_t psi = L.numel(), padded = L.padded_numel();
  const std::size_t part = L.partition_numel(), part_valid = L.partition_valid(m.shard_rank);
  const Tier opt_tier = m.offload ? Tier::kHost : Tier::kDevice;

  at::NoGradGuard no_grad;
  // fp32 copy of all parameters, identical on every rank (rank 0's values).
  // In fp32 training it becomes the flat parameter buffer; otherwise it is a
  // temporary, counted in the device ledger while it lives (so that
  // device_memory_limit sees the real construction peak) and freed before
  // the moments are allocated.
  memory::MemoryLedger::Registration flat32_reg;
  at::Tensor flat32 = at::zeros({i64(padded)}, at::TensorOptions().dtype(at::kFloat).device(device));
  if (m.dtype == at::kFloat) {
    m.register_tensor(Tier::kDevice, Kind::kHalfParams, flat32, psi, "the flat parameter buffer");
  } else {
    flat32_reg = ledger_.add(Tier::kDevice, Kind::kStaging, i64(flat32.nbytes()),
                             "the temporary fp32 copy of the parameters (construction only)");
  }
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const ParamSlot& s = L.params()[i];
    flat32.narrow(0, i64(s.offset), i64(s.numel)).copy_(m.params[i].reshape({-1}));
  }
  if (m.world > 1) comm_.broadcast(flat32.data_ptr(), padded, DType::kFloat32)->wait();

  // fp32 master partition.
  const at::Device opt_device = m.offload ? at::Device(at::kCPU) : device;
  auto opt32 = at::TensorOptions().dtype(at::kFloat).device(opt_device);
  m.master = m.offload ? m.host_tensor(part, at::kFloat) : at::empty({i64(part)}, opt32);
  m.register_tensor(opt_tier, Kind::kFp32Master, m.master, part_valid, "fp32 master weights");
  for (const Bucket& b : L.buckets()) {
    m.master.narrow(0, i64(b.partition_offset), i64(b.chunk))
        .copy_(flat32.narrow(0, i64(m.chunk_flat_offset(b)), i64(b.chunk)));
  }

  // The model's parameters: views into one flat buffer in the training precision.
  m.flat_params = m.dtype == at::kFloat ? flat32 : flat32.to(m.dtype);
  if (m.dtype != at::kFloat) {
    m.register_tensor(Tier::kDevice, Kind::kHalfParams, m.flat_params, psi, "the flat parameter buffer");
  }
  flat32 = at::Tensor();
  flat32_reg.release();
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const ParamSlot& s = L.params()[i];
    m.guard.will_replace_trainable(m.params[i]);
    m.params[i].set_data(m.flat_params.narrow(0, i64(s.offset), i64(s.numel)).view(m.params[i].sizes()));
    m.params[i].mutable_grad().reset();
    m.guard.install_hook(m.params[i], std::make_unique<Impl::GradHook>(&m, static_cast<int>(i)));
  }
  // Frozen floating-point parameters and buffers meet the training-precision
  // activations, so they take the training precision too (a frozen fp32
  // Linear fed bf16 inputs would fail in LibTorch with a dtype mismatch).
  for (at::Tensor p : m.module->parameters(/*recurse=*/true)) {
    if (!p.requires_grad() && p.is_floating_point() && p.scalar_type() != m.dtype) {
      m.guard.will_cast(p);
      p.set_data(p.to(m.dtype));
    }
  }
  for (at::Tensor b : m.module->buffers(/*recurse=*/true)) {
    if (b.is_floating_point() && b.scalar_type() != m.dtype) {
      m.guard.will_cast(b);
      b.set_data(b.to(m.dtype));
    }
  }
  // Frozen parameters and floating-point buffers start equal on every rank,
  // as the trainable ones do (DDP broadcasts its buffers too): rank 0's.
  if (m.world > 1) {
    std::vector<at::Tensor> shared;
    for (const at::Tensor& p : m.module->parameters(/*recurse=*/true)) {
      if (!p.requires_grad() && p.scalar_type() == m.dtype) shared.push_back(p);
    }
    for (const at::Tensor& b : m.module->buffers(/*recurse=*/true)) {
      if (b.scalar_type() == m.dtype) shared.push_back(b);
    }
    for (const at::Tensor& t : shared) {
      at::Tensor c = t.detach().contiguous();  // t itself unless it is strided
      comm_.broadcast(c.data_ptr(), static_cast<std::size_t>(c.numel()), to_dtype(m.dtype))->wait();
      if (c.data_ptr() != t.data_ptr()) t.detach().copy_(c);
    }
  }

  // Optimizer moments, allocated after the temporary fp32 copy is gone.
  m.exp_avg = m.offload ? m.host_tensor(part, at::kFloat).zero_() : at::zeros({i64(part)}, opt32);
  m.register_tensor(opt_tier, Kind::kMoments, m.exp_avg, part_valid, "optimizer moments");
  if (m.adagrad) {
    m.exp_avg.fill_(config_.optimizer.initial_accumulator_value);
  } else {
    m.exp_avg_sq = m.offload ? m.host_tensor(part, at::kFloat).zero_() : at::zeros({i64(part)}, opt32);
    m.register_tensor(opt_tier, Kind::kMoments, m.exp_avg_sq, part_valid, "optimizer moments");
  }

  // Gradients.
  GradReducer::Options ro;
  ro.overlap_comm = z.overlap_comm;
  at::Tensor like = at::empty({0}, m.flat_params.options());
  if (m.offload || m.stage == 2) {
    ro.mode = GradReduceMode::kReduceScatter;
    if (m.offload) {
      // Pinned when the module is on a GPU: its copies then run at the
      // link's speed and may be asynchronous.
      const int copies = m.dpu ? 2 : 1;
      m.update_in_grads = m.gpu_offload && m.dtype != at::kFloat && config_.gradient_accumulation_steps == 1;
      for (int c = 0; c < copies; ++c) {
        // On a GPU as they come down (see Impl): the training precision, or
        // the device's fp32 sum when micro-batches accumulate.
        const bool half_grads = m.gpu_offload && config_.gradient_accumulation_steps == 1;
        m.host_grads[c] = m.host_tensor(part, half_grads ? m.dtype : at::kFloat).zero_();
        m.register_tensor(Tier::kHost, Kind::kGrads, m.host_grads[c], part_valid, "the host gradient partition");
      }
      if (m.dtype != at::kFloat && !m.update_in_grads) {
        m.staging = m.host_tensor(part, m.dtype);
        m.regs.push_back(ledger_.add(Tier::kHost, Kind::kStaging, i64(m.staging.nbytes()),
                                     "the host parameter staging buffer"));
      }
      if (m.gpu_offload) {
        m.copy_stream = c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device);
        if (config_.gradient_accumulation_steps > 1) {
          // fp32, as the host sums on the CPU path: a window's fp16 sum
          // may overflow where each micro-batch does not.
          m.dev_accum = at::zeros({i64(part)}, m.flat_params.options().dtype(at::kFloat));
          m.register_tensor(Tier::kDevice, Kind::kGrads, m.dev_accum, part_valid,
                            "the device gradient partition (accumulation)");
        }
      }
    } else {
      m.part_grads = at::zeros({i64(part)}, m.flat_params.options());
      m.register_tensor(Tier::kDevice, Kind::kGrads, m.part_grads, part_valid, "the gradient partition");
    }
  } else {
    ro.mode = m.stage == 0 ? GradReduceMode::kAllReduceFull : GradReduceMode::kReduceScatterFull;
    m.full_grads = at::zeros({i64(padded)}, m.flat_params.options());
    m.register_tensor(Tier::kDevice, Kind::kGrads, m.full_grads, psi, "the flat gradient buffer");
  }
  m.reducer = std::make_unique<GradReducer>(
      L, comm_, ledger_, ro, m.full_grads, like,
      [impl = &m](int b, const at::Tensor& chunk) { impl->consume_chunk(b, chunk); });

  // On a GPU the CPU Adam leaves one core to the thread that feeds the GPU
  // (a fully busy CPU slowed the GPU's steps by up to 40% on the H100
  // machine, docs/PERFORMANCE.md); offload_optimizer.cpu_threads overrides.
  int cpu_threads = z.offload_optimizer.cpu_threads;
  if (cpu_threads == 0 && m.gpu_offload) {
    cpu_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
  }
  m.pool = std::make_unique<optim::ThreadPool>(cpu_threads);
  if (m.dpu) m.worker = std::make_unique<offload::BackgroundWorker>();

  // The communicator's counters are its owner's: the engine counts the
  // difference from here on.
  m.comm_at_step_start = comm_.stats();
  stats_.loss_scale = m.scaler.scale();
  stats_.lr = lr_;
  if (m.rank == 0) {
    std::fprintf(stderr,
                 "zerocpp: stage %d, %s on %s, %d rank%s, %zu parameters in %zu bucket%s (%zu frozen), "
                 "optimizer %s%s%s\n",
                 m.stage, c10::toString(m.dtype), m.device.str().c_str(), m.world, m.world == 1 ? "" : "s", psi,
                 L.buckets().size(), L.buckets().size() == 1 ? "" : "s", static_cast<std::size_t>(frozen),
                 config_.optimizer.type.c_str(), m.offload ? ", offload cpu" : "",
                 m.dpu ? (", delayed update after " + std::to_string(m.dpu_warmup) + " steps").c_str() : "");
  }
  m.guard.commit();
}

Engine::~Engine() {
  // A pending delayed update is finished (not applied) so that the worker
  // never outlives the buffers it writes; what is lost is said once.
  if (!impl_ || !impl_->worker) return;
  Impl& m = *impl_;
  const bool pending = m.update_pending;
  try {
    m.wait_for_update();
    if (pending) {
      std::fprintf(stderr,
                   "zerocpp: the engine was destroyed with a delayed update pending: the update of step %lld "
                   "was dropped and the module keeps the weights of the step before. Call engine.flush() "
                   "after the last step.\n",
                   static_cast<long long>(stats_.step));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerocpp: the delayed update failed and was dropped: %s\n", e.what());
  }
}

c10::ScalarType Engine::dtype() const { return impl_->dtype; }
std::int64_t Engine::num_parameters() const { return i64(impl_->layout.numel()); }

bool Engine::is_accumulation_boundary() const {
  return (impl_->micro_step + 1) % config_.gradient_accumulation_steps == 0;
}

void Engine::backward(const at::Tensor& loss) {
  Impl& m = *impl_;
  ZERO_CHECK(loss.defined() && loss.numel() == 1,
             "engine.backward() needs a scalar loss (the mean over the micro-batch)");
  ZERO_CHECK(loss.requires_grad(),
             "the loss does not require grad: was it computed from the engine's module under "
             "torch::NoGradGuard?");
  m.boundary_backward = is_accumulation_boundary();
  m.reducer->begin_backward(m.boundary_backward);
  try {
    const float scale = m.scaler.scale();
    if (scale != 1.0f) {
      (loss.to(at::kFloat) * scale).backward();
    } else {
      loss.backward();
    }
    at::NoGradGuard no_grad;
    m.reducer->end_backward();
    m.window_first = false;
  } catch (...) {
    // Part of this micro-batch's gradients may be in the buffers: the whole
    // accumulation window is dropped and the next backward starts a new one.
    at::NoGradGuard no_grad;
    m.reducer->abort();
    m.discard_window();
    throw;
  }
}

bool Engine::step() {
  Impl& m = *impl_;
  const bool boundary = is_accumulation_boundary();
  ++m.micro_step;
  if (!boundary) return false;
  at::NoGradGuard no_grad;
  m.wait_for_update();
  if (m.update_pending) {
    m.apply_update();
    m.update_pending = false;
  }
  const int grads_index = m.host_cur;
  // The one host read of the step: the global squared norm (overflow check
  // and clip coefficient both come from it).
  if (m.gpu_offload) m.d2h_done[static_cast<std::size_t>(grads_index)] = m.record_on(*m.copy_stream);
  const at::Tensor local_sq = m.gpu_offload ? at::stack(m.bucket_norms).to(at::kDouble).square().sum()
                                            : m.local_grad_sq_norm(grads_index);
  double sq = 0.0;
  if (m.layout.shard_world() <= 1) {
    sq = local_sq.item<double>();
  } else {
    // Each rank sums its buckets' squares in double; the cross-rank sum is
    // fp32 (the communicator has no fp64). Its 2^-24 relative rounding moves
    // the clip coefficient by far less than the 1e-6 of clip_grad_norm_'s
    // rule. A finite squared norm past fp32's range (a global norm above
    // ~1.8e19, i.e. a still-scaled fp16 gradient far beyond overflow or a
    // diverged bf16/fp32 run) becomes inf and the step is skipped as an
    // overflow, logged and counted like any other.
    at::Tensor v = local_sq.to(at::TensorOptions().dtype(at::kFloat).device(m.device));
    comm_.all_reduce(v.data_ptr(), 1, DType::kFloat32)->wait();
    sq = v.item<float>();
  }
  // Sum over ranks and micro-batches, times the loss scale -> the mean gradient.
  const double inv = 1.0 / (static_cast<double>(m.world) * config_.gradient_accumulation_steps *
                            m.scaler.scale());
  const double norm = std::sqrt(sq) * inv;
  const bool overflow = !std::isfinite(norm);
  auto finish_step_stats = [&] {
    const comm::CommStats now = comm_.stats();
    for (std::size_t i = 0; i < now.bytes_sent.size(); ++i) {
      last_step_comm_.bytes_sent[i] = now.bytes_sent[i] - m.comm_at_step_start.bytes_sent[i];
      last_step_comm_.calls[i] = now.calls[i] - m.comm_at_step_start.calls[i];
    }
    m.comm_at_step_start = now;
    last_step_offload_bytes_ = m.offload_bytes;
    m.offload_bytes = 0;
  };
  stats_.grad_norm = static_cast<float>(norm);
  if (m.scaler.update(overflow)) {
    stats_.skipped = m.scaler.skipped_steps();
    stats_.last_step_skipped = true;
    stats_.loss_scale = m.scaler.scale();
    if (m.rank == 0) {
      std::fprintf(stderr,
                   "zerocpp: step %lld skipped: non-finite gradient (overflow); loss scale now %g, "
                   "%lld step(s) skipped so far\n",
                   static_cast<long long>(stats_.step + 1), m.scaler.scale(),
                   static_cast<long long>(stats_.skipped));
    }
    m.zero_grads(grads_index);
    finish_step_stats();
    return false;
  }
  double clip = 1.0;
  if (config_.gradient_clipping > 0.0f) {
    // torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), capped at 1.
    clip = std::min(1.0, config_.gradient_clipping / (norm + 1e-6));
  }
  stats_.clipped_grad_norm = static_cast<float>(norm * clip);
  const float grad_scale = static_cast<float>(inv * clip);
  const std::int64_t opt_step = ++m.optimizer_step;
  const float lr = lr_;
  m.update_index = grads_index;
  if (m.dpu && stats_.step >= m.dpu_warmup) {
    m.worker->submit([impl = impl_.get(), grads_index, grad_scale, lr, opt_step] {
      impl->run_optimizer(grads_index, grad_scale, lr, opt_step);
    });
    m.update_pending = true;
    m.host_cur ^= 1;  // the next step's gradients go to the other buffer
    m.zero_grads(m.host_cur);
  } else {
    m.run_optimizer(grads_index, grad_scale, lr, opt_step);
    m.apply_update();
    m.zero_grads(grads_index);
  }
  ++stats_.step;
  stats_.last_step_skipped = false;
  stats_.loss_scale = m.scaler.scale();
  stats_.lr = lr;
  finish_step_stats();
  return true;
}

void Engine::flush() {
  Impl& m = *impl_;
  m.wait_for_update();
  if (!m.update_pending) return;
  at::NoGradGuard no_grad;
  m.apply_update();
  m.update_pending = false;
}

std::vector<at::Tensor> Engine::gather_master_params() {
  Impl& m = *impl_;
  at::NoGradGuard no_grad;
  m.wait_for_update();
  const FlatLayout& L = m.layout;
  // Gathered where the collectives' buffers live (the module's device), then
  // handed out on the host.
  at::Tensor full = at::zeros({i64(L.padded_numel())}, at::TensorOptions().dtype(at::kFloat).device(m.device));
  at::Tensor master = m.master.to(m.device);
  for (const Bucket& b : L.buckets()) {
    full.narrow(0, i64(m.chunk_flat_offset(b)), i64(b.chunk))
        .copy_(master.narrow(0, i64(b.partition_offset), i64(b.chunk)));
    if (L.shard_world() > 1) {
      auto* base = static_cast<char*>(full.data_ptr()) + b.offset * 4;
      comm_.all_gather(base + static_cast<std::size_t>(m.rank) * b.chunk * 4, base, b.chunk,
                       DType::kFloat32)
          ->wait();
    }
  }
  full = full.to(at::kCPU);
  std::vector<at::Tensor> out;
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const ParamSlot& s = L.params()[i];
    out.push_back(full.narrow(0, i64(s.offset), i64(s.numel)).view(m.params[i].sizes()).clone());
  }
  return out;
}

std::string Engine::summary() const {
  const memory::LedgerSnapshot s = ledger_.snapshot();
  std::ostringstream os;
  os << "zerocpp summary (rank " << impl_->rank << " of " << impl_->world << ", stage "
     << impl_->stage << (impl_->offload ? ", offload cpu" : "") << (impl_->dpu ? ", DPU" : "")
     << ", " << c10::toString(impl_->dtype) << " on " << impl_->device.str() << ", " << num_parameters()
     << " parameters)\n";
  for (int t = 0; t < memory::kNumTiers; ++t) {
    if (s.tier_peak[t] == 0) continue;
    os << "  " << memory::tier_name(static_cast<Tier>(t)) << ": "
       << memory::format_bytes(s.tier_current[t]) << " now, "
       << memory::format_bytes(s.tier_peak[t]) << " peak;";
    for (int k = 0; k < memory::kNumKinds; ++k) {
      if (s.peak[t][k] == 0) continue;
      os << " " << memory::kind_name(static_cast<Kind>(k)) << " "
         << memory::format_bytes(s.current[t][k]) << " (peak "
         << memory::format_bytes(s.peak[t][k]) << ")";
    }
    os << "\n";
  }
  os << "  last step sent " << memory::format_bytes(static_cast<std::int64_t>(last_step_comm_.total_bytes()))
     << " (";
  const char* names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"};
  bool first = true;
  for (std::size_t i = 0; i < 5; ++i) {
    if (last_step_comm_.calls[i] == 0) continue;
    os << (first ? "" : ", ") << names[i] << " "
       << memory::format_bytes(static_cast<std::int64_t>(last_step_comm_.bytes_sent[i]));
    first = false;
  }
  os << ")";
  if (impl_->offload) {
    os << ", offload copies " << memory::format_bytes(static_cast<std::int64_t>(last_step_offload_bytes_));
  }
  os << "\n  steps " << stats_.step << ", skipped " << stats_.skipped << ", loss scale "
     << stats_.loss_scale << "\n";
  return os.str();
}

}  // namespace zero
