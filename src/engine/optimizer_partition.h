// The optimizer's state for this rank's partition: the fp32 master weights
// and the moments (on the device, or on the host with offload), the staging
// buffer the CPU step writes the updated training-precision parameters to,
// the CPU thread pool, and the step itself: the CPU Adam/Adagrad/Lion kernels on
// host memory, the registered device Adam or Lion (zero/optim/device_kernel_registry.h)
// on a GPU; with Muon, the update of its matrices applied (the
// orthogonalization before it is muon_step.h's, which needs collectives).
// No collectives in here: the DPU worker runs step().
//
// Offload with offload_optimizer.ratio < 1 (DeepSpeed's Twin-Flow) splits
// the partition in two shares at MemoryPlan::offload_split: the main share
// [0, split) on the host, stepped by the CPU kernels, and the device share
// [split, partition) whose master, moments and staging stay on the device,
// stepped by the device Adam beside the CPU step (on the CPU, where the
// "device" is host memory too, by the CPU kernels). Without offload the
// main share is the whole partition.
//
// With offload_optimizer.device "nvme" (ZeRO-Infinity) the main share's
// master and moments live in a swap file (zero/offload/swap_file.h), each
// piece's states in a slot of their own, and the step goes through the
// pieces with buffer_count host buffers: the pieces ahead are read while
// one is stepped and the ones behind are written. Outside the step a state
// is read whole into a temporary tensor (state()), or streamed a block at a
// time (read_state_bytes(), write_state_bytes(): the checkpoints).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "device_context.h"
#include "param_hypers.h"
#include "zero/config/config.h"
#include "zero/core/dtype.h"
#include "zero/memory/memory_ledger.h"
#include "zero/offload/swap_file.h"
#include "zero/offload/swap_stream.h"
#include "zero/optim/device_kernel_registry.h"
#include "zero/optim/thread_pool.h"
#include "zero/zero/flat_layout.h"
#include "zero/zero/memory_plan.h"
#include "zero/zero/partition_runs.h"

namespace zero::detail {

// What a step's schedule sets: the learning rate, and Adam's and Lion's
// betas (the config's, or OneCycle's momentum cycle).
struct StepRates {
  float lr;
  float beta1, beta2;
};

class OptimizerPartition {
 public:
  struct Options {
    bool offload = false;         // state in host memory, the CPU kernels
    bool nvme = false;            // offload too: the state in a swap file under nvme_path
    c10::ScalarType dtype = c10::ScalarType::Float;  // the training precision
    // Each parameter's own weight decay and lr scale (EngineOptions'
    // rules), in the layout's order; empty: the config's decay and the
    // engine's rate for all.
    ParamHypers hypers;
    // Optimizer "Muon": each half's share of the step's rate.
    float muon_lr_scale = 1.0f, adam_lr_scale = 1.0f;
  };
  // Throws before allocating when the device has no kernel for the optimizer.
  OptimizerPartition(const config::Config& config, const MemoryPlan& plan, const DeviceContext& ctx,
                     Options options, memory::MemoryLedger& ledger);

  // The master partition from the rank's chunks of `flat32` (the full fp32
  // parameters).
  void seed_master(const at::Tensor& flat32);
  // The same bucket by bucket (stage 3 never holds the full parameters):
  // allocate, then each bucket's chunk (fp32, b.chunk elements) once.
  void allocate_master();
  void seed_master_chunk(const Bucket& b, const at::Tensor& chunk32);
  // The moments (zeros; Adagrad: its initial accumulator). Allocated after
  // the caller has freed its construction temporaries.
  void allocate_moments();

