// The memory plan: every buffer the engine allocates for a configuration,
// with its tier, kind, size and lifetime — the one place that says so. The
// engine allocates from it (src/engine/), and estimate_memory()
// (memory_estimate.h) sums it, so zero-estimate and the engine's ledger
// cannot drift apart. No LibTorch here.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero/memory/memory_ledger.h"
#include "zero/zero/flat_layout.h"
#include "zero/zero/muon_plan.h"

namespace zero {

struct PlanInput {
  std::vector<std::size_t> numels;  // the trainable parameters' sizes, in the module's order
  std::size_t bucket_numel = 500'000'000;  // reduce_bucket_size
  int world = 1;
  int rank = 0;  // whose partition (the last rank's holds the most padding)
  int stage = 0;
  bool offload = false;  // offload_optimizer.device = "cpu" or "nvme"
  // offload_optimizer.device = "nvme" (offload is set too): the partition's
  // master and moments live in a swap file and go through nvme_buffers host
  // buffers (no more than there are pieces) piece by piece, pieces of at
  // most sub_group_elements.
  bool nvme = false;
  int nvme_buffers = 4;
  std::size_t sub_group_elements = 1'000'000'000;
  bool dpu = false;      // delayed parameter update
  // offload_optimizer.ratio: the share of the partition whose optimizer
  // state is offloaded; the rest stays on the device (Twin-Flow).
  double offload_ratio = 1.0;
  bool on_gpu = false;   // the module is on a GPU (offload then keeps host gradients as they come down)
  int accumulation = 1;  // gradient_accumulation_steps
  int element_bytes = 2;  // training precision: 2 (bf16/fp16) or 4 (fp32)
  int moments = 2;        // optimizer state per parameter: Adam 2, Adagrad and Lion 1
  // Stage 3: each parameter's unit (-1: none, stays gathered), the same
  // length as numels; empty: no units (every parameter stays gathered).
  std::vector<int> groups;
  // Stage 3: the frozen parameters partitioned with their units (a base
  // model under adapters): their sizes and units (each >= 0), in the
  // module's order. They have no gradient and no optimizer state: only a
  // partition (kFrozenPartition) and their share of the gathered units.
  std::vector<std::size_t> frozen_numels;
  std::vector<int> frozen_groups;
  bool offload_param = false;  // stage 3: the parameter partition in host memory
  // Stage 3, offload_param.device = "nvme" (offload_param set too): the
  // parameter partition lives in a swap file, one region per bucket's chunk
  // (rounded up to 4096 bytes), and goes through param_nvme_buffers host
  // buffers of one chunk each (no more than there are buckets).
  bool param_nvme = false;
  int param_nvme_buffers = 5;
  // Stage 3's prefetch: stage3_prefetch_bucket_size (0: off) and
  // stage3_max_live_parameters, in elements. The gathered units' bound is the
  // largest unit plus what may be fetched ahead of it.
  std::int64_t prefetch_elements = 0;
  std::int64_t max_live_elements = 1'000'000'000;
  // Muon: the matrices it orthogonalizes whole (zero/zero/muon_plan.h) and
  // the most one of its all-gathers receives; their fp32 work on the device
  // during the step is kMuonWork.
  std::vector<MuonMatrix> muon;
  std::size_t muon_window_bytes = kMuonGatherWindowBytes;
  bool muon_gram = true;  // optimizer.params.ns_method "gram" (else "standard")
};

enum class Lifetime : std::uint8_t {
  kConstruction,  // freed before the constructor returns
  kPersistent,    // for the engine's life
  kBackward,      // transient during forward/backward (the gradient buckets, stage 3's gathered
                  // units, at their bound)
  kStep,          // transient in the optimizer step, after backward (Muon's work, at its bound)
};

// What each buffer is; the engine asks the plan for these by name.
enum class Buffer : std::uint8_t {
  kFlat32,       // the full fp32 parameters at construction (the flat parameters themselves in fp32);
                 // stage 3: one bucket of them at a time, at construction
  kFlatParams,   // the training-precision flat parameters (bf16/fp16 only); stage 3: the buckets
                 // of no unit, which stay gathered (any precision)
  kMaster,       // the rank's fp32 master partition (offload: its host share)
  kExpAvg,       // first moment (Adagrad: its sum)
  kExpAvgSq,     // second moment (Adam only)
  kStaging,      // offload: the host copy of the updated training-precision partition (host share)
  kFullGrads,    // stage 0/1: the full flat gradients
  kPartGrads,    // stage 2: the device gradient partition
  kHostGrads0,   // offload: the host gradient partition (host share)
  kHostGrads1,   // offload with DPU: the second one
  kDevAccum,     // GPU offload with accumulation: the device fp32 sum of the window
  kBuckets,      // stage 2 / offload: the transient buckets at their bound
  kParamPartition,  // stage 3: the rank's partition of the training-precision parameters
  kLiveParams,      // stage 3: the gathered units at their bound (forward and backward)
  // Offload with ratio < 1: the device share of the partition (its tail,
  // from offload_split on), stepped on the device beside the CPU step.
  kDevMaster,    // its fp32 master weights
  kDevExpAvg,    // its first moment (Adagrad: the sum)
  kDevExpAvgSq,  // its second moment (Adam only)
  kDevGrads,     // its gradients, kept on the device (not when kDevAccum holds them)
  kDevStaging,   // its updated training-precision values until they are published (bf16/fp16)
  kSwapBuffers,  // NVMe: the host buffers the state goes through, one piece's master and moments each
  kParamSwapBuffers,  // stage 3, parameters on NVMe: the host buffers the chunks go through, one chunk each
  kMuonWork,     // Muon: its whole matrices, gather windows and Newton-Schulz products, at their bound over the ranks (fp32)
  kFrozenPartition,  // stage 3: the rank's partition of the frozen parameters of units (training precision;
                     // in host memory with offload_param, "nvme" included)
};
inline constexpr int kNumBuffers = 23;

struct PlannedBuffer {
  bool present = false;
  memory::Tier tier = memory::Tier::kDevice;
  memory::Kind kind = memory::Kind::kHalfParams;  // of the valid part (the rest is padding)
  Lifetime lifetime = Lifetime::kPersistent;
  std::size_t elements = 0;  // as allocated
  std::size_t valid = 0;     // of which hold parameters' values (the rest: padding)
  int element_bytes = 4;
  const char* what = "";

