// ParamStore at ZeRO stage 3 (param_store.h): construction bucket by bucket,
// and the gather and release of one bucket.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <torch/csrc/autograd/variable.h>

#include "out_of_memory.h"
#include "param_store.h"
#include "planned_tensor.h"
#include "zero/core/error.h"
#include "zero/zero/deferred_init.h"
#include "zero/zero/device_wait.h"
#include "zero/zero/torch_dtype.h"

namespace zero::detail {

void ParamStore::adopt_partitioned(comm::Communicator& comm, memory::MemoryLedger& ledger, ModuleGuard& guard,
                                   const SeedFn& seed, const DeviceContext& ctx) {
  partitioned_ = true;
  ledger_ = &ledger;
  const MemoryPlan& plan = *plan_;
  const PlannedBuffer& part = plan[Buffer::kParamPartition];
  if (part.tier == memory::Tier::kNvme) {
    ZERO_INTERNAL_ASSERT(swap_ != nullptr, "the parameter partition is planned on NVMe: open_swap() first");
  } else {
    partition_ = part.tier == memory::Tier::kHost
                     ? ctx.host_tensor(part.elements, dtype_)
                     : at::empty({i64(part.elements)}, at::TensorOptions().dtype(dtype_).device(device()));
    partition_.zero_();
    register_planned(ledger, regs_, part, partition_);
  }
  if (part.tier != memory::Tier::kDevice && ctx.on_accelerator()) {
    lane_ = make_stream_lane(ctx);
  } else if (deferred_gathers_requested()) {
    lane_ = make_deferred_lane();
  }
  // One bucket of fp32 at a time (the largest one's size) and its copy in
  // the training precision, counted while they live (the plan's 4 + es bytes
  // per element).
  const PlannedBuffer& temp = plan[Buffer::kFlat32];
  at::Tensor flat32 = at::zeros({i64(temp.elements)}, at::TensorOptions().dtype(at::kFloat).device(device()));
  flat32_temp_ = ledger.add(temp.tier, temp.kind, temp.bytes(), temp.what);
  const std::vector<Bucket>& buckets = layout_.buckets();
  const std::size_t all = buckets.size() + flayout_.buckets().size();
  buckets_.resize(all);
  bucket_regs_.resize(all);
  hollow_.assign(all, 0);
  for (std::size_t bi = 0; bi < buckets.size(); ++bi) {
    const Bucket& b = buckets[bi];
    at::Tensor full32 = flat32.narrow(0, 0, i64(b.padded));
    full32.zero_();
    for (int i : b.params) {
      const ParamSlot& s = layout_.params()[static_cast<std::size_t>(i)];
      initial_value(static_cast<std::size_t>(i), full32.narrow(0, i64(s.offset - b.offset), i64(s.numel)));
    }
    if (world_ > 1) comm.broadcast(full32.data_ptr(), b.padded, DType::kFloat32, {0, bucket_tag(bi)})->wait();
    const at::Tensor mine32 = full32.narrow(0, i64(static_cast<std::size_t>(shard_rank_) * b.chunk), i64(b.chunk));
    seed(b, mine32);
    if (swap_) {
      swap_->write(static_cast<int>(bi), 0, mine32);
    } else {
      partition_.narrow(0, i64(b.partition_offset), i64(b.chunk)).copy_(mine32);
    }
    buckets_[bi] = BucketStorage(full32.to(dtype_, /*non_blocking=*/false, /*copy=*/true));
    if (b.group < 0) register_bucket(bi, "the parameters of no unit (kept gathered)");  // the plan's kFlatParams
    for (int i : b.params) {
      at::Tensor& p = params_[static_cast<std::size_t>(i)];
      guard.will_replace_trainable(p);
      p.mutable_grad().reset();
    }
    view_params(bi, /*full=*/true);
    if (b.group >= 0) {
      buckets_[bi].release();
      hollow(static_cast<int>(bi));
    }
  }
  if (swap_) swap_->flush();
  adopt_frozen(flat32, comm, guard, ctx);
  flat32 = at::Tensor();
  flat32_temp_.release();
  cast_frozen_and_buffers(comm, guard, ledger);
}

void ParamStore::adopt_frozen(const at::Tensor& flat32, comm::Communicator& comm, ModuleGuard& guard,
                              const DeviceContext& ctx) {
  if (fparams_.empty()) return;
  const PlannedBuffer& part = (*plan_)[Buffer::kFrozenPartition];
  fpartition_ = part.tier == memory::Tier::kHost
                    ? ctx.host_tensor(part.elements, dtype_)
                    : at::empty({i64(part.elements)}, at::TensorOptions().dtype(dtype_).device(device()));
  fpartition_.zero_();
  register_planned(*ledger_, regs_, part, fpartition_);
  const std::size_t nt = layout_.buckets().size();
  for (std::size_t k = 0; k < flayout_.buckets().size(); ++k) {
    const Bucket& b = flayout_.buckets()[k];
    const std::size_t bi = nt + k;
    // Rank 0's values, as the trainable ones (through fp32: the cast after
    // the broadcast is the cast before it).
    at::Tensor full32 = flat32.narrow(0, 0, i64(b.padded));
    full32.zero_();
    for (int i : b.params) {
      const auto j = static_cast<std::size_t>(i);
      const ParamSlot& s = flayout_.params()[j];
      const at::Tensor dst = full32.narrow(0, i64(s.offset - b.offset), i64(s.numel));
      if (fparams_[j].is_meta()) {
        run_init(fnames_[j], dst.view(fshapes_[j]));
      } else {
        dst.copy_(fparams_[j].detach().reshape({-1}));
      }
    }
    if (world_ > 1) comm.broadcast(full32.data_ptr(), b.padded, DType::kFloat32, {0, bucket_tag(bi)})->wait();
    fpartition_.narrow(0, i64(b.partition_offset), i64(b.chunk))
        .copy_(full32.narrow(0, i64(static_cast<std::size_t>(shard_rank_) * b.chunk), i64(b.chunk)));
    buckets_[bi] = BucketStorage(full32.to(dtype_, /*non_blocking=*/false, /*copy=*/true));
    for (int i : b.params) guard.will_view(fparams_[static_cast<std::size_t>(i)]);
    view_params(bi, /*full=*/true);
    buckets_[bi].release();
    hollow(static_cast<int>(bi));
  }
}

template <class F>
void ParamStore::for_bucket_params(std::size_t bi, F&& f) {
  const std::size_t nt = layout_.buckets().size();
  const bool frozen = bi >= nt;
  const FlatLayout& L = frozen ? flayout_ : layout_;
  std::vector<at::Tensor>& ps = frozen ? fparams_ : params_;
  const std::vector<std::vector<std::int64_t>>& shapes = frozen ? fshapes_ : shapes_;
  const std::size_t first = frozen ? params_.size() : 0;
  for (int i : L.buckets()[frozen ? bi - nt : bi].params) {
    const auto j = static_cast<std::size_t>(i);
    f(ps[j], shapes[j], L.params()[j], first + j);
  }
}

std::vector<std::pair<at::Tensor, at::Tensor>> ParamStore::frozen_values_on_host(comm::Communicator& comm) {
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  settle_gathers();  // the copies into buckets fetched ahead are done
  const std::size_t nt = layout_.buckets().size();
  for (std::size_t bi = nt; bi < buckets_.size(); ++bi) {
    // A bucket gathered already (a gather_parameters() scope, a unit
    // fetched ahead) is read as it is, once its all-gather is done; others
    // are gathered for the copy and released again.
    const bool held = buckets_[bi].held();
    if (held) wait_gathering(bi);
    if (!held) {
      PendingGather g = start_gather(static_cast<int>(bi), comm);
      finish_gather(g);
    }
    if (rank_ == 0) {
      for_bucket_params(bi, [&](at::Tensor& p, const std::vector<std::int64_t>& shape, const ParamSlot&, std::size_t) {
        out.emplace_back(p, p.detach().view(shape).to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
      });
    }
    if (!held) {
      release(static_cast<int>(bi));
      hollow(static_cast<int>(bi));
    }
  }
  return out;
}

ParamStore::FrozenShare ParamStore::frozen_share_of(std::size_t j) const {
  const ParamSlot& s = flayout_.params()[j];
  const Bucket& b = flayout_.buckets()[static_cast<std::size_t>(s.bucket)];
  // The rank's chunk: flat elements [lo, hi) of the bucket.
  const std::size_t lo = b.offset + static_cast<std::size_t>(shard_rank_) * b.chunk, hi = lo + b.chunk;
  const std::size_t from = std::max(lo, s.offset), to = std::min(hi, s.offset + s.numel);
  if (from >= to) return {};
  return {from - s.offset, to - from, b.partition_offset + (from - lo)};
}

std::pair<std::size_t, std::size_t> ParamStore::frozen_share(const at::Tensor& t) const {
  const int j = frozen_index(t);
  ZERO_INTERNAL_ASSERT(j >= 0, "not a partitioned frozen parameter");
  const FrozenShare share = frozen_share_of(static_cast<std::size_t>(j));
  return {share.first, share.n};
}

void ParamStore::load_frozen_share(const at::Tensor& t, const at::Tensor& values) {
  const int j = frozen_index(t);
  ZERO_INTERNAL_ASSERT(j >= 0, "not a partitioned frozen parameter");
  const FrozenShare share = frozen_share_of(static_cast<std::size_t>(j));
  ZERO_INTERNAL_ASSERT(static_cast<std::size_t>(values.numel()) == share.n, "a frozen share of ", share.n,
                       " elements, given ", values.numel());
  if (share.n == 0) return;
  settle_gathers();  // the lane's copies out of the partition are done
  fpartition_.narrow(0, i64(share.at), i64(share.n)).copy_(values.reshape({-1}));
}

void ParamStore::regather_frozen(comm::Communicator& comm) {
  regather_held(layout_.buckets().size(), buckets_.size(), comm);
}

void ParamStore::wait_gathering(std::size_t b) {
  if (b < gathering_.size() && gathering_[b]) {
    wait_for_use(comm::WorkPtr(gathering_[b]), device_, unconfirmed_);
    gathering_[b].reset();
  }
}

void ParamStore::regather_held(std::size_t first, std::size_t last, comm::Communicator& comm) {
  // A gather still in flight (fetched ahead by a forward after backward) is
  // waited for first; its owner's later wait finds it done.
  std::vector<PendingGather> pending;
  for (std::size_t b = first; b < last; ++b) {
    if (!buckets_[b].held()) continue;
    wait_gathering(b);
    pending.push_back(start_gather(static_cast<int>(b), comm));
  }
  for (PendingGather& g : pending) finish_gather(g);
}

ParamStore::PendingGather ParamStore::start_gather(int bi, comm::Communicator& comm) {
  const Bucket& b = bucket(static_cast<std::size_t>(bi));
  // A frozen bucket's chunk: in its own partition, never on NVMe.
  const bool frozen = static_cast<std::size_t>(bi) >= layout_.buckets().size();
  ParamSwap* const swap = frozen ? nullptr : swap_.get();
  BucketStorage& st = buckets_[static_cast<std::size_t>(bi)];
  if (gathering_.size() != buckets_.size()) gathering_.resize(buckets_.size());
  ZERO_INTERNAL_ASSERT(!gathering_[static_cast<std::size_t>(bi)], "bucket ", bi,
                       "'s all-gather started while its last one is in flight");
  // A parameter replaced since construction (set_data, torch::load,
  // model->to()) is named before anything is changed: the views below would
  // put the engine's values back over it silently.
  // (Only a hollow bucket's views are put back; a held one's parameters are
  // checked by the next backward().)
  if (hollow_[static_cast<std::size_t>(bi)]) {
    for_bucket_params(static_cast<std::size_t>(bi),
                      [&](at::Tensor&, const std::vector<std::int64_t>&, const ParamSlot&, std::size_t i) {
                        check_own_storage(i);
                      });
  }
  if (!st.held()) {
    try {
      st.refill();
    } catch (const std::exception& e) {
      rethrow_if_out_of_memory(e, "gathering the parameters of a stage-3 unit (" +
                                      memory::format_bytes(static_cast<std::int64_t>(st.nbytes())) + ")",
                               *ledger_,
                               "fewer parameters gathered at once (a smaller zero_optimization."
                               "stage3_prefetch_bucket_size fetches less ahead, a smaller stage3_max_live_parameters "
                               "keeps fewer units gathered, smaller units hold less each)");
      throw;
    }
    // Budgeted at construction (the plan's gathered units at their bound):
    // not refused here, inside forward, where one rank could fail alone.
    register_bucket(static_cast<std::size_t>(bi), "the gathered units");
  }
  if (hollow_[static_cast<std::size_t>(bi)]) view_params(static_cast<std::size_t>(bi), /*full=*/true);
  const std::size_t mine = static_cast<std::size_t>(shard_rank_) * b.chunk;
  const at::Tensor dst = st.raw(mine, b.chunk);
  const at::Tensor src = swap       ? swap->chunk(bi)
                         : frozen   ? fpartition_.narrow(0, i64(b.partition_offset), i64(b.chunk))
                                    : partition_.narrow(0, i64(b.partition_offset), i64(b.chunk));
  PendingGather g;
  try {
    if (lane_) {
      lane_->copy(dst, src, st.tensor(), static_cast<std::size_t>(bi), timeline_);
    } else {
      dst.copy_(src);
    }
  } catch (...) {
    if (swap) swap->done_with(bi);
    throw;
  }
  if (swap && lane_) {
    // The chunk's buffer is written again only once the lane's copy out of it is done.
    swap->done_with(bi, [lane = lane_.get(), m = lane_->mark()] { lane->host_waits(m); });
  } else if (swap) {
    swap->done_with(bi);
  }
  if (layout_.shard_world() <= 1) {
    if (lane_) g.ready = lane_->mark();
    return g;
  }
  const at::Tensor all = st.raw(0, b.padded);
  auto* base = static_cast<char*>(all.data_ptr());
  auto issue = [&] {
    return comm.all_gather(base + mine * all.element_size(), base, b.chunk, to_dtype(dtype_), {bucket_tag(bi)});
  };
  // After the lane's copy; then the host's wait for the all-gather covers it.
  g.work = lane_ ? lane_->issue_after(comm, issue) : issue();
  g.bucket = bi;
  gathering_[static_cast<std::size_t>(bi)] = g.work;
  return g;
}

void ParamStore::open_swap(const std::filesystem::path& file, offload::SwapFile::Options io, const DeviceContext& ctx,
                           memory::MemoryLedger& ledger) {
  const PlannedBuffer& part = (*plan_)[Buffer::kParamPartition];
  const PlannedBuffer& bufs = (*plan_)[Buffer::kParamSwapBuffers];
  ZERO_INTERNAL_ASSERT(part.tier == memory::Tier::kNvme && bufs.present, "the plan keeps the parameters off NVMe");
  at::Tensor slots = ctx.host_tensor(bufs.elements, at::kByte);
  register_planned(ledger, regs_, bufs, slots);
  swap_ = std::make_unique<ParamSwap>(layout_, dtype_, std::move(slots), file, io);
  // The file, as the plan has it: the chunks and their rounding to 4096 bytes.
  regs_.push_back(ledger.add(part.tier, part.kind, part.valid_bytes(), part.what));
  regs_.push_back(ledger.add(part.tier, memory::Kind::kPadding, part.bytes() - part.valid_bytes(), part.what));
}

void ParamStore::finish_gather(PendingGather& g) {
  if (g.bucket >= 0 && gathering_[static_cast<std::size_t>(g.bucket)] == g.work) {
    gathering_[static_cast<std::size_t>(g.bucket)].reset();
  }
  if (g.work) wait_for_use(std::move(g.work), device_, unconfirmed_);
  if (g.ready) lane_->compute_waits(*g.ready);
  g = PendingGather{};
}

void ParamStore::settle_gathers() {
  if (lane_) lane_->host_waits();
}

void ParamStore::confirm_collectives(bool quiet) {
  std::vector<comm::WorkPtr> works;
  works.swap(unconfirmed_);
  for (const comm::WorkPtr& w : works) {
    try {
      w->wait();
    } catch (...) {
      if (!quiet) throw;
    }
  }
}

void ParamStore::register_bucket(std::size_t bi, const char* what) {
  const Bucket& b = bucket(bi);
  const std::size_t es = c10::elementSize(dtype_);
  auto& regs = bucket_regs_[bi];
  regs[0] = ledger_->add(memory::Tier::kDevice, memory::Kind::kHalfParams, i64(b.numel * es), what,
                         /*check_budget=*/false);
  regs[1] = ledger_->add(memory::Tier::kDevice, memory::Kind::kPadding, i64((b.padded - b.numel) * es), what,
                         /*check_budget=*/false);
}

void ParamStore::release(int bi) {
  buckets_[static_cast<std::size_t>(bi)].release();
  for (auto& r : bucket_regs_[static_cast<std::size_t>(bi)]) r.release();
}

void ParamStore::hollow(int bi) {
  const auto b = static_cast<std::size_t>(bi);
  if (!buckets_[b].held() && !hollow_[b]) view_params(b, /*full=*/false);
}

void ParamStore::hollow_released() {
  for (std::size_t b = 0; b < buckets_.size(); ++b) hollow(static_cast<int>(b));
}

void ParamStore::view_params(std::size_t bi, bool full) {
  const Bucket& b = bucket(bi);
  const at::Tensor& t = buckets_[bi].tensor();
  // set_data keeps the parameter's autograd metadata, version counter and
  // storage (check_intact() still knows it); only its shape changes.
  if (full_grad_nodes_.size() != params_.size() + fparams_.size()) {
    full_grad_nodes_.resize(params_.size() + fparams_.size());
    full_versions_.resize(params_.size() + fparams_.size());
  }
  // Only a change of state moves the gradient nodes and version counters.
  const bool changes = full == (hollow_[bi] != 0);
  for_bucket_params(bi, [&](at::Tensor& p, const std::vector<std::int64_t>& shape, const ParamSlot& s,
                            std::size_t i) {
    replace_data(p, full ? t.narrow(0, i64(s.offset - b.offset), i64(s.numel)).view(shape)
                         : t.narrow(0, i64(s.offset - b.offset), 0));
    if (!changes) return;
    c10::TensorImpl* impl = p.unsafeGetTensorImpl();
    c10::VariableVersion& version = full_versions_[i];
    if (full && version.enabled()) {
      impl->set_version_counter(std::move(version));
      version = c10::VariableVersion();
    } else if (!full && !version.enabled() && impl->version_counter().enabled()) {
      version = impl->version_counter();
      impl->set_version_counter(c10::VariableVersion(version.current_version() + (1u << 30)));
    }
    if (auto* meta = torch::autograd::impl::get_autograd_meta(p)) {
      std::lock_guard<std::mutex> lock(meta->mutex_);
      std::weak_ptr<torch::autograd::Node>& kept = full_grad_nodes_[i];
      if (full) {
        meta->grad_accumulator_ = kept;  // the full one (or none: made anew)
        kept.reset();
      } else {
        kept = meta->grad_accumulator_;
        meta->grad_accumulator_.reset();
      }
    }
  });
  hollow_[bi] = full ? 0 : 1;
}

std::size_t ParamStore::zero_fill_released() noexcept {
  std::size_t emptied = 0;
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
    BucketStorage& st = buckets_[bi];
    if (st.held()) continue;
    try {
      st.refill();
      st.raw(0, static_cast<std::size_t>(st.tensor().numel())).zero_();
      if (hollow_[bi]) view_params(bi, /*full=*/true);
      continue;
    } catch (const std::exception&) {
    }
    // No memory for it (the error being unwound is often that): its
    // parameters become empty tensors, so that any use of them fails on its
    // shape and nothing reads storage that is gone.
    try {
      at::NoGradGuard no_grad;
      for_bucket_params(bi, [](at::Tensor& p, const std::vector<std::int64_t>&, const ParamSlot&, std::size_t) {
        p.set_(at::empty({0}, p.options()));
      });
      ++emptied;
    } catch (const std::exception&) {
    }
  }
  return emptied;
}

}  // namespace zero::detail
