#include "param_store.h"

#include <algorithm>
#include <cstring>

#include <limits>
#include <unordered_set>

#include <ATen/ops/empty.h>
#include <ATen/ops/isnan.h>

#include <ATen/ops/zeros.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/accumulate.h>

#include "planned_tensor.h"
#include "zero/core/error.h"
#include "zero/optim/thread_pool.h"
#include "zero/zero/deferred_init.h"
#include "zero/zero/device_wait.h"
#include "zero/zero/torch_dtype.h"

namespace zero::detail {

ParamStore::ParamStore(std::shared_ptr<torch::nn::Module> module, c10::ScalarType dtype, int world, int rank,
                       std::optional<c10::Device> target, InitFn init)
    : module_(std::move(module)), dtype_(dtype), init_(std::move(init)), world_(world), rank_(rank) {
  // Trainable parameters, each once (tied weights appear twice in the module).
  std::unordered_set<const void*> seen;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!p.requires_grad()) {
      ++frozen_;
      frozen_params_.push_back({item.key(), p});
      continue;
    }
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    names_.push_back(item.key());
    shapes_.push_back(p.sizes().vec());
    params_.push_back(p);
  }
  ZERO_CHECK(!params_.empty(), "the module has no trainable parameters (", frozen_,
             " frozen): nothing to train. Check requires_grad on its parameters.");
  // (First: a module a live engine trains is in that engine's precision,
  // and the claim's error says what is wrong with it.)
  claim_ = ParamClaim(params_, names_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    ZERO_CHECK(params_[i].scalar_type() == at::kFloat, "parameter '", names_[i], "' is ",
               c10::toString(params_[i].scalar_type()),
               ": give zero::Engine an fp32 module; it makes the bf16/fp16 copy itself");
  }
  const bool meta = has_meta_tensors(*module_);
  ZERO_CHECK(!meta || init_, "the module has parameters or buffers on the meta device (zero::to_meta) but no "
             "init function: give zero::EngineOptions::init, which fills each of them on the engine's device");
  ZERO_CHECK(!init_ || meta, "EngineOptions::init fills tensors on the meta device, and the module has none (its "
             "parameters are on ", params_.front().device().str(), "): build it with zero::to_meta, or leave init "
             "empty and initialise the module yourself");
  if (target) {
    ZERO_CHECK(!target->is_meta(), "EngineOptions::device is meta: name the device to train on (cpu or "
               "cuda:<local rank>)");
    device_ = *target;
    return;
  }
  // Where the parameters with memory are (those on meta are filled there).
  std::optional<c10::Device> d;
  std::size_t first = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const c10::Device here = params_[i].device();
    if (here.is_meta()) continue;
    if (!d) {
      d = here;
      first = i;
    }
    ZERO_CHECK(here == *d, "parameter ", i, " is on ", here.str(), " but parameter ", first, " is on ", d->str(),
               ": zero::Engine trains a module on one device. Move it there first (module->to(device)), or "
               "name the device in zero::EngineOptions::device and the engine moves each parameter there.");
  }
  ZERO_CHECK(d.has_value(), "the module's parameters are on the meta device: name the device to train on in "
             "zero::EngineOptions::device (cpu or cuda:<local rank>)");
  device_ = *d;
}

void ParamStore::run_init(const std::string& name, const at::Tensor& value) const {
  // NaN first: a value init did not write is caught, not trained on.
  const bool checkable = value.is_floating_point();
  if (checkable) value.fill_(std::numeric_limits<double>::quiet_NaN());
  init_(name, value);
  ZERO_CHECK(!checkable || !at::isnan(value).any().item<bool>(), "EngineOptions::init left '", name,
             "' (or part of it) unfilled: it must fill the tensor it is given in place (normal_, uniform_, zero_, "
             "copy_), not assign a new one");
}

void ParamStore::initial_value(std::size_t i, const at::Tensor& dst) const {
  const at::Tensor& p = params_[i];
  if (p.is_meta()) {
    run_init(names_[i], dst.view(p.sizes()));
  } else {
    dst.copy_(p.reshape({-1}));
  }
}

std::vector<std::size_t> ParamStore::numels() const {
  std::vector<std::size_t> n;
  for (const auto& s : shapes_) n.push_back(static_cast<std::size_t>(c10::multiply_integers(s)));
  return n;
}

