// The training configuration: a JSON file in DeepSpeed's key names, so that a
// DeepSpeed user's ds_config.json works unchanged. parse_config() validates it
// completely up front: a wrong type, an out-of-range value or an inconsistent
// combination is a zero::Error that names the key path, the value given and
// what is expected; keys zerocpp does not know or does not use become
// sentences in Config::warnings. docs/config.md lists every key.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace zero::config {

// "optimizer": {"type": ..., "params": {...}}.
struct OptimizerConfig {
  // Canonical spelling: "Adam", "AdamW", "Adagrad", "Lion" or "Muon" (the
  // JSON value is matched case-insensitively, as DeepSpeed does).
  std::string type = "AdamW";
  float lr = 1e-3f;  // Adagrad without a given lr: 1e-2 (DeepSpeed's CPU Adagrad default)
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;  // Adagrad without a given eps: 1e-10; Lion has none
  float weight_decay = 0.0f;
  // Decoupled weight decay. "Adam" + adam_w_mode true (DeepSpeed's default)
  // means AdamW; type "AdamW" forces true; false for Adagrad and Lion (whose
  // decay is always decoupled: see decoupled_weight_decay()).
  bool adam_w_mode = true;
  // Adam's bias corrections (1 - beta^t); false steps with the raw moments,
  // as DeepSpeed's bias_correction: false does.
  bool bias_correction = true;
  float initial_accumulator_value = 0.0f;  // Adagrad only

  // "Muon": DeepSpeed's MuonWithAuxAdam. The matrices EngineOptions::use_muon
  // picks step with Muon (momentum, then the Newton-Schulz orthogonalization
  // of the update, ns_method "gram" or "standard"), the other parameters
  // with Adam (beta1, beta2, eps, adam_w_mode, bias_correction above). Each
  // half steps at its own rate, muon_lr or adam_lr (lr where not set); a
  // scheduler scales both by its rate over its peak (Engine: the halves'
  // shares of lr()).
  float momentum = 0.95f;
  std::string ns_method = "gram";
  std::optional<float> muon_lr, adam_lr;

  bool is_adam() const { return type == "Adam" || type == "AdamW"; }
  bool is_adagrad() const { return type == "Adagrad"; }
  bool is_lion() const { return type == "Lion"; }
  bool is_muon() const { return type == "Muon"; }
  // The Adam step is taken: Adam, AdamW, and Muon's Adam half.
  bool steps_adam() const { return is_adam() || is_muon(); }
  // True when weight decay is applied to the weights (AdamW's and Lion's
  // p *= 1 - lr * wd), not added to the gradient (Adam's L2, Adagrad's).
  // (Muon: of its Adam half; the Muon half always decouples.)
  bool decoupled_weight_decay() const { return (steps_adam() && adam_w_mode) || is_lion(); }
  // Optimizer state per parameter, in fp32 values: Adam's m and v; Adagrad's
  // sum; Lion's m; Muon's m and, for its matrices, the last orthogonalized
  // update in v's place.
  int moments() const { return steps_adam() ? 2 : 1; }
  bool operator==(const OptimizerConfig&) const = default;
};

// "scheduler.params" of DeepSpeed's OneCycle (its names; 1Cycle of Smith,
// arXiv:1803.09820): the rate rises from cycle_min_lr to cycle_max_lr over
// cycle_first_step_size steps and falls back over cycle_second_step_size,
// then divides by 1 + decay_lr_rate * (steps past the cycle) /
// decay_step_size. With cycle_momentum, Adam's and Lion's beta1 runs the
// other way between cycle_max_mom and cycle_min_mom (then multiplies by
// 1 + decay_mom_rate * ...), and beta2 is 0.99, as DeepSpeed sets them.
struct OneCycleConfig {
  float cycle_min_lr = 0.0f;  // required
  float cycle_max_lr = 0.0f;  // required
  float decay_lr_rate = 0.0f;
  std::int64_t cycle_first_step_size = 2000;
  std::int64_t cycle_second_step_size = 2000;  // cycle_first_step_size when not given
  std::int64_t cycle_first_stair_count = 0;    // 0: continuous
  std::int64_t cycle_second_stair_count = 0;  // cycle_first_stair_count when not given
  std::int64_t decay_step_size = 0;           // 0: no decay after the cycle
  bool cycle_momentum = true;                 // false for an optimizer without betas (Adagrad)
  float cycle_min_mom = 0.8f;
  float cycle_max_mom = 0.9f;
  float decay_mom_rate = 0.0f;
  bool operator==(const OneCycleConfig&) const = default;
};

