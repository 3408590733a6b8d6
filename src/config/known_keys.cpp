#include "known_keys.h"

#include <array>

namespace zero::config::detail {
namespace {

constexpr KeyKind R = KeyKind::kRead;
constexpr KeyKind I = KeyKind::kIgnored;
constexpr KeyKind U = KeyKind::kUnsupported;

constexpr std::string_view kMonitoring = "it configures DeepSpeed's logging and monitoring";
constexpr std::string_view kMemoryOnly =
    "it tunes DeepSpeed's memory layout, which zerocpp manages itself";

// docs/config.md lists these too; keep the two in step.
constexpr KnownKey kKeys[] = {
    // Top level.
    {"", "train_batch_size", R},
    {"", "train_micro_batch_size_per_gpu", R},
    {"", "gradient_accumulation_steps", R},
    {"", "gradient_clipping", R},
    {"", "fp16", R},
    {"", "bf16", R},
    {"", "bfloat16", R},  // DeepSpeed's older name for bf16
    {"", "optimizer", R},
    {"", "scheduler", R},
    {"", "zero_optimization", R},
    {"", "activation_checkpointing", R},
    {"", "device_memory_limit", R},
    {"", "steps_per_print", R},
    {"", "seed", R},
    {"", "wall_clock_breakdown", R},
    {"", "comm_timeout", R},
    {"", "comm_sequence_check", R},
    {"", "nonfinite", R},
    {"", "flight_recorder", R},
    {"", "zero_allow_untested_optimizer", I, "zerocpp only offers ZeRO-aware optimizers", "false"},
    {"", "prescale_gradients", I, "gradient pre-scaling is not configurable in zerocpp", "false"},
    {"", "gradient_predivide_factor", I, "gradient pre-division is not configurable in zerocpp", "1.0"},
    {"", "communication_data_type", R},
    {"", "fp32_allreduce", I, "zerocpp reduces gradients in the training precision, so with fp16 or bf16 the "
                              "rounding differs from DeepSpeed's run", "false"},
    {"", "gradient_allreduce_op", R},
    {"", "sequence_parallel_size", U, "sequence parallelism", "1"},
    {"", "dataloader_drop_last", I, "zerocpp has no data loader of DeepSpeed's (zero-train's sampler drops the "
                                    "partial last batch)"},
    {"", "disable_python_gc", I, "zerocpp runs no Python"},
    {"", "seq_parallel_communication_data_type", I, "zerocpp has no sequence parallelism"},
    {"", "sparse_gradients", I, "zerocpp reduces all gradients densely", "false"},
    {"", "zero_force_ds_cpu_optimizer", I, "the CPU optimizer is always zerocpp's own"},
    {"", "disable_allgather", I, "zerocpp chooses its collectives itself", "false"},
    {"", "dump_state", I, kMonitoring},
    {"", "memory_breakdown", I, kMonitoring},
    {"", "flops_profiler", I, kMonitoring},
    {"", "tensorboard", I, kMonitoring},
    {"", "wandb", I, kMonitoring},
    {"", "csv_monitor", I, kMonitoring},
    {"", "comet", I, kMonitoring},
    {"", "comms_logger", I, kMonitoring},
    {"", "timers", I, kMonitoring},
    {"", "checkpoint", I, "checkpointing is configured separately in zerocpp"},
    {"", "aio", R},
    {"", "autotuning", I, "zerocpp has no autotuner"},
    {"", "compile", I, "zerocpp does not use torch.compile"},
    {"", "amp", U, "Apex AMP", "{\"enabled\": false}"},
    {"", "torch_autocast", U, "torch autocast", "{\"enabled\": false}"},
    {"", "data_types", R},
    {"", "elasticity", U, "elastic training", "{\"enabled\": false}"},
    {"", "pipeline", U, "pipeline parallelism"},
    {"", "tensor_parallel", U, "tensor parallelism"},
    {"", "sparse_attention", U, "sparse attention"},
    {"", "compression_training", U, "compression training"},
    {"", "data_efficiency", U, "data efficiency", "{\"enabled\": false}"},
    {"", "curriculum_learning", U, "curriculum learning", "{\"enabled\": false}"},
    {"", "progressive_layer_drop", U, "progressive layer dropping", "{\"enabled\": false}"},
    {"", "eigenvalue", U, "eigenvalue computation", "{\"enabled\": false}"},
    {"", "quantize_training", U, "quantized training", "{\"enabled\": false}"},
    {"", "hybrid_engine", U, "the hybrid engine", "{\"enabled\": false}"},

    {"data_types", "grad_accum_dtype", R},

    {"nonfinite", "policy", R},
    {"nonfinite", "stop_after", R},
    {"flight_recorder", "entries", R},
    {"flight_recorder", "dir", R},
    {"aio", "block_size", R},
    {"aio", "thread_count", R},
    {"aio", "intra_op_parallelism", R},
    {"aio", "queue_depth", I, "zerocpp's swapper keeps one request per I/O thread in flight"},
    {"aio", "single_submit", I, "zerocpp's swapper submits each block on its own"},
    {"aio", "overlap_events", I, "zerocpp's swapper always overlaps reads, writes and the step"},
    {"aio", "use_gds", I, "zerocpp has no GPUDirect Storage path", "false"},

    {"fp16", "enabled", R},
    {"fp16", "loss_scale", R},
    {"fp16", "initial_scale_power", R},
    {"fp16", "loss_scale_window", R},
    {"fp16", "hysteresis", R},
    {"fp16", "min_loss_scale", R},
    {"fp16", "auto_cast", I, "zerocpp does not cast the forward's inputs to fp16 (the model's forward decides its own "
                             "casts), so a model that relies on it computes in its own dtype", "false"},
    {"fp16", "consecutive_hysteresis", R},
    {"fp16", "fp16_master_weights_and_grads", U, "fp16 master weights", "false"},

    {"bf16", "enabled", R},
    {"bf16", "immediate_grad_update", I, "the gradient update timing is not configurable in zerocpp", "*"},
    {"bf16", "check_grad_overflow", I, "zerocpp always checks the gradients (the \"nonfinite\" policy acts on them)",
     "true"},
    {"bf16", "bf16_master_weights_and_grads", U, "bf16 master weights", "false"},
    {"bf16", "bf16_optimizer_states", U, "bf16 optimizer states", "false"},

    {"optimizer", "type", R},
    {"optimizer", "params", R},
    {"optimizer", "legacy_fusion", I, "zerocpp's optimizers are always fused"},
    {"optimizer.params", "lr", R},
    {"optimizer.params", "betas", R},
    {"optimizer.params", "eps", R},
    {"optimizer.params", "weight_decay", R},
    {"optimizer.params", "adam_w_mode", R},
    {"optimizer.params", "initial_accumulator_value", R},
    {"optimizer.params", "torch_adam", R},
    {"optimizer.params", "fused", I, "zerocpp's optimizers are its own"},
    {"optimizer.params", "fp32_optimizer_states", I, "zerocpp keeps optimizer states in fp32"},
    {"optimizer.params", "bias_correction", R},
    {"optimizer.params", "amsgrad", R},
    {"optimizer.params", "momentum", R},  // Muon
    {"optimizer.params", "ns_method", R},
    {"optimizer.params", "muon_lr", R},
    {"optimizer.params", "adam_lr", R},
    {"optimizer.params", "per_head_muon", R},

    {"scheduler", "type", R},
    {"scheduler", "params", R},
    {"scheduler.params", "warmup_num_steps", R},
    {"scheduler.params", "total_num_steps", R},
    {"scheduler.params", "warmup_min_lr", R},
    {"scheduler.params", "warmup_max_lr", R},
    {"scheduler.params", "warmup_min_ratio", R},
    {"scheduler.params", "cos_min_ratio", R},
    {"scheduler.params", "warmup_type", R},
    {"scheduler.params", "cycle_min_lr", R},
    {"scheduler.params", "cycle_max_lr", R},
    {"scheduler.params", "decay_lr_rate", R},
    {"scheduler.params", "cycle_first_step_size", R},
    {"scheduler.params", "cycle_second_step_size", R},
    {"scheduler.params", "cycle_first_stair_count", R},
    {"scheduler.params", "cycle_second_stair_count", R},
    {"scheduler.params", "decay_step_size", R},
    {"scheduler.params", "cycle_momentum", R},
    {"scheduler.params", "cycle_min_mom", R},
    {"scheduler.params", "cycle_max_mom", R},
    {"scheduler.params", "decay_mom_rate", R},
    {"scheduler.params", "lr_range_test_min_lr", R},
    {"scheduler.params", "lr_range_test_step_size", R},
    {"scheduler.params", "lr_range_test_step_rate", R},
    {"scheduler.params", "lr_range_test_staircase", R},
    {"scheduler.params", "last_batch_iteration", I, "a resumed run takes the step from its checkpoint", "-1"},

    {"zero_optimization", "stage", R},
    {"zero_optimization", "offload_optimizer", R},
    {"zero_optimization", "offload_param", R},
    {"zero_optimization", "overlap_comm", R},
    {"zero_optimization", "contiguous_gradients", R},
    {"zero_optimization", "grad_hooks", I, "zerocpp always reduces from gradient hooks", "true"},
    {"zero_optimization", "reduce_bucket_size", R},
    {"zero_optimization", "allgather_bucket_size", R},
    {"zero_optimization", "reduce_scatter", R},
    {"zero_optimization", "stage3_prefetch_bucket_size", R},
    {"zero_optimization", "stage3_param_persistence_threshold", R},
    {"zero_optimization", "stage3_max_live_parameters", R},
    // DeepSpeed's field names for the three above (its pydantic aliases).
    {"zero_optimization", "prefetch_bucket_size", R},
    {"zero_optimization", "param_persistence_threshold", R},
    {"zero_optimization", "max_live_parameters", R},
    {"zero_optimization", "cpu_offload", R},  // deprecated DeepSpeed spellings
    {"zero_optimization", "cpu_offload_params", R},
    {"zero_optimization", "cpu_offload_use_pin_memory", R},
    {"zero_optimization", "round_robin_gradients", I, kMemoryOnly, "false"},
    {"zero_optimization", "sub_group_size", R},
    {"zero_optimization", "stage3_max_reuse_distance", I, kMemoryOnly, "*"},
    {"zero_optimization", "max_reuse_distance", I, kMemoryOnly, "*"},
    {"zero_optimization", "save_muon_momentum_buffer_in_memory", I,
     "zerocpp's Muon momentum is part of the optimizer state partition", "*"},
    {"zero_optimization", "stage3_model_persistence_threshold", I, kMemoryOnly},
    {"zero_optimization", "model_persistence_threshold", I, kMemoryOnly},
    {"zero_optimization", "stage3_allgather_sequential", I, "zerocpp chooses its collectives itself", "false"},
    {"zero_optimization", "allgather_sequential", I, "zerocpp chooses its collectives itself", "false"},
    {"zero_optimization", "module_granularity_threshold", I, kMemoryOnly, "*"},
    {"zero_optimization", "use_all_reduce_for_fetch_params", I, "zerocpp chooses its collectives itself", "false"},
    {"zero_optimization", "compute_grad_norm", I, "zerocpp always computes the gradient norm", "true"},
    {"zero_optimization", "parameter_alignment", I, kMemoryOnly},
    {"zero_optimization", "zenflow", U, "ZenFlow's split optimizer updates", "null"},
    {"zero_optimization", "memory_efficient_linear", I, kMemoryOnly, "*"},
    {"zero_optimization", "stage3_gather_16bit_weights_on_model_save", I,
     "zerocpp's checkpoints are consolidated by a separate step"},
    {"zero_optimization", "stage3_gather_fp16_weights_on_model_save", I,
     "zerocpp's checkpoints are consolidated by a separate step"},
    {"zero_optimization", "gather_16bit_weights_on_model_save", I,
     "zerocpp's checkpoints are consolidated by a separate step"},
    {"zero_optimization", "allgather_partitions", I, "zerocpp chooses its collectives itself", "true"},
    {"zero_optimization", "load_from_fp32_weights", I, "checkpoint loading is configured separately in zerocpp", "true"},
    {"zero_optimization", "elastic_checkpoint", I, "checkpoint resharding is a separate step in zerocpp", "false"},
    {"zero_optimization", "ignore_unused_parameters", I, "it controls a check in DeepSpeed's Python hooks", "true"},
    {"zero_optimization", "legacy_stage1", I, "zerocpp has a single stage 1 implementation", "false"},
    {"zero_optimization", "stage3_module_granularity_threshold", I, kMemoryOnly, "*"},
    {"zero_optimization", "use_multi_rank_bucket_allreduce", I, "zerocpp chooses its collectives itself"},
    {"zero_optimization", "stage3_use_all_reduce_for_fetch_params", I,
     "zerocpp chooses its collectives itself", "false"},
    {"zero_optimization", "pipeline_loading_checkpoint", I, "it applies to pipeline parallelism"},
    {"zero_optimization", "override_module_apply", I, "it applies to Python modules"},
    {"zero_optimization", "log_trace_cache_warnings", I, kMonitoring},
    {"zero_optimization", "zero_hpz_partition_size", I,
     "ZeRO++'s hierarchical partitioning (a secondary copy of the parameters per node) changes only the "
     "communication", "1"},
    {"zero_optimization", "zero_quantized_weights", U, "ZeRO++ quantized weights", "false"},
    {"zero_optimization", "zero_quantized_nontrainable_weights", U, "ZeRO++ quantized weights", "false"},
    {"zero_optimization", "zero_quantized_gradients", U, "ZeRO++ quantized gradients", "false"},
    {"zero_optimization", "zeropp_loco_param", U, "ZeRO++ LoCo", "null"},
    {"zero_optimization", "mics_shard_size", U, "MiCS", "-1"},
    {"zero_optimization", "mics_hierarchical_params_gather", U, "MiCS", "false"},

    {"zero_optimization.offload_optimizer", "device", R},
    {"zero_optimization.offload_optimizer", "pin_memory", R},
    {"zero_optimization.offload_optimizer", "nvme_path", R},
    {"zero_optimization.offload_optimizer", "delayed_param_update", R},
    {"zero_optimization.offload_optimizer", "delayed_param_update_warmup_steps", R},
    {"zero_optimization.offload_optimizer", "publish_in_backward", R},
    {"zero_optimization.offload_optimizer", "cpu_threads", R},
    {"zero_optimization.offload_optimizer", "buffer_count", R},
    {"zero_optimization.offload_optimizer", "pipeline_read", I, "zerocpp always reads the NVMe state ahead"},
    {"zero_optimization.offload_optimizer", "pipeline_write", I, "zerocpp always writes the NVMe state behind"},
    {"zero_optimization.offload_optimizer", "pipeline", I, "zerocpp always pipelines the NVMe state"},
    {"zero_optimization.offload_optimizer", "fast_init", I, "it tunes DeepSpeed's NVMe initialisation"},
    {"zero_optimization.offload_optimizer", "ratio", R},

    {"zero_optimization.offload_param", "device", R},
    {"zero_optimization.offload_param", "pin_memory", R},
    {"zero_optimization.offload_param", "nvme_path", R},
    {"zero_optimization.offload_param", "buffer_count", R},
    {"zero_optimization.offload_param", "buffer_size", I,
     "zerocpp sizes each NVMe parameter buffer to the largest bucket's chunk (reduce_bucket_size bounds it, "
     "and stage3_prefetch_bucket_size with prefetch)"},
    {"zero_optimization.offload_param", "max_in_cpu", I,
     "zerocpp keeps no parameters in host memory beside the NVMe buffers (offload_param.buffer_count)"},

    {"activation_checkpointing", "partition_activations", R},
    {"activation_checkpointing", "cpu_checkpointing", R},
    {"activation_checkpointing", "contiguous_memory_optimization", R},
    {"activation_checkpointing", "number_checkpoints", I, "the model decides where to checkpoint"},
    {"activation_checkpointing", "synchronize_checkpoint_boundary", I, "it is a profiling aid", "false"},
    {"activation_checkpointing", "profile", I, kMonitoring, "false"},
};

}  // namespace

std::span<const KnownKey> known_keys() { return kKeys; }

const KnownKey* find_known_key(std::string_view section, std::string_view name) {
  for (const KnownKey& k : kKeys) {
    if (k.section == section && k.name == name) return &k;
  }
  return nullptr;
}

std::vector<std::string_view> names_in_section(std::string_view section) {
  std::vector<std::string_view> out;
  for (const KnownKey& k : kKeys) {
    if (k.section == section) out.push_back(k.name);
  }
  return out;
}

namespace {

struct RenamedKey {
  std::string_view section, name, hint;
};

// Names found in real configs that edit distance does not lead to.
constexpr RenamedKey kRenamed[] = {
    {"zero_optimization", "comm_overlap", "did you mean 'overlap_comm'?"},
    {"optimizer.params", "max_grad_norm",
     "gradient clipping is the top-level 'gradient_clipping' in DeepSpeed (\"gradient_clipping\": 1.0)"},
    {"optimizer.params", "clip_grad",
     "gradient clipping is the top-level 'gradient_clipping' in DeepSpeed (\"gradient_clipping\": 1.0)"},
    {"", "max_grad_norm", "did you mean 'gradient_clipping'?"},
    {"", "grad_clip", "did you mean 'gradient_clipping'?"},
    {"", "micro_batch_size", "did you mean 'train_micro_batch_size_per_gpu'?"},
    {"", "zero_stage", "did you mean 'zero_optimization': {\"stage\": ...}?"},
};

}  // namespace

std::optional<std::string_view> renamed_key_hint(std::string_view section, std::string_view name) {
  for (const RenamedKey& r : kRenamed) {
    if (r.section == section && r.name == name) return r.hint;
  }
  return std::nullopt;
}

std::vector<std::string_view> sections_knowing(std::string_view name, std::string_view section) {
  std::vector<std::string_view> out;
  // Those that read it first, then those that know it (a DeepSpeed key
  // zerocpp ignores or does not have is still pointed to its section).
  for (const bool read : {true, false}) {
    for (const KnownKey& k : kKeys) {
      if ((k.kind == KeyKind::kRead) == read && k.name == name && k.section != section) out.push_back(k.section);
    }
  }
  return out;
}

}  // namespace zero::config::detail