std::vector<at::Tensor> ParamStore::frozen_candidates() const {
  std::vector<at::Tensor> out;
  std::unordered_set<const void*> seen;
  for (const auto& [name, p] : frozen_params_) {
    const bool precision = dtype_ == at::kFloat ? p.scalar_type() == at::kFloat : p.is_floating_point();
    if (precision && seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

void ParamStore::select_frozen(const std::vector<at::Tensor>& candidates, const std::vector<int>& groups) {
  ZERO_INTERNAL_ASSERT(candidates.size() == groups.size(), "one unit per frozen candidate");
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (groups[i] < 0) continue;
    fparams_.push_back(candidates[i]);
    fshapes_.push_back(candidates[i].sizes().vec());
    fgroups_.push_back(groups[i]);
    for (const auto& [name, p] : frozen_params_) {
      if (p.unsafeGetTensorImpl() != candidates[i].unsafeGetTensorImpl()) continue;
      fnames_.push_back(name);
      break;
    }
  }
}

std::vector<std::size_t> ParamStore::frozen_numels() const {
  std::vector<std::size_t> n;
  for (const auto& s : fshapes_) n.push_back(static_cast<std::size_t>(c10::multiply_integers(s)));
  return n;
}

std::int64_t ParamStore::frozen_partitioned_bytes() const {
  std::int64_t n = 0;
  for (std::size_t k : frozen_numels()) n += static_cast<std::int64_t>(k * c10::elementSize(dtype_));
  return n;
}

int ParamStore::frozen_index(const at::Tensor& t) const {
  for (std::size_t j = 0; j < fparams_.size(); ++j) {
    if (fparams_[j].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return static_cast<int>(j);
  }
  return -1;
}

c10::IntArrayRef ParamStore::frozen_shape(const at::Tensor& t) const {
  const int j = frozen_index(t);
  ZERO_INTERNAL_ASSERT(j >= 0, "not a partitioned frozen parameter");
  return fshapes_[static_cast<std::size_t>(j)];
}

std::vector<int> ParamStore::frozen_group_buckets(int g) const {
  std::vector<int> out;
  const int nt = static_cast<int>(layout_.buckets().size());
  for (int b : flayout_.group_buckets(g)) out.push_back(nt + b);
  return out;
}

void ParamStore::use_plan(const MemoryPlan& plan) {
  plan_ = &plan;
  layout_ = plan.layout;
  flayout_ = plan.frozen_layout;
  shard_rank_ = plan.shard_rank;
  ZERO_INTERNAL_ASSERT(flayout_.params().size() == fparams_.size(), "the plan's frozen layout has ",
                       flayout_.params().size(), " parameters, the store ", fparams_.size());
}

at::Tensor ParamStore::initial_fp32(comm::Communicator& comm, memory::MemoryLedger& ledger) {
  // In fp32 training it becomes the flat parameter buffer; otherwise it is a
  // temporary, counted in the device ledger while it lives (so that
  // device_memory_limit sees the real construction peak) and freed before
  // the moments are allocated.
  const PlannedBuffer& planned = (*plan_)[Buffer::kFlat32];
  const std::size_t padded = planned.elements;
  at::Tensor flat32 = at::zeros({i64(padded)}, at::TensorOptions().dtype(at::kFloat).device(device()));
  if (planned.lifetime == Lifetime::kPersistent) {
    register_planned(ledger, regs_, planned, flat32);
  } else {
    flat32_temp_ = ledger.add(planned.tier, planned.kind, i64(flat32.nbytes()), planned.what);
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamSlot& s = layout_.params()[i];
    initial_value(i, flat32.narrow(0, i64(s.offset), i64(s.numel)));
  }
  if (world_ > 1) comm.broadcast(flat32.data_ptr(), padded, DType::kFloat32)->wait();
  return flat32;
}

void ParamStore::adopt(at::Tensor flat32, comm::Communicator& comm, memory::MemoryLedger& ledger,
                       ModuleGuard& guard) {
  flat_ = dtype_ == at::kFloat ? flat32 : flat32.to(dtype_);
  if (dtype_ != at::kFloat) register_planned(ledger, regs_, (*plan_)[Buffer::kFlatParams], flat_);
  flat32 = at::Tensor();
  flat32_temp_.release();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamSlot& s = layout_.params()[i];
    guard.will_replace_trainable(params_[i]);
    replace_data(params_[i], flat_.narrow(0, i64(s.offset), i64(s.numel)).view(params_[i].sizes()));
    params_[i].mutable_grad().reset();
  }
  cast_frozen_and_buffers(comm, guard, ledger);
}

void ParamStore::cast_frozen_and_buffers(comm::Communicator& comm, ModuleGuard& guard, memory::MemoryLedger& ledger) {
  // In bf16/fp16, frozen floating-point parameters and buffers meet the
  // training-precision activations, so they take the training precision too
  // (a frozen fp32 Linear fed bf16 inputs would fail in LibTorch with a
  // dtype mismatch). In fp32 they keep their own dtype (a float64 buffer
  // keeps its precision, and the module saves and loads as it did), as in a
  // plain LibTorch loop. All of them go to the engine's device, and those
  // on the meta device get their values from init there first.
  const bool reduced = dtype_ != at::kFloat;
  auto settle = [&](const std::string& name, const at::Tensor& t, bool cast) {
    const c10::ScalarType to = cast && reduced && t.is_floating_point() ? dtype_ : t.scalar_type();
    if (t.device() == device_ && t.scalar_type() == to) return;
    guard.will_cast(t);
    if (t.is_meta()) {
      const at::Tensor value = at::empty(t.sizes(), t.options().device(device_));
      run_init(name, value);
      replace_data(t, value.to(to));
    } else {
      t.set_data(t.to(device_, to));
    }
  };
  // (Stage 3's partitioned frozen parameters are settled already: views of their buckets.)
  std::unordered_set<const void*> partitioned;
  for (const at::Tensor& p : fparams_) partitioned.insert(p.unsafeGetTensorImpl());
  auto whole = [&](const at::Tensor& t) { return partitioned.count(t.unsafeGetTensorImpl()) == 0; };
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad() && whole(item.value())) settle(item.key(), item.value(), /*cast=*/true);
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) settle(item.key(), item.value(), /*cast=*/true);
  // Their bytes, each storage once (a frozen table tied to another, a
  // buffer viewing a parameter), in the ledger: device_memory_limit and the
  // memory report see them, as zero-estimate's --frozen-params does. Every
  // rank holds the same, so every rank refuses alike, before the broadcasts.
  {
    std::unordered_set<const c10::StorageImpl*> seen;
    std::int64_t frozen = 0, buffers = 0;
    auto count = [&](const at::Tensor& t, std::int64_t& into) {
      if (!t.defined() || !t.has_storage() || t.is_meta()) return;
      if (seen.insert(t.storage().unsafeGetStorageImpl()).second) into += static_cast<std::int64_t>(t.storage().nbytes());
    };
    for (const auto& [name, p] : frozen_params_) {
      if (whole(p)) count(p, frozen);
    }
    for (const at::Tensor& b : module_->buffers(/*recurse=*/true)) count(b, buffers);
    frozen_bytes_ = frozen;
    if (frozen + buffers > 0) {
      regs_.push_back(ledger.add(memory::Tier::kDevice, memory::Kind::kFrozen, frozen + buffers,
                                 "the frozen parameters and the module's buffers (whole on every rank: at stage 3 "
                                 "those of no unit)"));
    }
  }
  // Frozen parameters and buffers start equal on every rank, as the
  // trainable ones do (DDP broadcasts its buffers too): rank 0's.
  if (world_ > 1) {
    // A floating dtype goes as 2-byte units (the training precision as
    // itself; another, such as a float64 buffer in fp32 training, as its
    // bytes: a broadcast copies); the others (integer and bool buffers: a
    // step counter, a mask), as DDP broadcasts every buffer, as their bytes
    // padded to whole 2-byte units.
    auto shareable = [](const at::Tensor& t) { return t.is_floating_point() && t.element_size() % 2 == 0; };
    std::vector<at::Tensor> shared;
    for (const at::Tensor& p : module_->parameters(/*recurse=*/true)) {
      if (!p.requires_grad() && whole(p)) shared.push_back(p);
    }
    for (const at::Tensor& b : module_->buffers(/*recurse=*/true)) shared.push_back(b);
    for (const at::Tensor& t : shared) {
      if (!t.defined() || t.numel() == 0) continue;
      at::Tensor c = t.detach().contiguous();  // t itself unless it is strided
      if (shareable(c)) {
        const bool own = c.scalar_type() == dtype_;
        comm.broadcast(c.data_ptr(), static_cast<std::size_t>(own ? c.numel() : c.nbytes() / 2),
                       own ? to_dtype(dtype_) : DType::kFloat16)->wait();
      } else {
        const std::int64_t n = static_cast<std::int64_t>(c.nbytes());
        at::Tensor bytes = at::zeros({(n + 1) / 2 * 2}, c.options().dtype(at::kByte));
        at::Tensor raw = c.view({-1}).view(at::kByte);
        bytes.narrow(0, 0, n).copy_(raw);
        comm.broadcast(bytes.data_ptr(), static_cast<std::size_t>(bytes.numel() / 2), DType::kFloat16)->wait();
        raw.copy_(bytes.narrow(0, 0, n));
      }
      if (c.data_ptr() != t.data_ptr()) t.detach().copy_(c);
    }
  }
}