// "scheduler.params" of DeepSpeed's LRRangeTest: the rate grows from
// lr_range_test_min_lr by lr_range_test_step_rate times the minimum every
// lr_range_test_step_size steps (continuously, or in stairs).
struct LrRangeTestConfig {
  float min_lr = 1e-3f;
  std::int64_t step_size = 2000;
  float step_rate = 1.0f;
  bool staircase = false;
  bool operator==(const LrRangeTestConfig&) const = default;
};

// "scheduler": {"type": ..., "params": {...}}. Learning rate per step:
//   WarmupLR:       warmup from warmup_min_lr to warmup_max_lr over
//                   warmup_num_steps, then constant.
//   WarmupDecayLR:  the same warmup, then linear decay to 0 at total_num_steps.
//   WarmupCosineLR: the same warmup, then cosine decay to
//                   cos_min_ratio * warmup_max_lr at total_num_steps.
//   OneCycle:       one_cycle (above).
//   LRRangeTest:    range_test (above).
// Parsing fills in every value, so the engine never sees a "0 = default".
struct SchedulerConfig {
  // "" (none), "WarmupLR", "WarmupCosineLR", "WarmupDecayLR", "OneCycle" or
  // "LRRangeTest". The warmup_* fields belong to the first three.
  std::string type;
  std::int64_t warmup_num_steps = 0;  // 1000 when a scheduler is given without it
  std::int64_t total_num_steps = 0;   // required by WarmupDecayLR and WarmupCosineLR
  float warmup_min_lr = 0.0f;
  float warmup_max_lr = 0.0f;  // resolved to optimizer.lr when not given
  float cos_min_ratio = 0.0f;  // WarmupCosineLR; 1e-4 when not given (DeepSpeed's default)
  // Warmup curve: "log" (DeepSpeed's default) or "linear".
  std::string warmup_type = "log";
  OneCycleConfig one_cycle;
  LrRangeTestConfig range_test;
  bool operator==(const SchedulerConfig&) const = default;
};

struct Fp16Config {
  bool enabled = false;
  float loss_scale = 0.0f;  // 0 = dynamic loss scaling
  int initial_scale_power = 16;  // dynamic scaling starts at 2^initial_scale_power
  int loss_scale_window = 1000;  // overflow-free steps before the scale doubles
  int hysteresis = 2;            // overflows tolerated before the scale halves
  bool consecutive_hysteresis = false;  // refill the hysteresis on every step without overflow
  float min_loss_scale = 1.0f;
  bool operator==(const Fp16Config&) const = default;
};

struct Bf16Config {
  bool enabled = false;
  bool operator==(const Bf16Config&) const = default;
};

// "zero_optimization.offload_optimizer": ZeRO-Offload (cpu) / ZeRO-Infinity (nvme).
struct OffloadOptimizerConfig {
  std::string device = "none";  // "none" | "cpu" | "nvme"
  bool pin_memory = false;
  std::string nvme_path;  // required when device is "nvme"
  // zerocpp extension: the ZeRO-Offload paper's one-step delayed parameter
  // update (DPU): the CPU optimizer step of step t overlaps the forward and
  // backward of step t+1, which then uses parameters one step stale.
  bool delayed_param_update = false;
  int delayed_param_update_warmup_steps = 10;  // steps run without delay first
  // zerocpp extension: with the delayed update, each finished piece of the
  // update goes up as soon as backward is done with its bucket, instead of
  // after backward (stages 1-2, one rank; docs/engine.md). Off unless set
  // true: a model that reads a parameter outside autograd during backward
  // (a detached use) would see the update. Kept unset when not said, so
  // that a config written back says what its file said.
  std::optional<bool> publish_in_backward;
  int cpu_threads = 0;                         // CPU optimizer threads; 0 = all cores (all but one on a GPU)
  // DeepSpeed's ZeRO-Offload++ "Twin-Flow": the fraction of the rank's
  // optimizer partition offloaded to the CPU; the rest (master, moments) stays
  // on the device and is stepped there, beside the CPU step.
  float ratio = 1.0f;
  // device "nvme" (ZeRO-Infinity): the host buffers the state is swapped
  // through, each holding one piece's master and moments (at least 2: one
  // stepped while the next is read and the last written).
  int buffer_count = 4;
  bool operator==(const OffloadOptimizerConfig&) const = default;
};

// "zero_optimization.offload_param" (stage 3 only).
struct OffloadParamConfig {
  std::string device = "none";  // "none" | "cpu" | "nvme"
  bool pin_memory = false;
  std::string nvme_path;  // required when device is "nvme"
  // device "nvme" (ZeRO-Infinity): the host buffers the partition's chunks
  // go through, one bucket's chunk each (DeepSpeed's default, 5).
  int buffer_count = 5;
  bool operator==(const OffloadParamConfig&) const = default;
};

