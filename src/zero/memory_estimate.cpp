#include "zero/zero/memory_estimate.h"

#include <algorithm>
#include <functional>
#include <numeric>

#include "zero/core/error.h"
#include "zero/zero/flat_layout.h"

namespace zero {

MemoryEstimate estimate_memory(const EstimateInput& in) {
  ZERO_CHECK(in.params > 0, "the parameter count must be positive, got ", in.params);
  ZERO_CHECK(in.world >= 1, "the world size must be at least 1, got ", in.world);
  ZERO_CHECK(in.stage >= 0 && in.stage <= 2, "stage must be 0, 1 or 2 (stage 3 is not available yet), got ", in.stage);
  ZERO_CHECK(!in.offload || in.stage >= 1, "offload needs stage 1 or 2");
  ZERO_CHECK(in.element_bytes == 2 || in.element_bytes == 4, "element size must be 2 or 4 bytes");
  ZERO_CHECK(in.bucket_numel > 0, "reduce_bucket_size must be positive, got ", in.bucket_numel);
  const std::int64_t psi = in.params, es = in.element_bytes;
  std::vector<std::size_t> numels;
  if (in.param_numels.empty()) {
    numels.push_back(static_cast<std::size_t>(psi));
  } else {
    for (std::int64_t n : in.param_numels) numels.push_back(static_cast<std::size_t>(n));
    ZERO_CHECK(std::accumulate(in.param_numels.begin(), in.param_numels.end(), std::int64_t{0}) == psi,
               "the parameter sizes do not add up to the parameter count ", psi);
  }
  // The engine's layout: every rank pads to the world (pad_world), stage 0 shards over 1.
  const FlatLayout layout(numels, static_cast<std::size_t>(in.bucket_numel), in.world,
                          in.stage == 0 ? 1 : in.world, static_cast<std::size_t>(kEstimateAlignElements));
  const auto flat_pad = static_cast<std::int64_t>(layout.padded_numel() - layout.numel());
  const auto part_pad = static_cast<std::int64_t>(layout.partition_numel() -
                                                  layout.partition_valid(layout.shard_world() - 1));
  const std::int64_t n = in.stage == 0 ? 1 : in.world;  // stage 0: each rank holds everything
  const std::int64_t part = (psi + n - 1) / n;          // the rank's share, padding aside
  MemoryEstimate e;
  e.device_params = es * psi;
  e.device_padding = es * flat_pad;
  const bool partitioned_grads = in.stage == 2 || in.offload;
  const std::int64_t opt_pad = 12 * part_pad;  // fp32 master + two moments
  if (in.offload) {
    e.host_grads = 4 * part * (in.dpu ? 2 : 1);
    e.host_master = 4 * part;
    e.host_moments = 8 * part;
    e.host_staging = es == 4 ? 0 : es * static_cast<std::int64_t>(layout.partition_numel());
    e.host_padding = opt_pad + 4 * part_pad * (in.dpu ? 2 : 1);
  } else {
    e.device_grads = partitioned_grads ? es * part : es * psi;
    e.device_master = 4 * part;
    e.device_moments = 8 * part;
    e.device_padding += opt_pad + es * (partitioned_grads ? part_pad : flat_pad);
  }
  // Stage 2 / offload: at most three transient buckets (grad_reducer.h: two
  // being reduced, one being filled), each padded like the layout's; the
  // three largest are the worst case.
  if (partitioned_grads) {
    std::vector<std::int64_t> sizes;
    for (const Bucket& b : layout.buckets()) sizes.push_back(static_cast<std::int64_t>(b.padded));
    std::sort(sizes.begin(), sizes.end(), std::greater<>());
    for (std::size_t i = 0; i < std::min<std::size_t>(3, sizes.size()); ++i) e.device_buckets += es * sizes[i];
    if (in.param_numels.empty()) e.device_buckets = 3 * es * std::min(in.bucket_numel, psi);  // sizes unknown
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

std::string describe_config(int stage, bool offload) {
  return "stage " + std::to_string(stage) + (offload ? " + offload" : "");
}

}  // namespace zero
