#include "zero/zero/memory_estimate.h"

#include <algorithm>
#include <functional>
#include <numeric>

#include "zero/core/error.h"
#include "zero/zero/memory_plan.h"

namespace zero {

MemoryEstimate estimate_memory(const EstimateInput& in) {
  ZERO_CHECK(in.params > 0, "the parameter count must be positive, got ", in.params);
  ZERO_CHECK(in.world >= 1, "the world size must be at least 1, got ", in.world);
  ZERO_CHECK(in.stage >= 0 && in.stage <= 3, "stage must be 0, 1, 2 or 3, got ", in.stage);
  ZERO_CHECK(!in.offload_param || in.stage == 3, "parameter offload needs stage 3");
  ZERO_CHECK(in.moments == 1 || in.moments == 2, "moments per parameter must be 1 (Adagrad, Lion) or 2 (Adam)");
  ZERO_CHECK(!in.offload || in.stage >= 1, "offload needs stage 1, 2 or 3");
  ZERO_CHECK(in.element_bytes == 2 || in.element_bytes == 4, "element size must be 2 or 4 bytes");
  ZERO_CHECK(in.bucket_numel > 0, "reduce_bucket_size must be positive, got ", in.bucket_numel);
  const std::int64_t psi = in.params, es = in.element_bytes;
  PlanInput pi;
  if (in.param_numels.empty()) {
    pi.numels.push_back(static_cast<std::size_t>(psi));
  } else {
    for (std::int64_t n : in.param_numels) pi.numels.push_back(static_cast<std::size_t>(n));
    ZERO_CHECK(std::accumulate(in.param_numels.begin(), in.param_numels.end(), std::int64_t{0}) == psi,
               "the parameter sizes do not add up to the parameter count ", psi);
  }
  pi.bucket_numel = static_cast<std::size_t>(in.bucket_numel);
  pi.world = in.world;
  pi.rank = in.world - 1;  // the most padding
  pi.stage = in.stage;
  pi.offload = in.offload;
  pi.dpu = in.dpu;
  pi.offload_ratio = in.offload_ratio;
  pi.nvme = in.nvme;
  pi.nvme_buffers = in.nvme_buffers;
  pi.sub_group_elements = static_cast<std::size_t>(std::max<std::int64_t>(in.sub_group_elements, 1));
  pi.on_gpu = in.on_gpu;
  pi.accumulation = in.accumulation;
  pi.element_bytes = in.element_bytes;
  pi.moments = in.moments;
  ZERO_CHECK(in.muon.empty() || !in.param_numels.empty(),
             "Muon's matrices index the parameters: give their sizes (param_numels) too");
  pi.muon = in.muon;
  pi.muon_gram = in.muon_gram;
  if (in.stage == 3) {
    ZERO_CHECK(in.param_units.empty() || in.param_units.size() == pi.numels.size(),
               "one unit per parameter size, or none");
    for (std::size_t i = 0; i < pi.numels.size(); ++i) {
      const int unit = in.param_units.empty() ? 0 : in.param_units[i];
      pi.groups.push_back(static_cast<std::int64_t>(pi.numels[i]) < in.persistence_threshold ? -1 : unit);
    }
    // The frozen parameters (a base under its adapters) are partitioned
    // with their units: spread over the units as the trainable ones are.
    if (in.frozen_params > 0) {
      std::vector<std::size_t> per_unit;
      std::size_t grouped = 0;
      for (std::size_t i = 0; i < pi.numels.size(); ++i) {
        const int g = pi.groups[i];
        if (g < 0) continue;
        if (per_unit.size() <= static_cast<std::size_t>(g)) per_unit.resize(static_cast<std::size_t>(g) + 1, 0);
        per_unit[static_cast<std::size_t>(g)] += pi.numels[i];
        grouped += pi.numels[i];
      }
      std::size_t left = static_cast<std::size_t>(in.frozen_params), last = 0;
      for (std::size_t u = 0; u < per_unit.size(); ++u) last = per_unit[u] > 0 ? u : last;
      for (std::size_t u = 0; u < per_unit.size() && grouped > 0; ++u) {
        if (per_unit[u] == 0) continue;
        const std::size_t share =
            u == last ? left
                      : static_cast<std::size_t>(static_cast<long double>(in.frozen_params) * per_unit[u] / grouped);
        if (share == 0) continue;
        pi.frozen_numels.push_back(share);
        pi.frozen_groups.push_back(static_cast<int>(u));
        left -= share;
      }
    }
    pi.offload_param = in.offload_param;
    pi.param_nvme = in.param_nvme;
    pi.param_nvme_buffers = in.param_nvme_buffers;
    pi.prefetch_elements = in.prefetch_elements;
    pi.max_live_elements = in.max_live_elements;
  }
  const MemoryPlan plan = plan_memory(pi);
  MemoryEstimate e;
  for (const PlannedBuffer& b : plan.buffers) {
    if (!b.present || b.lifetime == Lifetime::kConstruction) continue;
    const bool dev = b.tier == memory::Tier::kDevice;
    if (b.tier == memory::Tier::kNvme) {
      (b.kind == memory::Kind::kFp32Master ? e.nvme_master
       : b.kind == memory::Kind::kHalfParams ? e.nvme_params
                                             : e.nvme_moments) += b.valid_bytes();
      e.nvme_padding += b.bytes() - b.valid_bytes();
      continue;
    }
    if (b.lifetime == Lifetime::kBackward && b.kind == memory::Kind::kHalfParams) {
      e.device_gathered += b.bytes();  // stage 3's gathered units, padding included
      continue;
    }
    const std::int64_t valid = b.valid_bytes(), pad = b.bytes() - b.valid_bytes();
    switch (b.kind) {
      case memory::Kind::kHalfParams: (dev ? e.device_params : e.host_params) += valid; break;
      case memory::Kind::kGrads: (dev ? e.device_grads : e.host_grads) += valid; break;
      case memory::Kind::kFp32Master: (dev ? e.device_master : e.host_master) += valid; break;
      case memory::Kind::kMoments: (dev ? e.device_moments : e.host_moments) += valid; break;
      case memory::Kind::kBuckets: e.device_buckets += b.bytes(); continue;
      case memory::Kind::kStaging: (dev ? e.device_staging : e.host_staging) += b.bytes(); continue;
      case memory::Kind::kWorkspace: e.device_workspace += b.bytes(); continue;  // (the plan has it on the device)
      case memory::Kind::kPadding: break;
      case memory::Kind::kFrozen: (dev ? e.device_frozen : e.host_frozen) += valid; break;  // stage 3's partition
    }
    (dev ? e.device_padding : e.host_padding) += pad;
  }
  e.device_construction = plan.construction_peak(memory::Tier::kDevice);
  if (plan.frozen_layout.buckets().empty()) {
    e.device_frozen = in.frozen_params * es;  // whole on every rank
  } else if (plan[Buffer::kFrozenPartition].tier == memory::Tier::kDevice) {
    // (device_total() adds device_frozen to the construction peak.)
    e.device_construction -= plan[Buffer::kFrozenPartition].valid_bytes();
  }
  // A model given only by its parameter count is one parameter here, and one
  // bucket; a real model's parameters fill buckets of reduce_bucket_size:
  // the plan's live buckets of them, but never more than the parameters
  // (120K of them are one bucket, not three).
  if (in.param_numels.empty() && e.device_buckets > 0) {
    e.device_buckets =
        es * std::min(static_cast<std::int64_t>(kPlanLiveBuckets) *
                          std::min(static_cast<std::int64_t>(layout_bucket_numel(pi)), psi),
                      psi);
  }
  if (in.micro_batch > 0 && in.seq_len > 0 && in.n_layer > 0) {
    // Per layer, 16-bit activations: s*b*h*(34 + 5*a*s/h) bytes (Korthikanti
    // et al., 2022), scaled to the element size; plus fp32 logits and their grad.
    const double sbh = double(in.seq_len) * in.micro_batch * in.n_embd;
    const double per_layer = sbh * (34.0 + 5.0 * in.n_head * in.seq_len / double(in.n_embd)) * es / 2.0;
    const double logits = 2.0 * 4.0 * in.micro_batch * in.seq_len * in.vocab;
    if (!in.checkpoint_activations) {
      e.device_activations = static_cast<std::int64_t>(per_layer * in.n_layer + logits);
    } else {
      // Checkpointed: each block's input (s*b*h elements) is kept; backward
      // recomputes one block at a time, so one block's activations are live
      // (plus the device copy of its input when the inputs are on the host).
      const double inputs = sbh * es * in.n_layer;
      if (in.cpu_checkpointing) {
        e.host_activations = static_cast<std::int64_t>(inputs);
        e.device_activations = static_cast<std::int64_t>(per_layer + sbh * es + logits);
      } else {
        e.device_activations = static_cast<std::int64_t>(inputs + per_layer + logits);
      }
    }
  }
  return e;
}

std::string describe_config(int stage, bool offload, bool offload_param) {
  return "stage " + std::to_string(stage) + (offload ? " + offload" : "") + (offload_param ? " + params" : "");
}

}  // namespace zero