struct ZeroOptimizationConfig {
  int stage = 0;  // 0 (data parallel), 1 (optimizer states), 2 (+ gradients), 3 (+ parameters)
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  bool overlap_comm = true;
  bool contiguous_gradients = true;
  std::int64_t reduce_bucket_size = 500000000;     // elements
  std::int64_t allgather_bucket_size = 500000000;  // elements
  bool reduce_scatter = true;
  std::int64_t stage3_prefetch_bucket_size = 50000000;
  std::int64_t stage3_param_persistence_threshold = 100000;
  std::int64_t stage3_max_live_parameters = 1000000000;
  // NVMe offload: the most elements of the optimizer partition stepped (and
  // swapped) as one piece; DeepSpeed's default.
  std::int64_t sub_group_size = 1000000000;
  bool operator==(const ZeroOptimizationConfig&) const = default;
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  bool operator==(const ActivationCheckpointingConfig&) const = default;
};

// zerocpp extension "nonfinite": what a step with a non-finite gradient
// norm (NaN or inf loss or gradients, fp16 overflow) does. Such a step is
// always skipped (no update), counted and logged; with policy "stop",
// stop_after consecutive skipped steps end training with an error.
struct NonfiniteConfig {
  std::string policy = "skip";  // "skip" | "stop"
  std::int64_t stop_after = 1;  // consecutive skipped steps; used by "stop"
  bool operator==(const NonfiniteConfig&) const = default;
};

// zerocpp extension "flight_recorder": the last `entries` collectives of each
// rank, written to <dir>/flight-recorder-rank-RRRRR.txt when a job fails.
struct FlightRecorderConfig {
  std::int64_t entries = 1024;
  std::string dir;  // "" = $ZERO_FLIGHT_RECORDER_DIR, else $TMPDIR/zerocpp-flight-recorder-<job>
  bool operator==(const FlightRecorderConfig&) const = default;
};

// "aio": how the NVMe swap file is read and written (offload "nvme").
struct AioConfig {
  std::int64_t block_size = 1048576;  // bytes per read or write request (a multiple of 4096)
  int thread_count = 1;               // I/O threads per rank
  bool operator==(const AioConfig&) const = default;
};

struct Config {
  // Resolved after parse: all three > 0 and
  // train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size.
  std::int64_t train_batch_size = 0, train_micro_batch_size_per_gpu = 0,
               gradient_accumulation_steps = 0;
  int world_size = 1;  // the data-parallel size the batch sizes were resolved for
  // Max global gradient norm; 0 = off. A parsed config without the key has
  // DeepSpeed 0.19's default, 1.0; a Config built in code starts at 0.
  float gradient_clipping = 0.0f;
  Fp16Config fp16;
  Bf16Config bf16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZeroOptimizationConfig zero_optimization;
  ActivationCheckpointingConfig activation_checkpointing;
  // zerocpp extension, bytes; 0 = no limit. JSON accepts an integer or a
  // string such as "2GB", "512MiB", "1.5 GiB" (see byte_size.h).
  std::int64_t device_memory_limit = 0;
  std::int64_t steps_per_print = 10;
  // Not the engine's (it draws no random numbers): the training script's,
  // as zero-train's when its --seed is not given. seed_given: the JSON had it.
  std::int64_t seed = 42;
  bool seed_given = false;
  bool wall_clock_breakdown = false;
  // zerocpp extensions for failures (docs/reliability.md). comm_timeout:
  // seconds a collective may take before the job fails with an error that
  // names the ranks that did not join. comm_sequence_check: the ranks compare
  // their collective sequences at every optimizer step (one 16-byte exchange
  // on a side channel).
  double comm_timeout = 600.0;
  bool comm_sequence_check = true;
  NonfiniteConfig nonfinite;
  FlightRecorderConfig flight_recorder;
  AioConfig aio;
  // Unknown keys, ignored DeepSpeed keys, "auto" values...: each a full
  // sentence starting with the source name. The caller prints them.
  std::vector<std::string> warnings;

  // e.g. "train_batch_size=32 = micro_batch 4 x accumulation 2 x world 4"
  std::string batch_summary() const;
  bool operator==(const Config&) const = default;
};

// Parses and validates. world_size = number of data-parallel ranks (>= 1).
// source names the file in messages. Throws zero::Error.
Config parse_config(std::string_view json_text, int world_size,
                    std::string_view source = "<config>");

// Reads and parses a file; an unreadable file is a zero::Error naming the path.
Config load_config(const std::filesystem::path& path, int world_size);
// The file's text, with load_config's errors (for a caller that edits it
// before parse_config).
std::string read_config_text(const std::filesystem::path& path);

// The resolved config in DeepSpeed's layout, every value filled in (for
// reports and checkpoints). parse_config(to_json(c).dump(), c.world_size)
// gives back c, warnings aside.
nlohmann::json to_json(const Config& config);

}  // namespace zero::config