  // The step goes through the partition in pieces, bucket by bucket in the
  // layout's order, so that each finished piece can be copied up while the
  // next ones are stepped: about an eighth of a bucket's chunk (the copy of
  // the last piece is what the next forward waits for), at most
  // kStepPieceMax, in multiples of kStepPieceAlign elements (memory_plan.h:
  // step_piece_elements; with NVMe at most sub_group_size too). Each piece is
  // a whole dispatch of the thread pool: pieces of 16M elements made the CPU
  // Adam of a 1.2B model ~20% slower beside a GPU than pieces of 60M
  // (docs/PERFORMANCE.md).
  // A piece never straddles the two shares; the device share's pieces are
  // whole buckets' segments (one kernel each, or one per run of equal
  // settings where EngineOptions' rules give some; nothing waits for them piece
  // by piece).
  enum class Share : std::uint8_t { kMain, kDevice };
  struct Piece {
    const Bucket* bucket;
    std::size_t offset;  // within the bucket's chunk
    std::size_t n;
    std::size_t index;   // in pieces(share)
    Share share;
    std::size_t at() const { return bucket->partition_offset + offset; }  // in the partition
  };
  const std::vector<Piece>& pieces(Share share = Share::kMain) const {
    return share == Share::kMain ? pieces_ : device_pieces_;
  }
  // Where the device share begins (the partition's size when there is none).
  std::size_t split() const { return split_; }
  // The layout its pieces' buckets point into.
  const FlatLayout& layout() const { return layout_; }
  // The CPU step's threads: the publish's host-to-host copies (offload_param
  // on a GPU) share them instead of running beside them.
  optim::ThreadPool& pool() const { return *pool_; }
  bool has_device_share() const { return !device_pieces_.empty(); }

  // One step of one share. grads(piece): the piece's gradients (n elements);
  // half_out(piece, grad): where its updated training-precision values go
  // (nullptr: nowhere, as in fp32); after_piece (optional): a piece is done,
  // its half_out written.
  using GradsFn = std::function<at::Tensor(const Piece&)>;
  using HalfOutFn = std::function<void*(const Piece&, const at::Tensor& grad)>;
  using PieceDoneFn = std::function<void(const Piece&)>;
  void step(Share share, const GradsFn& grads, const HalfOutFn& half_out, float grad_scale, const StepRates& rates,
            std::int64_t step, const PieceDoneFn& after_piece = {});

  // The main share's fp32 master weights (the whole partition without a
  // device share); undefined with NVMe (state(), or in fp32 staging()).
  const at::Tensor& master() const { return master_; }
  // The whole partition's master weights in one tensor where the main share
  // is (a copy when there is a device share).
  at::Tensor full_master() const;
  // The updated training-precision values of the main share (offload with
  // staging) and of the device share (bf16/fp16).
  const at::Tensor& staging() const { return staging_; }
  const at::Tensor& device_staging() const { return dev_staging_; }
  const at::Tensor& device_master() const { return dev_master_; }
  // The main share's moments (undefined with NVMe): Muon's momentum and
  // update for its matrices (muon_step.h).
  const at::Tensor& exp_avg() const { return exp_avg_; }
  const at::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  int moments() const { return opt_.moments(); }
  // Each parameter's own settings (empty: the config's for all).
  const ParamHypers& hypers() const { return o_.hypers; }

  // The engine is going: the master weights, the moments and the staging
  // are freed now (before the module gets fp32 tensors of its own back), not
  // after. Nothing may use the partition afterwards.
  void release_state();

  // NVMe: makes the swap file and the buffers (allocate_master() does it
  // too; the engine calls it first, under a rank agreement, since one rank's
  // disk can fail alone). The main share's state is then in the file.
  void open_swap();
  bool swapped() const { return swap_ != nullptr; }
  enum class State : std::uint8_t { kMaster, kExpAvg, kExpAvgSq };
  // One state of the whole partition in partition order: the live tensors,
  // or (NVMe) a host copy read from the swap file.
  std::vector<at::Tensor> state(State s) const;
  // Elements [offset, offset + n) of state `s` in partition order, in a new
  // fp32 tensor where the main share is (NVMe: read a block at a time), and
  // their counterpart: `values` (any floating dtype) written there (NVMe:
  // through the swap buffers, the writes finished). Never beside a step.
  at::Tensor state_slice(State s, std::size_t offset, std::size_t n) const;
  void write_state_slice(State s, std::size_t offset, const at::Tensor& values);
  // NVMe, for a save that streams the state to its file instead of holding
  // it in host memory: up to `n` bytes of state `s` (fp32, partition order)
  // from byte `offset` on, read into `buf` (aligned to SwapFile::kAlign,
  // `cap` bytes, at least two kAlign); returns where they begin in `buf`
  // and how many were read (at least one; fewer where a piece ends). Reads
  // only: safe beside other readers, never beside a step.
  std::pair<const char*, std::size_t> read_state_bytes(State s, std::uint64_t offset, std::size_t n, char* buf,
                                                       std::size_t cap) const;
  // NVMe, for a load that streams the state from its file: `n` bytes of
  // state `s` from byte `offset` on (any alignment: the 4096-byte blocks
  // at the ends are read, patched and written back), through the first
  // swap buffer; in fp32 the master's bytes go to the staging copy too (from
  // which fp32 publishes). Never beside a step.
  void write_state_bytes(State s, std::uint64_t offset, const void* src, std::size_t n);
  // The writes write_state_bytes() left under way (one, where two swap
  // buffers take turns), waited for; rethrows the first one's error. Called
  // after the last range, before anything else uses the swap buffers (also
  // after a failed load: the writes end, their errors then go with it).
  void finish_state_writes();