  std::int64_t bytes() const { return static_cast<std::int64_t>(elements) * element_bytes; }
  std::int64_t valid_bytes() const { return static_cast<std::int64_t>(valid) * element_bytes; }
};

struct MemoryPlan {
  FlatLayout layout;
  // Stage 3: the frozen parameters of units (PlanInput::frozen_numels), laid
  // out as the trainable ones are, their buckets grouped by unit; empty
  // without them.
  FlatLayout frozen_layout;
  int shard_rank = 0;
  // Offload: the partition's elements [0, offload_split) have their
  // optimizer state on the host (kMaster, kExpAvg, kExpAvgSq, the host
  // gradients and staging), [offload_split, partition) on the device
  // (kDev*). The multiple of kSplitAlignElements nearest to ratio x
  // partition, or the whole partition where that is nearer. Without
  // offload: the whole partition.
  std::size_t offload_split = 0;
  std::array<PlannedBuffer, kNumBuffers> buffers{};

  const PlannedBuffer& operator[](Buffer b) const { return buffers[static_cast<std::size_t>(b)]; }
  // Bytes of `tier` held once the constructor has returned, buckets aside.
  std::int64_t persistent(memory::Tier tier) const;
  // The most bytes of `tier` alive at once: during construction (the fp32
  // copy beside the flat parameters and the master), in backward (the
  // persistent buffers plus the buckets at their bound), or in the
  // optimizer step (the persistent buffers plus Muon's work).
  std::int64_t peak(memory::Tier tier) const;
  std::int64_t construction_peak(memory::Tier tier) const;
};

// Elements each rank's chunk of a bucket is aligned to (64 bytes of fp32).
inline constexpr std::size_t kPlanAlignElements = 32;
// The host/device boundary of an offloaded partition is a multiple of this.
inline constexpr std::size_t kSplitAlignElements = 64;
// The optimizer step's pieces: an eighth of a bucket's chunk, in multiples
// of kStepPieceAlign, at most kStepPieceMax elements and at most `cap`
// (sub_group_size with NVMe). src/engine/optimizer_partition.h says why.
inline constexpr std::size_t kStepPieceMax = std::size_t{1} << 26;
inline constexpr std::size_t kStepPieceAlign = 64;
inline std::size_t step_piece_elements(const Bucket& b, std::size_t cap) {
  const std::size_t eighth = (b.chunk / 8 + kStepPieceAlign - 1) / kStepPieceAlign * kStepPieceAlign;
  const std::size_t capped = std::max(kStepPieceAlign, cap / kStepPieceAlign * kStepPieceAlign);
  return std::min(std::clamp(eighth, kStepPieceAlign, kStepPieceMax), capped);
}
// NVMe: one state (fp32) of a piece of n elements in the swap file, rounded
// up to the 4096 bytes O_DIRECT works in.
inline constexpr std::size_t kSwapAlignBytes = 4096;
inline std::size_t swap_align_up(std::size_t bytes) {
  return (bytes + kSwapAlignBytes - 1) / kSwapAlignBytes * kSwapAlignBytes;
}
inline std::size_t swap_region_bytes(std::size_t n) { return swap_align_up(n * 4); }
// The first address in a host buffer that starts at `base` where a swap
// file's O_DIRECT transfer may begin (the buffers are allocated
// kSwapAlignBytes larger for it).
inline char* swap_aligned(char* base) {
  const auto at = reinterpret_cast<std::uintptr_t>(base);
  return base + (kSwapAlignBytes - at % kSwapAlignBytes) % kSwapAlignBytes;
}

// Parameters on NVMe: bucket b's chunk (training precision, `element_bytes`
// each) in the swap file, rounded up to 4096 bytes.
inline std::size_t param_region_bytes(const Bucket& b, int element_bytes) {
  return swap_align_up(b.chunk * static_cast<std::size_t>(element_bytes));
}

// Gradient buckets alive at once in stage 2 / offload: GradReducer's
// max_in_flight (2) being reduced plus the one being filled.
inline constexpr int kPlanLiveBuckets = 3;

// The most elements a bucket of the layout holds: reduce_bucket_size, and at
// stage 3 with prefetch no more than stage3_prefetch_bucket_size either
// (padding included), so that prefetch, which fetches whole buckets,
// reaches into a unit larger than its reach; a parameter larger than that is
// a bucket of its own.
std::size_t layout_bucket_numel(const PlanInput& in);

MemoryPlan plan_memory(const PlanInput& in);

// Stage 3 with units, of trainable or of frozen parameters: the units
// gather during backward, so the kept gradient buckets go out at its end
// (GradReducer::Options::kept_at_end) and are budgeted all at once.
bool has_units(const MemoryPlan& plan);

// How many elements of bucket b's chunk lie before partition element
// `split`: with offload, the chunk's host share (split = offload_split).
inline std::size_t chunk_before(const Bucket& b, std::size_t split) {
  return b.partition_offset >= split ? 0 : std::min(b.chunk, split - b.partition_offset);
}

}  // namespace zero