void ParamStore::publish(const at::Tensor& src, bool offloaded, comm::Communicator& comm, const DeviceContext& ctx) {
  begin_publish(offloaded, ctx);
  const std::vector<Bucket>& buckets = layout_.buckets();
  const UpdateSource from{src, 0, offloaded};
  for (std::size_t i = 0; i < buckets.size(); ++i) publish_piece(from, buckets[i], 0, buckets[i].chunk, "bucket", i);
  end_publish(comm);
}

void ParamStore::begin_publish(bool offloaded, const DeviceContext& ctx) {
  settle_gathers();  // the pieces overwrite the partition the gathers read
  if (swap_) swap_->discard_partial();  // a publish that failed part-way before this one
  publish_offloaded_ = offloaded;
  publish_ctx_ = &ctx;
  publish_stream_.reset();
  publish_compute_.reset();
  if (offloaded && ctx.copy_stream) {
    // Up on the copy stream, after what the compute stream has queued (the
    // backward that reads the parameters these copies overwrite); the
    // compute stream waits for them on the device, not the host.
    publish_compute_ = ctx.current_stream();
    publish_stream_ = ctx.upload_stream ? *ctx.upload_stream : *ctx.copy_stream;
    ctx.record_on(*publish_compute_)->block(*publish_stream_);
  }
}

