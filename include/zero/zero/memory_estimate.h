// What a configuration needs, per rank, before anything is allocated: the
// engine's memory plan (memory_plan.h, the buffers the engine allocates)
// summed by tier and kind, for the last rank (whose chunks hold the most
// padding), plus an activation estimate. zero-estimate prints it; tests hold
// it to the engine's measured ledger.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero/zero/muon_plan.h"

namespace zero {

struct EstimateInput {
  std::int64_t params = 0;  // Psi
  // Frozen parameters beside them (a fine-tuned model's base under its
  // adapters), in the training precision, with no gradient and no optimizer
  // state: whole on every rank at stages 0-2; at stage 3 partitioned with
  // the units, spread over them as the trainable parameters are (each
  // unit's share gathered with it; with offload_param the partition is in
  // host memory).
  std::int64_t frozen_params = 0;
  int world = 1;
  int stage = 0;
  bool offload = false;     // offload_optimizer.device = "cpu" (or "nvme")
  // offload_optimizer.device = "nvme" (offload set too): master and moments
  // in the swap file, buffer_count host buffers of a piece each.
  bool nvme = false;
  int nvme_buffers = 4;                              // offload_optimizer.buffer_count
  std::int64_t sub_group_elements = 1'000'000'000;  // zero_optimization.sub_group_size
  bool dpu = false;         // delayed parameter update (double host gradients)
  double offload_ratio = 1.0;  // offload_optimizer.ratio: the offloaded share of the optimizer state
  bool on_gpu = false;      // the module on a GPU (offload keeps host gradients as they come down)
  int accumulation = 1;     // gradient_accumulation_steps
  int moments = 2;          // optimizer state per parameter: Adam 2, Adagrad and Lion 1
  int element_bytes = 2;    // training precision: 2 (bf16/fp16) or 4 (fp32)
  std::int64_t bucket_numel = 500'000'000;  // reduce_bucket_size
  // The parameters' sizes in the module's order (GptConfig::parameter_numels()):
  // when given, buckets and padding follow the engine's exact flat layout;
  // when empty, the model is taken as one parameter of `params` elements.
  std::vector<std::int64_t> param_numels;
  // Stage 3: each parameter's unit, in param_numels' order
  // (GptConfig::parameter_units(): its block; -1 for the embeddings and the
  // final LayerNorm, which stay gathered); empty: the model is one unit.
  std::vector<int> param_units;
  bool offload_param = false;                        // offload_param.device = "cpu" (or "nvme")
  // offload_param.device = "nvme" (offload_param set too): the parameter
  // partition in a swap file, buffer_count host buffers of a chunk each.
  bool param_nvme = false;
  int param_nvme_buffers = 5;                        // offload_param.buffer_count
  std::int64_t prefetch_elements = 50'000'000;       // stage3_prefetch_bucket_size
  std::int64_t max_live_elements = 1'000'000'000;    // stage3_max_live_parameters
  std::int64_t persistence_threshold = 100'000;      // stage3_param_persistence_threshold
  // Activations of one micro-batch of a GPT (0 = not estimated).
  std::int64_t micro_batch = 0, seq_len = 0, n_layer = 0, n_embd = 0, n_head = 0, vocab = 256;
  // Per-block activation checkpointing (GptConfig::checkpoint_activations):
  // only the block inputs stay, plus one block's activations while it is
  // recomputed; with cpu_checkpointing the block inputs live on the host.
  bool checkpoint_activations = false, cpu_checkpointing = false;
  // Optimizer Muon: the matrices it steps, their `param` an index into
  // param_numels (which must be given); their work in the step is
  // device_workspace.
  std::vector<MuonMatrix> muon;
  bool muon_gram = true;  // optimizer.params.ns_method "gram" (else "standard")
};

struct MemoryEstimate {
  // Device tier.
  std::int64_t device_params = 0, device_grads = 0, device_master = 0, device_moments = 0;
  std::int64_t device_buckets = 0, device_activations = 0;
  // Stage 3: the gathered units at their bound (the unit in use and what
  // prefetch holds beside it), transient like the buckets.
  std::int64_t device_gathered = 0;
  // Offload with ratio < 1: the device share's updated training-precision
  // values, held until they are published.
  std::int64_t device_staging = 0;
  // Muon's work in the optimizer step (its whole matrices, gather windows
  // and Newton-Schulz products, at their bound; the most any rank holds):
  // after backward, so beside the persistent buffers but not the buckets,
  // units or activations.
  std::int64_t device_workspace = 0;
  // Padding of the flat buffers and of the partition (the ledger's kPadding):
  // each bucket is padded to a multiple of world * kPlanAlignElements; the
  // figure is for the last rank, whose chunks hold the most padding.
  std::int64_t device_padding = 0, host_padding = 0;
  // Host tier.
  std::int64_t host_grads = 0, host_master = 0, host_moments = 0, host_staging = 0;
  std::int64_t host_params = 0;  // stage 3 with offload_param: the parameter partition
  std::int64_t host_activations = 0;  // checkpoints kept on the host (cpu_checkpointing)
  // NVMe tier (offload "nvme"): the swap file, its states and their
  // alignment padding. The swap buffers are host_staging.
  // With the parameters on NVMe too, nvme_params is their partition.
  std::int64_t nvme_master = 0, nvme_moments = 0, nvme_params = 0, nvme_padding = 0;
  std::int64_t nvme_total() const { return nvme_master + nvme_moments + nvme_params + nvme_padding; }
  // The device bytes while the engine is built (the temporary fp32 copy of
  // the parameters beside the flat parameters and, without offload, the
  // master weights), before any activation.
  std::int64_t device_construction = 0;
  // The frozen parameters: whole on every rank (stages 0-2), or at stage 3
  // the rank's partition of them (in host memory with offload_param:
  // host_frozen; their padding is in *_padding, their gathered share in
  // device_gathered).
  std::int64_t device_frozen = 0, host_frozen = 0;

  std::int64_t device_model_states() const { return device_params + device_grads + device_master + device_moments; }
  std::int64_t host_model_states() const { return host_params + host_grads + host_master + host_moments; }
  // The device peak: the largest of construction, forward and backward, and
  // the optimizer step.
  std::int64_t device_total() const {
    const std::int64_t held = device_model_states() + device_padding + device_staging + device_frozen;
    const std::int64_t backward = held + device_buckets + device_gathered + device_activations;
    const std::int64_t step = held + device_workspace;
    const std::int64_t most = backward > step ? backward : step;
    const std::int64_t built = device_construction + device_frozen;
    return most > built ? most : built;
  }
  std::int64_t host_total() const {
    return host_model_states() + host_padding + host_staging + host_activations + host_frozen;
  }
};

MemoryEstimate estimate_memory(const EstimateInput& in);

// Human name of a configuration: "stage 2 + offload", "stage 3 + offload + params".
std::string describe_config(int stage, bool offload, bool offload_param = false);

}  // namespace zero
