// The "auto" values of a Hugging Face DeepSpeed config (its ds_config_zero2
// and _zero3 files), filled in from zero-train's own settings (zero-estimate's
// batch from --micro) as the
// Hugging Face Trainer fills them from its arguments
// (transformers' HfTrainerDeepSpeedConfig): the decay's end from --steps,
// the warm-up from --warmup, the batch from zero-train's default micro-batch,
// the precision from zero-train's default (bf16: `bf16.enabled` "auto" is
// true, `fp16.enabled` "auto" false; on a CPU without native bf16 zero-train
// then trains fp32, as with its embedded default: train_precision.h).
// An "auto" left unfilled is read by parse_config as "not given", with a
// note (docs/config.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero::train {

// zero-train's config without --config (its micro-batch is also what a
// Hugging Face config's "auto" batch takes, in zero-train and, without
// --micro, in zero-estimate).
inline constexpr const char* kDefaultConfig = R"({
  "train_micro_batch_size_per_gpu": 16,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}
})";

struct TrainerSettings {
  std::int64_t steps = 0;        // --steps
  std::int64_t warmup = 0;       // --warmup, or zero-train's default
  bool warmup_given = false;     // whether --warmup was given
  std::int64_t micro_batch = 0;  // zero-train's default micro-batch
  // Where the batch's values came from, for the notes.
  std::string micro_from = "zero-train's default micro-batch", accumulation_from = "zero-train's default";
};

struct FilledAutos {
  std::string text;                 // the config with the values filled in
  std::vector<std::string> filled;  // "scheduler.params.total_num_steps = 300 (--steps)", ...
  bool filled_warmup = false;       // scheduler.params.warmup_num_steps was "auto"
  bool filled_bf16 = false;         // bf16.enabled was "auto" (and is now zero-train's default, true)
};

// `text` is the config's JSON; a text that is not a JSON object comes back
// as it is (parse_config says what is wrong with it).
FilledAutos fill_trainer_autos(const std::string& text, const TrainerSettings& s);

}  // namespace zero::train