void ParamStore::publish_after_current() {
  if (publish_stream_) publish_ctx_->record_on(publish_ctx_->current_stream())->block(*publish_stream_);
}

void ParamStore::publish_piece(const UpdateSource& src, const Bucket& b, std::size_t offset, std::size_t n,
                               const char* kind, std::size_t index) {
  // H2D (the parameters' way up, as the paper counts it: with the partition
  // on NVMe the update goes to the file, and the gathers bring it up)
  if (publish_offloaded_ && src.host) copied_ += n * c10::elementSize(dtype_);
  if (!src.values.defined()) return;
  const at::Tensor from = src.values.narrow(0, i64(b.partition_offset + offset - src.base), i64(n));
  if (swap_) {
    swap_->write(bucket_index(b), offset, from);  // on the host, now
    return;
  }
  at::Tensor dst = rank_chunk(b).narrow(0, i64(offset), i64(n));
  if (host_copy_pool_ != nullptr && dst.is_cpu() && from.is_cpu() && dst.scalar_type() == from.scalar_type() &&
      dst.is_contiguous() && from.is_contiguous()) {
    copy_on_pool(dst, from, kind, index);
    return;
  }
  if (!publish_stream_) {
    dst.copy_(from);
    return;
  }
  const c10::StreamGuard on_copy(*publish_stream_);
  StepTimeline::on_stream(timeline_, *publish_stream_, "copy up", kind, index,
                          [&] { dst.copy_(from, /*non_blocking=*/true); });
}

void ParamStore::copy_on_pool(const at::Tensor& dst, const at::Tensor& from, const char* kind, std::size_t index) {
  const auto began = StepTimeline::Clock::now();
  auto* to = static_cast<std::byte*>(dst.data_ptr());
  const auto* src = static_cast<const std::byte*>(from.data_ptr());
  // Tiles of 1 MiB: long enough runs for memcpy's streaming stores, enough
  // of them for every thread in a piece of a few million elements.
  constexpr std::size_t kTileBytes = std::size_t{1} << 20;
  host_copy_pool_->parallel_for(static_cast<std::size_t>(dst.nbytes()), kTileBytes,
                                [&](std::size_t begin, std::size_t end) {
                                  std::memcpy(to + begin, src + begin, end - begin);
                                });
  // (On a GPU, where the partition in host memory is what goes up; on the
  // CPU there is no way up to trace.)
  if (publish_stream_ && timeline_ != nullptr && timeline_->on()) {
    timeline_->host_interval("copy up", std::string(kind) + " " + std::to_string(index), began,
                             StepTimeline::Clock::now());
  }
}

