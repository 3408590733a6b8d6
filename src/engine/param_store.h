// The module's parameters as the engine holds them: the trainable ones (each
// once, in the module's order) as views into one flat buffer in the training
// precision, laid out by zero/flat_layout.h; the frozen ones and the
// floating-point buffers cast to that precision; all equal to rank 0's at
// construction. After a step, publish() brings the rank's updated chunks
// into the flat buffer and all-gathers them from every rank.
//
// Stage 3 (partitioned(); param_store_stage3.cpp): the rank holds its
// partition of the training-precision parameters (on the device, or in host
// memory with offload_param), and each bucket's parameters are views of a
// BucketStorage that is gathered from every rank's partition and released
// again, unit by unit (unit_schedule.h). Buckets of no unit stay gathered.
// publish() then writes the partition, and all-gathers only the buckets
// that are gathered at the time. With the partition in host memory on a
// GPU, the rank's chunk goes up on a stream of its own (gather_lane.h).
// With offload_param.device "nvme" the partition is in a swap file instead
// (param_swap.h): a gather reads the rank's chunk from it (read ahead), a
// publish writes it.
// Frozen parameters of a unit (a base model under adapters) are partitioned
// too, in a layout of their own (the plan's frozen_layout) whose buckets
// follow the trainable ones in the bucket numbering: gathered and released
// with their unit, never reduced, stepped or published. Their partition is
// on the device, or in host memory with offload_param (NVMe included).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Event.h>
#include <torch/nn/module.h>

namespace torch::autograd {
struct Node;
}

#include "bucket_storage.h"
#include "device_context.h"
#include "gather_lane.h"
#include "module_guard.h"
#include "param_claim.h"
#include "param_swap.h"
#include "step_timeline.h"
#include "zero/comm/communicator.h"
#include "zero/core/error.h"
#include "zero/memory/memory_ledger.h"
#include "zero/zero/flat_layout.h"
#include "zero/zero/memory_plan.h"

namespace zero::optim {
class ThreadPool;
}

namespace zero::detail {

class ParamStore {
 public:
  // Fills a tensor that was on the meta device (EngineOptions::init).
  using InitFn = std::function<void(const std::string& name, const at::Tensor& value)>;
  // Collects the trainable parameters (each once; they must be fp32).
  // `target`: the device to train on (none: where the parameters are, all
  // on one device). Tensors on the meta device are filled by `init`, which
  // is required then and refused otherwise. Throws before changing anything.
  ParamStore(std::shared_ptr<torch::nn::Module> module, c10::ScalarType dtype, int world, int rank,
             std::optional<c10::Device> target = std::nullopt, InitFn init = {});
  // Their sizes, in the module's order.
  std::vector<std::size_t> numels() const;
  // Stage 3, before use_plan(): the frozen parameters it may partition
  // (each once, floating point, and in the training precision once cast:
  // in fp32 training an fp64 one stays whole), in the module's order; then
  // each one's unit (assign_units; -1: stays whole). Those of a unit are
  // partitioned (frozen_numels(), frozen_groups(): the plan's input).
  std::vector<at::Tensor> frozen_candidates() const;
  void select_frozen(const std::vector<at::Tensor>& candidates, const std::vector<int>& groups);
  std::vector<std::size_t> frozen_numels() const;
  const std::vector<int>& frozen_groups() const { return fgroups_; }
  // The layout and partition the memory plan chose (zero/zero/memory_plan.h).
  void use_plan(const MemoryPlan& plan);

