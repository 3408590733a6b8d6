#include "zero/zero/memory_plan.h"

#include <algorithm>
#include <functional>

#include "zero/core/error.h"

namespace zero {

using memory::Kind;
using memory::Tier;

namespace {

PlannedBuffer make(Tier tier, Kind kind, Lifetime life, std::size_t elements, std::size_t valid, int element_bytes,
                   const char* what) {
  PlannedBuffer b;
  b.present = true;
  b.tier = tier;
  b.kind = kind;
  b.lifetime = life;
  b.elements = elements;
  b.valid = std::min(valid, elements);
  b.element_bytes = element_bytes;
  b.what = what;
  return b;
}

// Stage 3's parameters: the rank's partition (device, or host with
// offload_param), the buckets of no unit (always gathered), the gathered
// units at their bound, and one bucket in fp32 at a time at construction.
void plan_stage3_params(const PlanInput& in, MemoryPlan& p) {
  const FlatLayout& L = p.layout;
  const int es = in.element_bytes;
  auto set = [&](Buffer id, PlannedBuffer b) { p.buffers[static_cast<std::size_t>(id)] = b; };
  std::size_t persistent = 0, persistent_valid = 0, largest_bucket = 0;
  std::vector<std::size_t> unit_padded;
  // A unit's frozen buckets are gathered and released with its trainable ones.
  for (const Bucket& b : p.frozen_layout.buckets()) {
    largest_bucket = std::max(largest_bucket, b.padded);
    if (unit_padded.size() <= static_cast<std::size_t>(b.group)) unit_padded.resize(b.group + 1, 0);
    unit_padded[static_cast<std::size_t>(b.group)] += b.padded;
  }
  for (const Bucket& b : L.buckets()) {
    largest_bucket = std::max(largest_bucket, b.padded);
    if (b.group < 0) {
      persistent += b.padded;
      persistent_valid += b.numel;
      continue;
    }
    if (unit_padded.size() <= static_cast<std::size_t>(b.group)) unit_padded.resize(b.group + 1, 0);
    unit_padded[static_cast<std::size_t>(b.group)] += b.padded;
  }
  // Each bucket is made in fp32, then copied into its storage in the
  // training precision while the fp32 one still lives: 4 + es bytes per
  // element of the largest bucket (measured by the CUDA allocator's peak in
  // engine_cuda_test's EngineCudaBuild).
  set(Buffer::kFlat32, make(Tier::kDevice, Kind::kStaging, Lifetime::kConstruction, largest_bucket, largest_bucket,
                            4 + es, "one bucket of the parameters in fp32 and in the training precision "
                            "(construction only)"));
  if (in.param_nvme) {
    // Each bucket's chunk is a region of the swap file; a host buffer holds one.
    std::size_t file = 0, largest = 0;
    for (const Bucket& b : L.buckets()) {
      file += param_region_bytes(b, es);
      largest = std::max(largest, param_region_bytes(b, es));
    }
    set(Buffer::kParamPartition, make(Tier::kNvme, Kind::kHalfParams, Lifetime::kPersistent, file / es,
                                      L.partition_valid(p.shard_rank), es, "the parameter partition"));
    const std::size_t count = std::min(static_cast<std::size_t>(in.param_nvme_buffers), L.buckets().size());
    const std::size_t bytes = largest * count + kSwapAlignBytes;
    set(Buffer::kParamSwapBuffers, make(Tier::kHost, Kind::kStaging, Lifetime::kPersistent, bytes, bytes, 1,
                                        "the NVMe parameter buffers"));
  } else {
    set(Buffer::kParamPartition, make(in.offload_param ? Tier::kHost : Tier::kDevice, Kind::kHalfParams,
                                      Lifetime::kPersistent, L.partition_numel(), L.partition_valid(p.shard_rank), es,
                                      "the parameter partition"));
  }
  if (!p.frozen_layout.buckets().empty()) {
    const FlatLayout& F = p.frozen_layout;
    set(Buffer::kFrozenPartition, make(in.offload_param ? Tier::kHost : Tier::kDevice, Kind::kFrozen,
                                       Lifetime::kPersistent, F.partition_numel(), F.partition_valid(p.shard_rank), es,
                                       "the frozen parameter partition"));
  }
  if (persistent > 0) {
    set(Buffer::kFlatParams, make(Tier::kDevice, Kind::kHalfParams, Lifetime::kPersistent, persistent,
                                  persistent_valid, es, "the parameters of no unit (kept gathered)"));
  }
  // The unit in use (the largest, at the bound) and what prefetch may hold
  // beside it: at most stage3_prefetch_bucket_size elements, no more than the
  // other units have, and no more than stage3_max_live_parameters leaves.
  std::size_t largest = 0, all = 0;
  for (std::size_t n : unit_padded) {
    largest = std::max(largest, n);
    all += n;
  }
  const auto prefetch = static_cast<std::size_t>(std::max<std::int64_t>(in.prefetch_elements, 0));
  const auto max_live = static_cast<std::size_t>(std::max<std::int64_t>(in.max_live_elements, 0));
  const std::size_t ahead = std::min({prefetch, all - largest, max_live > largest ? max_live - largest : 0});
  const std::size_t live = largest + ahead;
  if (live > 0) {
    set(Buffer::kLiveParams, make(Tier::kDevice, Kind::kHalfParams, Lifetime::kBackward, live, live, es,
                                  "the gathered units"));
  }
}

}  // namespace

std::size_t layout_bucket_numel(const PlanInput& in) {
  if (in.stage != 3 || in.prefetch_elements <= 0) return in.bucket_numel;
  // Padded, such a bucket still fits the reach: its size rounded down to
  // the padding's multiple (at least one multiple).
  const std::size_t pad = static_cast<std::size_t>(in.world) * kPlanAlignElements;
  const std::size_t reach = std::max(pad, static_cast<std::size_t>(in.prefetch_elements) / pad * pad);
  return std::min(in.bucket_numel, reach);
}

MemoryPlan plan_memory(const PlanInput& in) {
  ZERO_CHECK(!in.numels.empty(), "the memory plan needs at least one parameter");
  ZERO_CHECK(in.world >= 1 && in.rank >= 0 && in.rank < in.world, "rank ", in.rank, " of world ", in.world);
  ZERO_CHECK(in.stage >= 0 && in.stage <= 3, "stage must be 0, 1, 2 or 3, got ", in.stage);
  ZERO_CHECK(!in.offload || in.stage >= 1, "offload needs stage 1, 2 or 3");
  ZERO_CHECK(!in.offload_param || in.stage == 3, "parameter offload needs stage 3");
  ZERO_CHECK(!in.param_nvme || (in.offload_param && in.offload), "parameters on NVMe need offload_param and an "
             "offloaded optimizer");
  ZERO_CHECK(!in.param_nvme || in.param_nvme_buffers >= 2, "parameters on NVMe need at least 2 buffers");
  ZERO_CHECK(in.groups.empty() || in.groups.size() == in.numels.size(), "one unit per parameter, or none");
  ZERO_CHECK(in.frozen_numels.size() == in.frozen_groups.size(), "one unit per frozen parameter");
  ZERO_CHECK(in.frozen_numels.empty() || in.stage == 3, "frozen parameters are partitioned at stage 3 only");
  ZERO_CHECK(std::all_of(in.frozen_groups.begin(), in.frozen_groups.end(), [](int g) { return g >= 0; }),
             "a partitioned frozen parameter belongs to a unit");
  ZERO_CHECK(in.element_bytes == 2 || in.element_bytes == 4, "element size must be 2 or 4 bytes");
  ZERO_CHECK(in.moments == 1 || in.moments == 2, "moments per parameter must be 1 or 2");
  ZERO_CHECK(in.bucket_numel > 0, "reduce_bucket_size must be positive");
  ZERO_CHECK(in.accumulation >= 1, "gradient_accumulation_steps must be at least 1");
  MemoryPlan p;
  // Stage 0 keeps everything on every rank: one shard.
  p.shard_rank = in.stage == 0 ? 0 : in.rank;
  const bool stage3 = in.stage == 3;
  const std::size_t bucket_numel = layout_bucket_numel(in);
  p.layout = FlatLayout(in.numels, bucket_numel, in.world, in.stage == 0 ? 1 : in.world, kPlanAlignElements,
                        stage3 ? in.groups : std::vector<int>{});
  const FlatLayout& L = p.layout;
  const std::size_t psi = L.numel(), padded = L.padded_numel();
  const std::size_t part = L.partition_numel(), valid = L.partition_valid(p.shard_rank);
  const int es = in.element_bytes;
  const bool half = es == 2;
  ZERO_CHECK(!in.nvme || (in.offload && in.offload_ratio == 1.0), "NVMe offload offloads the whole partition");
  ZERO_CHECK(!in.nvme || in.nvme_buffers >= 2, "NVMe offload needs at least 2 swap buffers");
  const Tier opt = in.nvme ? Tier::kNvme : in.offload ? Tier::kHost : Tier::kDevice;
  auto set = [&](Buffer id, PlannedBuffer b) { p.buffers[static_cast<std::size_t>(id)] = b; };

  if (stage3) {
    if (!in.frozen_numels.empty()) {
      p.frozen_layout = FlatLayout(in.frozen_numels, bucket_numel, in.world, in.world, kPlanAlignElements,
                                   in.frozen_groups);
    }
    plan_stage3_params(in, p);
  } else {
    set(Buffer::kFlat32, make(Tier::kDevice, half ? Kind::kStaging : Kind::kHalfParams,
                              half ? Lifetime::kConstruction : Lifetime::kPersistent, padded, half ? padded : psi, 4,
                              half ? "the temporary fp32 copy of the parameters (construction only)"
                                   : "the flat parameter buffer"));
  }
  if (half && !stage3) {
    set(Buffer::kFlatParams, make(Tier::kDevice, Kind::kHalfParams, Lifetime::kPersistent, padded, psi, es,
                                  "the flat parameter buffer"));
  }
  // Offload: the host share [0, split) and the device share (ratio < 1).
  ZERO_CHECK(in.offload_ratio >= 0.0 && in.offload_ratio <= 1.0, "offload_optimizer.ratio must be in [0, 1], got ",
             in.offload_ratio);
  std::size_t split = part;
  if (in.offload && in.offload_ratio < 1.0) {
    // The multiple of the alignment nearest to ratio x partition, or the
    // whole partition where that is nearer (a partition of 32 elements at
    // ratio 0.99 offloads all of it, not none).
    const double want = in.offload_ratio * static_cast<double>(part);
    const std::size_t down =
        std::min(part, static_cast<std::size_t>(want / static_cast<double>(kSplitAlignElements)) * kSplitAlignElements);
    const std::size_t up = std::min(part, down + kSplitAlignElements);
    split = want - static_cast<double>(down) < static_cast<double>(up) - want ? down : up;
  }
  p.offload_split = split;
  // Which elements hold parameters (the rest: padding) is counted as if the
  // padding came last.
  const std::size_t host_valid = std::min(split, valid), dev = part - split, dev_valid = valid - host_valid;
  // NVMe: each state of each step piece is a region of the swap file,
  // rounded up to 4096 bytes; one host buffer holds a piece's states.
  std::size_t state = split;
  if (in.nvme) {
    std::size_t regions = 0, largest = 0, pieces = 0;
    for (const Bucket& b : L.buckets()) {
      const std::size_t piece = step_piece_elements(b, in.sub_group_elements);
      for (std::size_t off = 0; off < b.chunk; off += piece) {
        const std::size_t n = std::min(piece, b.chunk - off);
        regions += swap_region_bytes(n);
        largest = std::max(largest, swap_region_bytes(n));
        ++pieces;
      }
    }
    state = regions / 4;
    // No more buffers than pieces: the others would never hold one.
    const std::size_t count = std::min(static_cast<std::size_t>(in.nvme_buffers), std::max<std::size_t>(pieces, 1));
    const std::size_t one = largest * static_cast<std::size_t>(1 + in.moments) + kSwapAlignBytes;
    set(Buffer::kSwapBuffers, make(Tier::kHost, Kind::kStaging, Lifetime::kPersistent, one * count, one * count, 1,
                                   "the NVMe swap buffers"));
  }
  set(Buffer::kMaster, make(opt, Kind::kFp32Master, Lifetime::kPersistent, state, host_valid, 4, "fp32 master weights"));
  set(Buffer::kExpAvg, make(opt, Kind::kMoments, Lifetime::kPersistent, state, host_valid, 4, "optimizer moments"));
  if (in.moments == 2) {
    set(Buffer::kExpAvgSq, make(opt, Kind::kMoments, Lifetime::kPersistent, state, host_valid, 4, "optimizer moments"));
  }
  const bool gpu_offload = in.offload && in.on_gpu;
  // bf16/fp16 on a GPU without accumulation: the update is written over the
  // host gradients and goes up from there (no staging).
  const bool update_in_grads = gpu_offload && half && in.accumulation == 1;
  if (in.offload) {
    if (half && !update_in_grads) {
      set(Buffer::kStaging, make(Tier::kHost, Kind::kStaging, Lifetime::kPersistent, split, split, es,
                                 "the host parameter staging buffer"));
    } else if (in.nvme && !half) {
      // fp32 publishes from the master weights, which are in the swap file.
      set(Buffer::kStaging, make(Tier::kHost, Kind::kStaging, Lifetime::kPersistent, split, split, 4,
                                 "the host copy of the updated master weights"));
    }
    // On a GPU the host gradients are what comes down: the training
    // precision, or the window's fp32 sum when accumulating; on the CPU the
    // host sums in fp32.
    const int grad_bytes = gpu_offload && in.accumulation == 1 ? es : 4;
    set(Buffer::kHostGrads0, make(Tier::kHost, Kind::kGrads, Lifetime::kPersistent, split, host_valid, grad_bytes,
                                  "the host gradient partition"));
    if (in.dpu) {
      set(Buffer::kHostGrads1, make(Tier::kHost, Kind::kGrads, Lifetime::kPersistent, split, host_valid, grad_bytes,
                                    "the host gradient partition"));
    }
    if (gpu_offload && in.accumulation > 1) {
      set(Buffer::kDevAccum, make(Tier::kDevice, Kind::kGrads, Lifetime::kPersistent, part, valid, 4,
                                  "the device gradient partition (accumulation)"));
    }
    if (dev > 0) {
      // The device share's step runs on the main thread before the next
      // backward: one gradient buffer (the accumulation sum where there is
      // one), and a staging buffer that holds its update until published.
      set(Buffer::kDevMaster, make(Tier::kDevice, Kind::kFp32Master, Lifetime::kPersistent, dev, dev_valid, 4,
                                   "fp32 master weights (device share)"));
      set(Buffer::kDevExpAvg, make(Tier::kDevice, Kind::kMoments, Lifetime::kPersistent, dev, dev_valid, 4,
                                   "optimizer moments (device share)"));
      if (in.moments == 2) {
        set(Buffer::kDevExpAvgSq, make(Tier::kDevice, Kind::kMoments, Lifetime::kPersistent, dev, dev_valid, 4,
                                       "optimizer moments (device share)"));
      }
      if (!(gpu_offload && in.accumulation > 1)) {
        set(Buffer::kDevGrads, make(Tier::kDevice, Kind::kGrads, Lifetime::kPersistent, dev, dev_valid, grad_bytes,
                                    "the gradient partition (device share)"));
      }
      if (half) {
        set(Buffer::kDevStaging, make(Tier::kDevice, Kind::kStaging, Lifetime::kPersistent, dev, dev, es,
                                      "the parameter staging buffer (device share)"));
      }
    }
  } else if (in.stage >= 2) {
    set(Buffer::kPartGrads, make(Tier::kDevice, Kind::kGrads, Lifetime::kPersistent, part, valid, es,
                                 "the gradient partition"));
  } else {
    set(Buffer::kFullGrads, make(Tier::kDevice, Kind::kGrads, Lifetime::kPersistent, padded, psi, es,
                                 "the flat gradient buffer"));
  }
  if (in.offload || in.stage >= 2) {
    // The largest kPlanLiveBuckets at once (GradReducer's bound), and at
    // stage 3 every kept bucket (no unit) besides: they go out after the
    // units', at the end of backward.
    const bool units = has_units(p);
    std::vector<std::size_t> sizes;
    std::size_t n = 0;
    for (const Bucket& b : L.buckets()) {
      if (units && b.group < 0) {
        n += b.padded;
      } else {
        sizes.push_back(b.padded);
      }
    }
    std::sort(sizes.begin(), sizes.end(), std::greater<>());
    for (std::size_t i = 0; i < sizes.size() && i < static_cast<std::size_t>(kPlanLiveBuckets); ++i) n += sizes[i];
    set(Buffer::kBuckets, make(Tier::kDevice, Kind::kBuckets, Lifetime::kBackward, n, n, es, "gradient buckets"));
  }
  if (!in.muon.empty()) {
    // The most any rank holds (which matrices lie across its chunk's ends
    // differs by rank): every rank budgets the same, so that a
    // device_memory_limit refuses on every rank alike.
    std::size_t n = 0;
    for (int r = 0; r < L.shard_world(); ++r) {
      n = std::max(n, muon_work_elements(L, plan_muon(L, r, in.muon), in.muon, in.muon_window_bytes, in.muon_gram));
    }
    set(Buffer::kMuonWork, make(Tier::kDevice, Kind::kWorkspace, Lifetime::kStep, n, n, 4,
                                "Muon's whole matrices and Newton-Schulz products"));
  }
  return p;
}

bool has_units(const MemoryPlan& plan) {
  for (const FlatLayout* l : {&plan.layout, &plan.frozen_layout}) {
    for (const Bucket& b : l->buckets()) {
      if (b.group >= 0) return true;
    }
  }
  return false;
}

std::int64_t MemoryPlan::persistent(Tier tier) const {
  std::int64_t sum = 0;
  for (const PlannedBuffer& b : buffers) {
    if (b.present && b.tier == tier && b.lifetime == Lifetime::kPersistent) sum += b.bytes();
  }
  return sum;
}

std::int64_t MemoryPlan::construction_peak(Tier tier) const {
  // The constructor's order (src/engine/engine.cpp): the fp32 copy, the
  // master seeded from it, the flat training-precision parameters made from
  // it; then the copy is freed and the rest allocated.
  // Stage 3 allocates the partition and the kept buckets first, then goes
  // through the buckets one at a time in fp32 (the frozen ones last, their
  // partition allocated before them).
  std::int64_t sum = 0;
  for (Buffer id : {Buffer::kFlat32, Buffer::kMaster, Buffer::kDevMaster, Buffer::kFlatParams,
                    Buffer::kParamPartition, Buffer::kFrozenPartition}) {
    const PlannedBuffer& b = (*this)[id];
    if (b.present && b.tier == tier) sum += b.bytes();
  }
  return sum;
}

std::int64_t MemoryPlan::peak(Tier tier) const {
  std::int64_t backward = 0, step = 0;
  for (const PlannedBuffer& b : buffers) {
    if (!b.present || b.tier != tier) continue;
    if (b.lifetime == Lifetime::kBackward) backward += b.bytes();
    if (b.lifetime == Lifetime::kStep) step += b.bytes();
  }
  return std::max(persistent(tier) + std::max(backward, step), construction_peak(tier));
}

}  // namespace zero