void ParamStore::remember_storages() {
  storages_.clear();
  for (const at::Tensor& p : params_) storages_.push_back(p.storage().unsafeGetStorageImpl());
  for (const at::Tensor& p : fparams_) storages_.push_back(p.storage().unsafeGetStorageImpl());
  module_params_.clear();
  for (const at::Tensor& p : module_->parameters()) module_params_.push_back(p.unsafeGetTensorImpl());
  std::sort(module_params_.begin(), module_params_.end());
  module_params_.erase(std::unique(module_params_.begin(), module_params_.end()), module_params_.end());
}

void ParamStore::check_own_storage(std::size_t i) const {
  if (i >= storages_.size()) return;  // not built yet
  const bool frozen = i >= params_.size();
  const at::Tensor& p = frozen ? fparams_[i - params_.size()] : params_[i];
  const std::string& name = frozen ? fnames_[i - params_.size()] : names_[i];
  ZERO_CHECK(p.defined() && p.has_storage() && p.storage().unsafeGetStorageImpl() == storages_[i] &&
                 p.scalar_type() == dtype_,
             "parameter '", name, "' was replaced after the engine was built (",
             !p.defined() ? std::string("it is undefined")
             : p.scalar_type() != dtype_ ? std::string("it is now ") + c10::toString(p.scalar_type()) + " on " +
                                               p.device().str() + ", not the engine's " + c10::toString(dtype_)
                                         : std::string("its storage is another tensor's"),
             "): model->to(), set_data(), torch::load or a new tensor detach the module from the engine",
             partitioned_ ? " (at stage 3 the next gather would have put the engine's values back over it)" : "",
             ". Move or convert the model before building the engine, and load weights with load_checkpoint() (or "
             "EngineOptions::init for a model built on the meta device)");
}

void ParamStore::check_intact() const {
  for (std::size_t i = 0; i < storages_.size(); ++i) {
    check_own_storage(i);
    if (i >= params_.size()) continue;
    const at::Tensor& p = params_[i];
    ZERO_CHECK(p.requires_grad(), "parameter '", names_[i],
               "' no longer requires a gradient (requires_grad(false) after the engine was built): the engine "
               "would go on stepping it with a zero gradient (weight decay and the moments would still move it). "
               "Freeze parameters before building the engine");
  }
  for (const at::Tensor& p : module_->parameters()) {
    if (std::binary_search(module_params_.begin(), module_params_.end(), p.unsafeGetTensorImpl())) continue;
    std::string name = "?";
    for (const auto& item : module_->named_parameters()) {
      if (item.value().unsafeGetTensorImpl() != p.unsafeGetTensorImpl()) continue;
      name = item.key();
      break;
    }
    ZERO_CHECK(false, "parameter '", name, "' is not one the module had when the engine was built (registered since, or "
              "its submodule replaced): the engine trains only the parameters it was built with (their layout, "
              "partitions, precision and optimizer state are fixed), so it would be left out (never trained; frozen, "
              "never cast to the training precision). "
              "Change the model before building the engine");
  }
  for (const auto& [name, p] : frozen_params_) {
    ZERO_CHECK(!p.requires_grad(), "parameter '", name,
               "' was frozen when the engine was built and now requires a gradient: the engine trains only the "
               "parameters that required one then (their layout, partitions and optimizer state are fixed), so "
               "its gradient would pile up in .grad and never be applied. Set requires_grad before building the "
               "engine (to unfreeze during training: save a checkpoint, build a new engine with the parameter "
               "trainable, and load the checkpoint's module weights into it)");
  }
}

void ParamStore::end_publish(comm::Communicator& comm) {
  if (publish_stream_) {
    up_done_ = publish_ctx_->record_on(*publish_stream_);
    up_done_->block(*publish_compute_);
    publish_stream_.reset();
  }
  if (swap_) swap_->flush();
  all_gather(comm);
  // The parameters changed in place, as a LibTorch optimizer changes them:
  // a graph recorded before (a forward whose backward comes after this
  // step) now fails in backward with autograd's "modified by an inplace
  // operation" instead of computing gradients at weights that are gone.
  for (const at::Tensor& p : params_) p.unsafeGetTensorImpl()->bump_version();
  // At stage 3 a released parameter's own counter waits in full_versions_
  // (put back when its unit is gathered again; the tensor holds a stand-in
  // meanwhile): bumped too, or a graph recorded before the step would back
  // up through the gathered new values unnoticed.
  for (std::size_t i = 0; i < params_.size() && i < full_versions_.size(); ++i) {
    if (full_versions_[i].enabled()) full_versions_[i].bump();
  }
}