  const std::vector<at::Tensor>& params() const { return params_; }
  // Parameter i's shape in the module (at stage 3 a released one is hollow:
  // read its shape here, not from the tensor).
  c10::IntArrayRef shape(std::size_t i) const { return shapes_[i]; }
  // Their names in the module (a tied parameter: its first name).
  const std::vector<std::string>& names() const { return names_; }
  // Once built: which storage each trainable parameter (and each frozen one
  // stage 3 partitions) views. check_intact()
  // then says, naming it, when the module's parameter was replaced since
  // (model->to(), set_data()): the engine would train tensors the module no
  // longer has.
  void remember_storages();
  // Also that the trainable ones still require a gradient and the frozen
  // ones do not, and that the module has no parameter it did not have then
  // (one registered since, or a submodule replaced): each change would be
  // ignored silently.
  void check_intact() const;
  // Parameter i's (trainable first, then stage 3's partitioned frozen ones)
  // storage check alone: also before stage 3 puts a gathered unit's views
  // in place, which would otherwise overwrite a replacement silently.
  void check_own_storage(std::size_t i) const;
  std::int64_t frozen_count() const { return frozen_; }
  // The frozen parameters' bytes on the device, once construction is done
  // (in the training precision where they are floating point).
  std::int64_t frozen_bytes() const { return frozen_bytes_; }
  // Stage 3: the frozen parameters partitioned with their units (not in
  // frozen_bytes()): how many, and their bytes in the training precision.
  std::size_t frozen_partitioned() const { return fparams_.size(); }
  std::int64_t frozen_partitioned_bytes() const;
  // Whether `t` is one of them; its shape in the module (it is hollow
  // while released).
  bool partitions_frozen(const at::Tensor& t) const { return frozen_index(t) >= 0; }
  c10::IntArrayRef frozen_shape(const at::Tensor& t) const;
  // Every partitioned frozen parameter's value, whole, in host memory on
  // rank 0 (checkpoints): their buckets gathered one at a time where not
  // gathered already (collective). Other ranks get nothing.
  std::vector<std::pair<at::Tensor, at::Tensor>> frozen_values_on_host(comm::Communicator& comm);
  // What a load reads of partitioned frozen parameter `t`: its elements
  // [first, first + n) that lie in this rank's chunk (n may be 0), and
  // their loaded values (n elements, any floating dtype) into the rank's
  // share. Then regather_frozen(): the frozen buckets gathered at the time
  // (a gather_parameters() scope) all-gathered again (collective).
  std::pair<std::size_t, std::size_t> frozen_share(const at::Tensor& t) const;
  void load_frozen_share(const at::Tensor& t, const at::Tensor& values);
  void regather_frozen(comm::Communicator& comm);
  const FlatLayout& layout() const { return layout_; }
  // Stage 3's buckets: the layout's (0 .. layout().buckets().size() - 1),
  // then the frozen layout's. bucket(b): either.
  std::size_t bucket_count() const { return buckets_.size(); }
  const Bucket& bucket(std::size_t b) const {
    const std::size_t nt = layout_.buckets().size();
    return b < nt ? layout_.buckets()[b] : flayout_.buckets()[b - nt];
  }
  // Unit g's buckets of frozen parameters, in that numbering.
  std::vector<int> frozen_group_buckets(int g) const;
  c10::Device device() const { return device_; }
  int shard_rank() const { return shard_rank_; }
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }

  // Construction, in this order (the ledger's construction peak depends on it):
  // 1. the full fp32 parameters, flat, on the device, equal to rank 0's
  //    (counted in the ledger while they live);
  at::Tensor initial_fp32(comm::Communicator& comm, memory::MemoryLedger& ledger);
  // 2. (the caller seeds the master weights from it, then) the flat
  //    training-precision buffer made from it, the parameters made views of
  //    it, frozen parameters and floating-point buffers cast and broadcast.
  //    `flat32` is consumed. Changes go through `guard`.
  void adopt(at::Tensor flat32, comm::Communicator& comm, memory::MemoryLedger& ledger, ModuleGuard& guard);