 private:
  at::Tensor allocate(Buffer id, c10::ScalarType dtype, bool zero);
  // NVMe.
  char* swap_buffer(std::size_t k) const;  // aligned: (1 + moments) regions of the largest piece
  // Where state `s` of a main piece is in the file: its slot holds the
  // master, then the moments, each rounded up to 4096 bytes.
  std::size_t region_at(const Piece& pc, State s) const;
  // The main piece that holds partition element `element`.
  const Piece& piece_holding(std::size_t element) const;
  // Where bytes of state `s` from partition byte `offset` on lie in the
  // file: from byte `pos`, `n` of them (at most the n asked for; no more
  // than one piece holds).
  struct StateRun {
    std::size_t pos, n;
  };
  StateRun state_run(State s, std::uint64_t offset, std::size_t n) const;
  void step_swapped(const GradsFn& grads, const HalfOutFn& half_out, float grad_scale, const StepRates& rates,
                    std::int64_t step, const PieceDoneFn& after_piece);
  void step_piece(const Piece& pc, float* master, float* m1, float* m2, const at::Tensor& g, void* half,
                  float grad_scale, const StepRates& rates, std::int64_t step, bool on_device);
  // Muon's matrices: p ← p·(1 − lr·wd) − lr·u, u the update MuonStep wrote
  // in exp_avg_sq's place; the training-precision values to `half`.
  void apply_muon(float* master, const float* update, void* half, std::size_t n, float weight_decay, float lr,
                  bool on_device) const;
  // One kernel call over n elements with one weight decay and rate (on the
  // CPU spread over `pool`; nullptr: on the calling thread).
  void step_run(float* master, float* m1, float* m2, const void* grads, DType grad_dtype, void* half, std::size_t n,
                float weight_decay, float grad_scale, const StepRates& rates, std::int64_t step, bool on_device,
                optim::ThreadPool* pool);
  static std::vector<at::Tensor> parts(const at::Tensor& main, const at::Tensor& dev) {
    std::vector<at::Tensor> v{main};
    if (dev.defined()) v.push_back(dev);
    return v;
  }

  const config::OptimizerConfig& opt_;
  const MemoryPlan& plan_;
  const FlatLayout& layout_;
  const DeviceContext& ctx_;
  Options o_;
  memory::MemoryLedger& ledger_;
  // The registered device kernel of the optimizer, where its state is on a
  // GPU (nullptr otherwise: the CPU kernels step it).
  optim::DeviceAdamFn device_adam_ = nullptr;
  optim::DeviceLionFn device_lion_ = nullptr;
  at::Tensor master_, exp_avg_, exp_avg_sq_, staging_;
  at::Tensor dev_master_, dev_exp_avg_, dev_exp_avg_sq_, dev_staging_;  // the device share
  std::size_t split_ = 0;
  std::unique_ptr<optim::ThreadPool> pool_;
  std::vector<Piece> pieces_, device_pieces_;
  PartitionRuns runs_;  // each element's class of o_.hypers (empty: the config's settings everywhere)
  std::vector<memory::MemoryLedger::Registration> regs_;
  // NVMe: the file, the slot of each main piece (byte offset), the buffers.
  offload::SwapFile::Options aio_;
  std::string swap_path_;
  at::Tensor swap_buffers_;  // (before swap_: its I/O threads end before the buffers go)
  std::unique_ptr<offload::SwapFile> swap_;
  std::vector<std::size_t> slots_;
  std::size_t swap_buffer_bytes_ = 0;
  std::size_t swap_buffer_count_ = 0;
  // write_state_bytes(): through two of the swap buffers (made at its first
  // call; after swap_: it waits for its writes before the file goes).
  std::unique_ptr<offload::SwapStreamWriter> stream_writer_;
};

}  // namespace zero::detail
