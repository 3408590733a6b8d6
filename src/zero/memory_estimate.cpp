#include "zero/zero/memory_estimate.h"

#include <algorithm>

#include "zero/core/error.h"

namespace zero {

MemoryEstimate estimate_memory(const EstimateInput& in) {
  ZERO_CHECK(in.params > 0, "the parameter count must be positive, got ", in.params);
  ZERO_CHECK(in.world >= 1, "the world size must be at least 1, got ", in.world);
  ZERO_CHECK(in.stage >= 0 && in.stage <= 2, "stage must be 0, 1 or 2 (stage 3 is not available yet), got ", in.stage);
  ZERO_CHECK(!in.offload || in.stage >= 1, "offload needs stage 1 or 2");
  ZERO_CHECK(in.element_bytes == 2 || in.element_bytes == 4, "element size must be 2 or 4 bytes");
  const std::int64_t psi = in.params, es = in.element_bytes;
  const std::int64_t n = in.stage == 0 ? 1 : in.world;  // stage 0: each rank holds everything
  const std::int64_t part = (psi + n - 1) / n;          // the rank's share, padding aside
  MemoryEstimate e;
  e.device_params = es * psi;
  const bool partitioned_grads = in.stage == 2 || in.offload;
  if (in.offload) {
    e.host_grads = 4 * part * (in.dpu ? 2 : 1);
    e.host_master = 4 * part;
    e.host_moments = 8 * part;
    e.host_staging = es == 4 ? 0 : es * part;
  } else {
    e.device_grads = partitioned_grads ? es * part : es * psi;
    e.device_master = 4 * part;
    e.device_moments = 8 * part;
  }
  // Stage 2 / offload: at most two transient buckets in flight (grad_reducer.h).
  if (partitioned_grads) e.device_buckets = 2 * es * std::min(in.bucket_numel, psi);
  if (in.micro_batch > 0 && in.seq_len > 0 && in.n_layer > 0) {
    // Per layer, 16-bit activations: s*b*h*(34 + 5*a*s/h) bytes (Korthikanti
    // et al., 2022), scaled to the element size; plus fp32 logits and their grad.
    const double sbh = double(in.seq_len) * in.micro_batch * in.n_embd;
    const double per_layer = sbh * (34.0 + 5.0 * in.n_head * in.seq_len / double(in.n_embd)) * es / 2.0;
    e.device_activations = static_cast<std::int64_t>(per_layer * in.n_layer +
                                                     2.0 * 4.0 * in.micro_batch * in.seq_len * in.vocab);
  }
  return e;
}

std::string describe_config(int stage, bool offload) {
  return "stage " + std::to_string(stage) + (offload ? " + offload" : "");
}

}  // namespace zero