  // Stage 3's construction instead of the two above, one bucket at a time:
  // each bucket in fp32 (rank 0's values), `seed(b, chunk32)` with the
  // rank's fp32 chunk (the master weights), the rank's chunk into the
  // partition, the parameters made views of the bucket's storage, which is
  // then released (buckets of no unit stay). Frozen parameters and buffers
  // as in adopt().
  using SeedFn = std::function<void(const Bucket&, const at::Tensor&)>;
  void adopt_partitioned(comm::Communicator& comm, memory::MemoryLedger& ledger, ModuleGuard& guard,
                         const SeedFn& seed, const DeviceContext& ctx);
  // Stage 3 with the partition on NVMe (the plan's kParamPartition in the
  // nvme tier), before adopt_partitioned(): the host buffers and the swap
  // file `file` (SwapFile's errors name the folder and the fix).
  void open_swap(const std::filesystem::path& file, offload::SwapFile::Options io, const DeviceContext& ctx,
                 memory::MemoryLedger& ledger);
  const ParamSwap* swap() const { return swap_.get(); }
  ParamSwap* swap() { return swap_.get(); }  // (checkpoints stream the partition through it)
  // Its reads and writes since the last call (zeros without it).
  ParamSwap::Counters take_swap_counters() { return swap_ ? swap_->take_counters() : ParamSwap::Counters{}; }
  bool partitioned() const { return partitioned_; }
  // Stage 3: bucket b's parameters from every rank's partition. Started
  // (the storage refilled, the rank's chunk copied in, or queued on the
  // gather lane, and the all-gather issued); finish_gather() completes it:
  // the host waits for the all-gather, the compute stream for the lane.
  // Every started gather is finished before its bucket is released.
  struct PendingGather {
    comm::WorkPtr work;                     // the all-gather (several ranks)
    std::optional<GatherLane::Mark> ready;  // the lane's copy (one rank)
    int bucket = -1;
  };
  PendingGather start_gather(int b, comm::Communicator& comm);
  void finish_gather(PendingGather& g);
  // Before the host writes the partition: the gather lane's copies that may
  // still read it are done.
  void settle_gathers();
  // The all-gathers (stage 3's, and publish()'s) that only the device
  // waited for (a device backend), waited for on the host: once per
  // backward, where a failure or comm_timeout shows. `quiet`: their errors
  // are dropped (after another error).
  void confirm_collectives(bool quiet = false);
  void release(int b);
  // Stage 3: a released bucket's parameters made hollow, shape [0] on the
  // same storage, so that reading one outside its unit gives an empty
  // tensor, not a read of freed memory (DeepSpeed's convention); gathering
  // the bucket gives them their shapes back. Not while a backward may still
  // run: autograd's AccumulateGrad, which may come after the unit's release,
  // reads its parameter's shape (UnitSchedule hollows at the end of
  // backward). hollow_released(): every released bucket not hollow yet.
  void hollow(int b);
  void hollow_released();
  bool gathered(int b) const { return buckets_[static_cast<std::size_t>(b)].held(); }
  // Whether `t` is a view into bucket b's gathered memory.
  bool in_bucket(int b, const at::Tensor& t) const {
    const at::Tensor& mine = buckets_[static_cast<std::size_t>(b)].tensor();
    return t.has_storage() && mine.defined() && t.storage().is_alias_of(mine.storage());
  }
  // Stage 3, when the engine goes while unwinding (no collective then):
  // released buckets get zeros, so that the module can be given back. A
  // bucket with no memory for it leaves its parameters empty (0 elements);
  // returns how many did.
  std::size_t zero_fill_released() noexcept;

  // After a step: `src` (the rank's updated partition, fp32 master or
  // training-precision staging; undefined when the optimizer wrote the flat
  // buffer itself) into the rank's chunks, then the all-gather (stage >= 1).
  // `offloaded`: src is in host memory (the copies are counted). On a GPU
  // with a copy stream the copies go there, and the compute stream waits
  // for them on the device.
  void publish(const at::Tensor& src, bool offloaded, comm::Communicator& comm, const DeviceContext& ctx);
  // publish() in its three parts, so that each chunk can go up as soon as
  // the CPU step has finished it (the delayed update on a GPU): begin, then
  // pieces of the buckets' chunks in any order, each element once (`offset`
  // within bucket b's chunk, `n` elements; "<kind> <index>" names it on the
  // timeline), then end (the all-gather). `ctx` must outlive the publish.
  // A piece's source: elements [base, base + numel) of the partition in
  // `values`; `host`: in host memory (its copies up are counted).
  struct UpdateSource {
    at::Tensor values;
    std::size_t base = 0;
    bool host = false;
  };
  void begin_publish(bool offloaded, const DeviceContext& ctx);
  // In a publish begun earlier (during backward): the pieces from here on
  // go after what the compute stream has queued by now (on the CPU: nothing
  // to order).
  void publish_after_current();
  void publish_piece(const UpdateSource& src, const Bucket& b, std::size_t offset, std::size_t n, const char* kind,
                     std::size_t index);
  void end_publish(comm::Communicator& comm);
  // Where the copies up are traced (Engine::trace()); null: nowhere.
  void set_timeline(StepTimeline* timeline) { timeline_ = timeline; }
  // The threads a publish's host-to-host copies run on (the partition in
  // host memory with offload_param, the update in host memory): the CPU
  // step's pool, so that a copy made while the delayed update still steps
  // takes turns with its pieces instead of putting LibTorch's intra-op
  // threads beside them (docs/PERFORMANCE.md, 2026-11-28 21:42). Null:
  // Tensor::copy_.
  void set_host_copy_pool(optim::ThreadPool* pool) { host_copy_pool_ = pool; }
  // The rank's chunk of bucket b in the training precision: in the flat
  // buffer, or at stage 3 in the partition (not on NVMe: read_rank_chunk()).
  at::Tensor rank_chunk(const Bucket& b) const {
    ZERO_INTERNAL_ASSERT(!swap_, "the parameter partition is on NVMe: read it with read_rank_chunk()");
    if (partitioned_) {
      return partition_.narrow(0, static_cast<std::int64_t>(b.partition_offset), static_cast<std::int64_t>(b.chunk));
    }
    return flat_.narrow(0, static_cast<std::int64_t>(chunk_flat_offset(b)), static_cast<std::int64_t>(b.chunk));
  }
  // The rank's chunk of bucket b to read (checkpoints): rank_chunk(b), or a
  // host copy read from the swap file.
  at::Tensor read_rank_chunk(const Bucket& b);
  // Every chunk of the rank's partition from `values` (the partition's
  // elements, any floating dtype): copied, or written to the swap file.
  void write_partition(const at::Tensor& values);
  // The same from values(offset, n): the partition's elements [offset,
  // offset + n), a chunk at a time (the partition is never whole in memory).
  void write_partition(const std::function<at::Tensor(std::size_t, std::size_t)>& values);
  // Elements [offset, offset + values.numel()) of the rank's chunk of bucket
  // b from `values` (any floating dtype): copied, or the chunk read from the
  // swap file, patched and written back.
  void write_chunk_range(const Bucket& b, std::size_t offset, const at::Tensor& values);
  // Blocks until the last publish()'s copies are done: its host-to-device
  // copies (before their source is written again) and, with offload_param,
  // the device share's copies down into the host partition (before the host
  // reads or writes it: checkpoints).
  void wait_up() const;
  // Bytes copied host -> device since the last call.
  std::uint64_t take_copied_bytes();