at::Tensor ParamStore::read_rank_chunk(const Bucket& b) {
  return swap_ ? swap_->read_copy(bucket_index(b)) : rank_chunk(b);
}

void ParamStore::write_partition(const at::Tensor& values) {
  write_partition([&](std::size_t offset, std::size_t n) { return values.narrow(0, i64(offset), i64(n)); });
}

void ParamStore::write_partition(const std::function<at::Tensor(std::size_t, std::size_t)>& values) {
  if (swap_) swap_->discard_partial();  // a publish that failed part-way before this
  for (const Bucket& b : layout_.buckets()) {
    const at::Tensor from = values(b.partition_offset, b.chunk);
    if (swap_) {
      swap_->write(bucket_index(b), 0, from);
    } else {
      rank_chunk(b).copy_(from);
    }
  }
  if (swap_) swap_->flush();
}

void ParamStore::write_chunk_range(const Bucket& b, std::size_t offset, const at::Tensor& values) {
  const std::int64_t n = values.numel();
  if (!swap_) {
    rank_chunk(b).narrow(0, i64(offset), n).copy_(values);
    return;
  }
  at::Tensor chunk = swap_->read_copy(bucket_index(b));
  chunk.narrow(0, i64(offset), n).copy_(values);
  swap_->discard_partial();
  swap_->write(bucket_index(b), 0, chunk);
  swap_->flush();
}

void ParamStore::wait_up() const {
  if (up_done_) up_done_->synchronize();
}

std::uint64_t ParamStore::take_copied_bytes() {
  const std::uint64_t n = copied_;
  copied_ = 0;
  return n;
}

// Stage >= 1: every rank's updated chunks to every rank.
void ParamStore::all_gather(comm::Communicator& comm) {
  if (partitioned_) {
    // Stage 3: what is gathered now (the buckets of no unit, and units
    // gathered or fetched ahead) from the partition. (Not the frozen
    // buckets: the step does not change them.)
    regather_held(0, layout_.buckets().size(), comm);
    return;
  }
  if (layout_.shard_world() <= 1) return;
  std::vector<comm::WorkPtr> works;
  const std::size_t es = flat_.element_size();
  for (std::size_t bi = 0; bi < layout_.buckets().size(); ++bi) {
    const Bucket& b = layout_.buckets()[bi];
    auto* base = static_cast<char*>(flat_.data_ptr()) + b.offset * es;
    auto* mine = base + static_cast<std::size_t>(rank_) * b.chunk * es;
    works.push_back(comm.all_gather(mine, base, b.chunk, to_dtype(dtype_), {bucket_tag(bi)}));
  }
  // The next forward reads the parameters on the current stream: on a
  // device backend that stream waits, and the host confirms after backward.
  for (auto& w : works) wait_for_use(std::move(w), device_, unconfirmed_);
}

std::vector<at::Tensor> ParamStore::gather(const at::Tensor& master_partition, comm::Communicator& comm) const {
  // Gathered where the collectives' buffers live (the module's device), then
  // handed out on the host.
  const FlatLayout& L = layout_;
  at::Tensor full = at::zeros({i64(L.padded_numel())}, at::TensorOptions().dtype(at::kFloat).device(device()));
  const at::Tensor master = master_partition.to(device());
  for (std::size_t bi = 0; bi < L.buckets().size(); ++bi) {
    const Bucket& b = L.buckets()[bi];
    full.narrow(0, i64(chunk_flat_offset(b)), i64(b.chunk))
        .copy_(master.narrow(0, i64(b.partition_offset), i64(b.chunk)));
    if (L.shard_world() > 1) {
      auto* base = static_cast<char*>(full.data_ptr()) + b.offset * 4;
      comm.all_gather(base + static_cast<std::size_t>(rank_) * b.chunk * 4, base, b.chunk, DType::kFloat32,
                      {bucket_tag(bi)})
          ->wait();
    }
  }
  full = full.to(at::kCPU);
  std::vector<at::Tensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamSlot& s = L.params()[i];
    out.push_back(full.narrow(0, i64(s.offset), i64(s.numel)).view(shapes_[i]).clone());
  }
  return out;
}

}  // namespace zero::detail