  // The full fp32 parameters from every rank's master partition, one tensor
  // per trainable parameter, on the host (collective).
  std::vector<at::Tensor> gather(const at::Tensor& master, comm::Communicator& comm) const;

 private:
  std::size_t chunk_flat_offset(const Bucket& b) const {
    return b.offset + static_cast<std::size_t>(shard_rank_) * b.chunk;
  }
  void all_gather(comm::Communicator& comm);
  // Parameter i's initial value into `dst` (fp32, flat, on the device):
  // copied, or made by init when the parameter is on the meta device.
  void initial_value(std::size_t i, const at::Tensor& dst) const;
  // `value` (on the device) filled by init for the meta tensor `name`.
  void run_init(const std::string& name, const at::Tensor& value) const;
  // Also counts their bytes in the ledger (budget checked): every rank holds
  // them whole, at every stage.
  void cast_frozen_and_buffers(comm::Communicator& comm, ModuleGuard& guard, memory::MemoryLedger& ledger);
  // Stage 3: bucket bi's gathered bytes into the ledger (values, padding),
  // not checked against the budget (the construction check covers them).
  void register_bucket(std::size_t bi, const char* what);
  // Bucket bi's parameters as views of its storage: full (their shapes) or hollow.
  void view_params(std::size_t bi, bool full);
  // Bucket bi's parameters: f(tensor, shape, slot, index) for each, `index`
  // counting the trainable ones first, then the partitioned frozen ones.
  template <class F>
  void for_bucket_params(std::size_t bi, F&& f);
  // Stage 3's construction of the partitioned frozen parameters, after the
  // trainable ones (the same fp32 bucket buffer).
  void adopt_frozen(const at::Tensor& flat32, comm::Communicator& comm, ModuleGuard& guard, const DeviceContext& ctx);
  // The partitioned frozen parameter `t`'s index in fparams_, or -1.
  int frozen_index(const at::Tensor& t) const;
  // Partitioned frozen parameter j's elements in this rank's chunk: from
  // element `first` of it, `n` of them (maybe 0), at `at` in fpartition_.
  struct FrozenShare {
    std::size_t first = 0, n = 0, at = 0;
  };
  FrozenShare frozen_share_of(std::size_t j) const;
  // Bucket b's all-gather still in flight (a unit fetched ahead), waited for.
  void wait_gathering(std::size_t b);
  // Buckets [first, last) that are gathered now all-gathered again from the
  // partitions (collective).
  void regather_held(std::size_t first, std::size_t last, comm::Communicator& comm);

  std::shared_ptr<torch::nn::Module> module_;
  c10::ScalarType dtype_;
  c10::Device device_{c10::kCPU};  // where the engine trains
  InitFn init_;
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::vector<std::int64_t>> shapes_;
  ParamClaim claim_;  // no other live engine trains these parameters
  std::vector<const c10::StorageImpl*> storages_;
  // Every parameter of the module once built, sorted (check_intact).
  std::vector<const c10::TensorImpl*> module_params_;
  std::int64_t frozen_ = 0, frozen_bytes_ = 0;
  // The frozen parameters as built (check_intact: still frozen).
  std::vector<std::pair<std::string, at::Tensor>> frozen_params_;
  FlatLayout layout_;
  int world_ = 1, rank_ = 0, shard_rank_ = 0;
  const MemoryPlan* plan_ = nullptr;
  at::Tensor flat_;  // the training-precision parameters, layout_.padded_numel()
  memory::MemoryLedger::Registration flat32_temp_;
  std::vector<memory::MemoryLedger::Registration> regs_;
  std::shared_ptr<c10::Event> up_done_;
  std::uint64_t copied_ = 0;
  // The publish under way: whether its source is on the host, and the
  // stream its copies go on (none: synchronous, on the caller's stream).
  bool publish_offloaded_ = false;
  const DeviceContext* publish_ctx_ = nullptr;
  std::optional<c10::Stream> publish_stream_, publish_compute_;
  StepTimeline* timeline_ = nullptr;
  optim::ThreadPool* host_copy_pool_ = nullptr;
  void copy_on_pool(const at::Tensor& dst, const at::Tensor& from, const char* kind, std::size_t index);
  // Stage 3's partitioned frozen parameters: each once, their names and
  // shapes, their units, their layout and the rank's partition of them.
  std::vector<at::Tensor> fparams_;
  std::vector<std::string> fnames_;
  std::vector<std::vector<std::int64_t>> fshapes_;
  std::vector<int> fgroups_;
  FlatLayout flayout_;
  at::Tensor fpartition_;
  // Stage 3.
  bool partitioned_ = false;
  at::Tensor partition_;                // the rank's chunks of every bucket, training precision
  // The partition on NVMe (partition_ then undefined). Before lane_: its
  // buffers outlive the copies the lane may still run out of them.
  std::unique_ptr<ParamSwap> swap_;
  std::vector<BucketStorage> buckets_;  // one per bucket of the layout, then of the frozen layout
  std::vector<std::array<memory::MemoryLedger::Registration, 2>> bucket_regs_;  // while held: values, padding
  std::vector<char> hollow_;            // per bucket: its parameters are hollow
  // Per parameter: its gradient node (AccumulateGrad) of full shape, set
  // aside while it is hollow, so that a use of the hollow parameter (a loss
  // term outside its unit) gets a node of its own, whose shape [0] names the
  // mistake after a failed backward (released_use.h), and the unit's next
  // call in the same graph gets the full one back.
  std::vector<std::weak_ptr<torch::autograd::Node>> full_grad_nodes_;
  // Per parameter: its version counter, set aside while it is hollow. A
  // hollow parameter counts versions on a counter of its own, 2^30 ahead:
  // a graph that saved it hollow (a loss term outside its unit) then fails
  // autograd's version check in backward instead of reading it when its
  // storage is released (it keeps its full shape inside a backward).
  std::vector<c10::VariableVersion> full_versions_;
  memory::MemoryLedger* ledger_ = nullptr;
  // Where the rank's chunk goes into a bucket when not on the caller's
  // stream (a host partition on a GPU; the deferred lane in tests). After
  // partition_: destroyed first, waiting for the copies that read it.
  std::unique_ptr<GatherLane> lane_;
  std::vector<comm::WorkPtr> unconfirmed_;  // all-gathers ordered on the device only
  // Stage 3: each bucket's all-gather started and not yet finished (a unit
  // fetched ahead whose use did not come: a forward with gradients between
  // backward() and step()). A bucket's rank chunk is the send buffer of its
  // all-gather: no second gather may write it before the first is done.
  std::vector<comm::WorkPtr> gathering_;
  // Bucket b's index in the layout (b may be another copy of the layout's:
  // the optimizer's), found by its place in the partition.
  int bucket_index(const Bucket& b) const {
    const std::vector<Bucket>& all = layout_.buckets();
    const auto it = std::lower_bound(all.begin(), all.end(), b.partition_offset,
                                     [](const Bucket& x, std::size_t at) { return x.partition_offset < at; });
    ZERO_INTERNAL_ASSERT(it != all.end() && it->partition_offset == b.partition_offset && it->chunk == b.chunk,
                         "no bucket of the layout starts at partition element ", b.partition_offset);
    return static_cast<int>(it - all.begin());
  }
};

}  // namespace zero::detail
