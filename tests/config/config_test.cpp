// parse_config: key names, types, ranges, cross-key rules and warnings.
#include <cstdio>
#include <fstream>
#include <limits>

#include "config_test_util.h"

namespace {

using zero::config::Config;
using zero::config::load_config;
using zero::config::parse_config;
using zero::config::to_json;
using zero::config::testing::all_warnings;
using zero::config::testing::contains;
using zero::config::testing::error_of;
using zero::config::testing::parse;

// The smallest valid config, with `extra` members added at the top level.
std::string with(std::string_view extra) {
  return "{\"train_batch_size\": 8" + std::string(extra.empty() ? "" : ", ") + std::string(extra) + "}";
}

TEST(Config, DefaultsMatchTheHeader) {
  Config c = parse(with(""));
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  Config want;
  want.train_batch_size = 8;
  want.train_micro_batch_size_per_gpu = 8;
  want.gradient_accumulation_steps = 1;
  want.gradient_clipping = 1.0f;  // DeepSpeed 0.19's default, for a parsed config only
  EXPECT_EQ(c, want);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_TRUE(c.optimizer.decoupled_weight_decay());
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, "none");
  EXPECT_EQ(c.scheduler.type, "");
}

TEST(Config, ReadsADeepSpeedConfig) {
  Config c = parse(R"({
    "train_batch_size": 64,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "steps_per_print": 100,
    "wall_clock_breakdown": true,
    "seed": 1234,
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
             "loss_scale_window": 500, "hysteresis": 3, "min_loss_scale": 0.5},
    "optimizer": {"type": "AdamW",
                  "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4, "warmup_num_steps": 100,
                             "total_num_steps": 5000, "warmup_type": "linear"}},
    "zero_optimization": {
      "stage": 2,
      "offload_optimizer": {"device": "cpu", "pin_memory": true,
                            "delayed_param_update": true, "delayed_param_update_warmup_steps": 5,
                            "publish_in_backward": true, "cpu_threads": 6, "ratio": 0.75},
      "overlap_comm": false, "contiguous_gradients": false,
      "reduce_bucket_size": 5e8, "allgather_bucket_size": 200000000, "reduce_scatter": false},
    "activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true,
                                 "contiguous_memory_optimization": true},
    "device_memory_limit": "40GiB"
  })", 8);
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_clipping, 1.0f);
  EXPECT_EQ(c.steps_per_print, 100);
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_EQ(c.seed, 1234);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0.0f);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.fp16.loss_scale_window, 500);
  EXPECT_EQ(c.fp16.hysteresis, 3);
  EXPECT_EQ(c.fp16.min_loss_scale, 0.5f);
  EXPECT_EQ(c.optimizer.lr, 3e-4f);
  EXPECT_EQ(c.optimizer.beta1, 0.8f);
  EXPECT_EQ(c.optimizer.beta2, 0.95f);
  EXPECT_EQ(c.optimizer.eps, 1e-6f);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1f);
  EXPECT_EQ(c.scheduler.type, "WarmupDecayLR");
  EXPECT_EQ(c.scheduler.warmup_num_steps, 100);
  EXPECT_EQ(c.scheduler.total_num_steps, 5000);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 3e-4f);
  EXPECT_EQ(c.scheduler.warmup_type, "linear");
  const auto& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 2);
  EXPECT_EQ(z.offload_optimizer.device, "cpu");
  EXPECT_TRUE(z.offload_optimizer.pin_memory);
  EXPECT_TRUE(z.offload_optimizer.delayed_param_update);
  EXPECT_EQ(z.offload_optimizer.delayed_param_update_warmup_steps, 5);
  EXPECT_EQ(z.offload_optimizer.publish_in_backward, std::optional<bool>(true));
  EXPECT_EQ(z.offload_optimizer.cpu_threads, 6);
  EXPECT_EQ(z.offload_optimizer.ratio, 0.75f);
  EXPECT_FALSE(z.overlap_comm);
  EXPECT_FALSE(z.contiguous_gradients);
  EXPECT_EQ(z.reduce_bucket_size, 500000000);
  EXPECT_EQ(z.allgather_bucket_size, 200000000);
  EXPECT_FALSE(z.reduce_scatter);
  EXPECT_TRUE(c.activation_checkpointing.partition_activations);
  EXPECT_TRUE(c.activation_checkpointing.cpu_checkpointing);
  EXPECT_TRUE(c.activation_checkpointing.contiguous_memory_optimization);
  EXPECT_EQ(c.device_memory_limit, 40LL << 30);
}

// --- Unknown and ignored keys ---------------------------------------------

TEST(Config, MisspeltNestedKeyWarnsWithTheFullPathAndASuggestion) {
  Config c = parse(with(R"("zero_optimization": {"stage": 3, "stage3_prefech_bucket_size": 1000})"));
  ASSERT_EQ(c.warnings.size(), 1u) << all_warnings(c);
  EXPECT_EQ(c.warnings[0],
            "test.json: unknown key 'zero_optimization.stage3_prefech_bucket_size' is ignored; "
            "did you mean 'stage3_prefetch_bucket_size'?");
  // The misspelt value was not used.
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50000000);
}

TEST(Config, MisspeltKeysAtEveryLevel) {
  Config c = parse(R"({"train_batch_size": 8, "gradient_acumulation_steps": 1,
                       "optimizer": {"type": "Adam", "params": {"lr": 0.1, "weight_decy": 0.1}},
                       "fp16": {"enabeld": true}})");
  std::string w = all_warnings(c);
  EXPECT_CONTAINS(w, "'gradient_acumulation_steps' is ignored; did you mean 'gradient_accumulation_steps'?");
  EXPECT_CONTAINS(w, "'optimizer.params.weight_decy' is ignored; did you mean 'weight_decay'?");
  EXPECT_CONTAINS(w, "'fp16.enabeld' is ignored; did you mean 'enabled'?");
  EXPECT_FALSE(c.fp16.enabled);
}

// A loss-scale floor above the start is taken as DeepSpeed takes it (the
// first halving raises the scale to it), and said.
TEST(Config, AFloorAboveTheLossScalesStartIsSaid) {
  Config c = parse(with(R"("fp16": {"enabled": true, "initial_scale_power": 4, "min_loss_scale": 1024})"));
  ASSERT_EQ(c.warnings.size(), 1u) << all_warnings(c);
  EXPECT_EQ(c.warnings[0],
            "test.json: 'fp16.min_loss_scale' (1024) is above the dynamic loss scale's start, "
            "2^initial_scale_power = 16: the first overflow that halves the scale raises it to 1024 instead "
            "(DeepSpeed's max(scale / 2, min_loss_scale)), and an overflow there ends the run. Give a "
            "min_loss_scale of at most 16 for a floor below the start");
  EXPECT_EQ(c.fp16.min_loss_scale, 1024.0f);
  EXPECT_TRUE(parse(with(R"("fp16": {"enabled": true, "initial_scale_power": 10, "min_loss_scale": 1024})"))
                  .warnings.empty());
}

TEST(Config, KeyAtTheWrongLevelSaysWhereItBelongs) {
  Config c = parse(with(R"("offload_optimizer": {"device": "cpu"})"));
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_CONTAINS(c.warnings[0], "unknown key 'offload_optimizer' is ignored; it belongs inside "
                                 "'zero_optimization' ('zero_optimization.offload_optimizer')");
  c = parse(with(R"("zero_optimization": {"train_batch_size": 4})"));
  EXPECT_CONTAINS(all_warnings(c), "it belongs at the top level");
  // A DeepSpeed key zerocpp ignores or does not have is pointed home too.
  c = parse(with(R"("round_robin_gradients": false, "stage3_max_reuse_distance": 5, "mics_shard_size": -1)"));
  const std::string w = all_warnings(c);
  EXPECT_CONTAINS(w, "unknown key 'round_robin_gradients' is ignored; it belongs inside 'zero_optimization' "
                     "('zero_optimization.round_robin_gradients')");
  EXPECT_CONTAINS(w, "'stage3_max_reuse_distance' is ignored; it belongs inside 'zero_optimization'");
  EXPECT_CONTAINS(w, "'mics_shard_size' is ignored; it belongs inside 'zero_optimization'");
}

TEST(Config, UnknownKeyWithoutAGuess) {
  Config c = parse(with(R"("my_private_setting": {"x": 1})"));
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_EQ(c.warnings[0], "test.json: unknown key 'my_private_setting' is ignored");
}

TEST(Config, HarmlessDeepSpeedKeysAreIgnoredWithANote) {
  Config c = parse(R"({
    "train_batch_size": 8,
    "zero_allow_untested_optimizer": true, "prescale_gradients": true,
    "gradient_predivide_factor": 2.0, "communication_data_type": "fp16",
    "fp16": {"enabled": true},
    "zero_optimization": {"stage": 2, "round_robin_gradients": true, "sub_group_size": 1e9,
                          "stage3_gather_16bit_weights_on_model_save": true,
                          "allgather_partitions": false, "load_from_fp32_weights": false}
  })");
  const std::vector<std::string> ignored = {
      "'zero_allow_untested_optimizer'", "'prescale_gradients'", "'gradient_predivide_factor'",
      "'zero_optimization.round_robin_gradients'",
      "'zero_optimization.stage3_gather_16bit_weights_on_model_save'",
      "'zero_optimization.allgather_partitions'", "'zero_optimization.load_from_fp32_weights'"};
  ASSERT_EQ(c.warnings.size(), ignored.size()) << all_warnings(c);
  for (std::size_t i = 0; i < ignored.size(); ++i) {
    EXPECT_CONTAINS(c.warnings[i], "test.json: " + ignored[i] + " is a DeepSpeed key that zerocpp ignores: ");
    EXPECT_EQ(c.warnings[i].back(), '.') << c.warnings[i];
  }
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 1000000000);  // read (NVMe's piece bound), silently

  // Keys that tune only DeepSpeed's speed or memory pass without a note
  // whatever their value (Hugging Face's ZeRO-3 config has several).
  c = parse(with(R"("bf16": {"enabled": true, "immediate_grad_update": true, "check_grad_overflow": true},
                    "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 1e9, "memory_efficient_linear": false,
                                          "zero_hpz_partition_size": 1})"));
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
}

// The keys of how DeepSpeed reduces and accumulates gradients: silent where
// they say what zerocpp does (the training precision, the mean), a warning
// where DeepSpeed's rounding would differ, an error for a sum over ranks.
TEST(Config, ReductionKeysNameWhereTheyDiffer) {
  Config c = parse(with(R"("bf16": {"enabled": true}, "communication_data_type": "bf16",
                           "data_types": {"grad_accum_dtype": null}, "gradient_allreduce_op": "mean")"));
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  // DeepSpeed's other names of a dtype (its DtypeEnum).
  c = parse(with(R"("bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "torch.bfloat16"})"));
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  c = parse(with(R"("fp16": {"enabled": true}, "data_types": {"grad_accum_dtype": "half"})"));
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  c = parse(with(R"("bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "float32"})"));
  EXPECT_CONTAINS(all_warnings(c), "'data_types.grad_accum_dtype' \"fp32\" is not supported");
  c = parse(with(R"("bf16": {"enabled": true}, "communication_data_type": "fp32",
                    "data_types": {"grad_accum_dtype": "fp32"})"));
  ASSERT_EQ(c.warnings.size(), 2u) << all_warnings(c);
  EXPECT_CONTAINS(c.warnings[0], "'communication_data_type' \"fp32\" is not supported: zerocpp reduces gradients in "
                                 "the training precision (bf16)");
  EXPECT_CONTAINS(c.warnings[1], "'data_types.grad_accum_dtype' \"fp32\" is not supported");
  EXPECT_CONTAINS(error_of(with(R"("gradient_allreduce_op": "sum")")),
                  "gradient_allreduce_op: \"sum\" is not supported: zerocpp averages gradients over the ranks");
  EXPECT_CONTAINS(error_of(with(R"("communication_data_type": "int8")")),
                  "communication_data_type: expected one of \"fp32\", \"fp16\", \"bf16\"");
  c = parse(with(R"("fp16": {"enabled": true, "auto_cast": true}, "sequence_parallel_size": 2)"));
  EXPECT_CONTAINS(all_warnings(c), "'fp16.auto_cast' is a DeepSpeed key that zerocpp ignores: zerocpp does not cast "
                                   "the forward's inputs to fp16");
  EXPECT_CONTAINS(all_warnings(c), "'sequence_parallel_size' asks for sequence parallelism");
  c = parse(with(R"("fp16": {"enabled": true, "auto_cast": false})"));
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
}

// DeepSpeed reads each stage-3 key under its pydantic field name too, and
// takes sub_group_size 0 (a sub-group per parameter).
TEST(Config, Stage3KeysUnderDeepSpeedsFieldNames) {
  Config c = parse(with(R"("zero_optimization": {"stage": 3, "prefetch_bucket_size": 123,
                           "param_persistence_threshold": 45, "max_live_parameters": 6789, "sub_group_size": 0})"));
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 123);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 45);
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, 6789);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 1000000000);
  ASSERT_EQ(c.warnings.size(), 1u) << all_warnings(c);
  EXPECT_CONTAINS(c.warnings[0], "'zero_optimization.sub_group_size' is ignored: 0 (DeepSpeed: a sub-group per "
                                 "parameter) keeps zerocpp's own pieces");
  EXPECT_CONTAINS(error_of(with(R"("zero_optimization": {"stage": 3, "prefetch_bucket_size": 1,
                                                        "stage3_prefetch_bucket_size": 2})")),
                  "zero_optimization.prefetch_bucket_size: gives the same setting as "
                  "'zero_optimization.stage3_prefetch_bucket_size' (DeepSpeed reads either name): keep one");
}

TEST(Config, UnsupportedFeaturesWarnUnlessTurnedOff) {
  Config c = parse(with(R"("amp": {"enabled": true, "opt_level": "O1"})"));
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_CONTAINS(c.warnings[0], "'amp' asks for Apex AMP, which zerocpp does not support");
  c = parse(with(R"("amp": {"enabled": false, "opt_level": "O1"})"));
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_CONTAINS(c.warnings[0], "'amp' turns off Apex AMP, which zerocpp does not have; it is ignored.");
  // "false" as a string turns it off too (as read_bool reads it).
  c = parse(with(R"("amp": {"enabled": "False"})"));
  ASSERT_EQ(c.warnings.size(), 1u) << all_warnings(c);
  EXPECT_CONTAINS(c.warnings[0], "'amp' turns off Apex AMP");
  c = parse(with(R"("zero_optimization": {"zero_quantized_gradients": false, "zero_quantized_weights": true})"));
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_CONTAINS(c.warnings[0], "turns off ZeRO++ quantized gradients");
  EXPECT_CONTAINS(c.warnings[1], "asks for ZeRO++ quantized weights");
}

TEST(Config, AutoValuesMeanNotGivenWithANote) {
  Config c = parse(with(R"("gradient_clipping": "auto", "fp16": {"enabled": "auto"},
                           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto",
                                                                     "betas": "auto"}})"));
  EXPECT_EQ(c.gradient_clipping, 1.0f);  // DeepSpeed 0.19's default, and the Trainer's max_grad_norm
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.optimizer.lr, 1e-3f);
  EXPECT_EQ(c.optimizer.beta2, 0.999f);
  ASSERT_EQ(c.warnings.size(), 5u) << all_warnings(c);
  EXPECT_CONTAINS(c.warnings[2], "'optimizer.params.lr' is \"auto\", which zerocpp reads as not given");
  // Each says the value used, in the order of the keys.
  EXPECT_CONTAINS(c.warnings[0], "'gradient_clipping' is \"auto\", which zerocpp reads as not given: it uses 1.0 "
                                 "(the Hugging Face Trainer would fill in its own value");
  EXPECT_CONTAINS(c.warnings[1], "'fp16.enabled' is \"auto\", which zerocpp reads as not given: it uses false");
  EXPECT_CONTAINS(c.warnings[2], "it uses 0.001 (the Hugging Face Trainer would fill in its own value");
  EXPECT_CONTAINS(c.warnings[4], "'optimizer.params.betas' is \"auto\", which zerocpp reads as not given: it uses "
                                 "[0.9,0.999]");
  // A derived value: the batch size from the other two.
  c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})");
  EXPECT_CONTAINS(all_warnings(c), "'train_batch_size' is \"auto\", which zerocpp reads as not given: it uses 8");
  // Zeros that mean something else are said so.
  c = parse(with(R"("device_memory_limit": "auto", "fp16": {"enabled": true, "loss_scale": "auto"})"));
  EXPECT_CONTAINS(all_warnings(c), "'device_memory_limit' is \"auto\", which zerocpp reads as not given: it uses 0 "
                                   "(no limit)");
  EXPECT_CONTAINS(all_warnings(c), "'fp16.loss_scale' is \"auto\", which zerocpp reads as not given: it uses 0.0 "
                                   "(a dynamic loss scale)");
  // Strings that are not "auto" stay errors.
  EXPECT_CONTAINS(error_of(with(R"("gradient_clipping": "1.0")")),
                  "gradient_clipping: expected a number, got \"1.0\"");
}

TEST(Config, NullMeansNotGiven) {
  Config c = parse(with(R"("gradient_clipping": null, "fp16": null,
                           "zero_optimization": {"stage": 1, "offload_optimizer": null,
                                                 "reduce_bucket_size": null})"));
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  EXPECT_EQ(c.zero_optimization.stage, 1);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
}

// Values DeepSpeed's own schema allows (ge=0) and its users' configs use:
// transformers' ZeRO-3 test config has reduce_bucket_size 0.
TEST(Config, ZerosDeepSpeedAllowsAreAccepted) {
  Config c = parse(with(R"("zero_optimization": {"stage": 3, "reduce_bucket_size": 0, "allgather_bucket_size": 0,
                                                 "stage3_max_live_parameters": 0, "stage3_prefetch_bucket_size": 0,
                                                 "stage3_param_persistence_threshold": 0})"));
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 0);
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, 0);
  Config back = parse_config(to_json(c).dump(), 1);
  c.warnings.clear();
  back.warnings.clear();
  EXPECT_EQ(back, c);
}

// An ignored DeepSpeed key set to what zerocpp does anyway says nothing;
// set otherwise, it is named. "auto" batch sizes and step counts are named
// as "auto" in the error.
TEST(Config, IgnoredKeysAtZerocppsBehaviourAreSilentAndAutoIsNamed) {
  Config quiet = parse(with(R"("prescale_gradients": false, "zero_allow_untested_optimizer": false,
                               "gradient_predivide_factor": 1.0,
                               "zero_optimization": {"stage": 2, "allgather_partitions": true,
                                                     "round_robin_gradients": false})"));
  EXPECT_TRUE(quiet.warnings.empty()) << all_warnings(quiet);
  Config loud = parse(with(R"("prescale_gradients": true, "seq_parallel_communication_data_type": "fp32",
                              "zero_optimization": {"stage": 2, "allgather_partitions": false})"));
  const std::string w = all_warnings(loud);
  EXPECT_CONTAINS(w, "'prescale_gradients' is a DeepSpeed key that zerocpp ignores");
  EXPECT_CONTAINS(w, "'seq_parallel_communication_data_type' is a DeepSpeed key that zerocpp ignores: zerocpp has "
                     "no sequence parallelism");
  EXPECT_CONTAINS(w, "'zero_optimization.allgather_partitions' is a DeepSpeed key that zerocpp ignores");

  EXPECT_CONTAINS(error_of(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                               "gradient_accumulation_steps": "auto"})"),
                  "the batch sizes are \"auto\" (a value the Hugging Face Trainer fills in; zerocpp reads it as "
                  "not given): set train_batch_size or train_micro_batch_size_per_gpu (or both) to a number");
  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}})")),
                  "scheduler.params.total_num_steps: is \"auto\" (the Hugging Face Trainer fills in its step count), "
                  "and it is required by WarmupDecayLR");
}

TEST(Config, WarningsAreSentencesNamingTheSource) {
  Config c = parse(with(R"("trian_batch_size": 8, "prescale_gradients": true)"));
  for (const std::string& w : c.warnings) EXPECT_EQ(w.rfind("test.json: ", 0), 0u) << w;
}

TEST(Config, DuplicateKeysAreAnError) {
  EXPECT_CONTAINS(error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1},
                       "zero_optimization": {"stage": 2}})"),
                  "test.json:2:24: key 'zero_optimization' is given twice in the same object (first at line 1, "
                  "column 25): keep one of them");
}

// --- Types and ranges -------------------------------------------------------

TEST(Config, WrongTypeNamesKeyValueAndExpectation) {
  EXPECT_EQ(error_of(with(R"("zero_optimization": {"stage": "two"})")),
            "test.json: zero_optimization.stage: expected an integer 0..3, got \"two\"");
  EXPECT_EQ(error_of(with(R"("zero_optimization": {"overlap_comm": "yes"})")),
            "test.json: zero_optimization.overlap_comm: expected true or false, got \"yes\"");
  EXPECT_EQ(error_of(with(R"("fp16": true)")),
            "test.json: fp16: expected an object such as {\"enabled\": true}, got true");
  EXPECT_EQ(error_of(with(R"("zero_optimization": {"offload_optimizer": {"nvme_path": 7}})")),
            "test.json: zero_optimization.offload_optimizer.nvme_path: expected a string, got 7");
  EXPECT_EQ(error_of(R"([{"train_batch_size": 8}])"),
            "test.json: expected a JSON object ({...}) at the top level, got [{\"train_batch_size\": 8}]");
}

TEST(Config, LongValuesAreCutInMessages) {
  std::string e = error_of(with("\"zero_optimization\": {\"stage\": \"" + std::string(1000, 'x') + "\"}"));
  EXPECT_LT(e.size(), 200u) << e;
  e = error_of(with(R"("zero_optimization": {"stage": [1, 2, 3, 4, 5, 6, [7, [8]]]})"));
  EXPECT_CONTAINS(e, "got [1, 2, 3, 4, ...]");
}

TEST(Config, Stage) {
  for (int stage = 0; stage <= 3; ++stage) {
    EXPECT_EQ(parse(with("\"zero_optimization\": {\"stage\": " + std::to_string(stage) + "}"))
                  .zero_optimization.stage,
              stage);
  }
  for (const char* bad : {"4", "-1", "2.5", "true", "[2]"}) {
    EXPECT_CONTAINS(error_of(with(std::string("\"zero_optimization\": {\"stage\": ") + bad + "}")),
                    std::string("zero_optimization.stage: expected an integer 0..3, got ") + bad);
  }
}

struct RangeCase {
  const char* extra;
  const char* message;
};

TEST(Config, RangesAreChecked) {
  const RangeCase cases[] = {
      {R"("optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.0]}})",
       "optimizer.params.betas[1]: expected a number in [0, 1), got 1.0"},
      {R"("optimizer": {"type": "Adam", "params": {"betas": [-0.1, 0.9]}})",
       "optimizer.params.betas[0]: expected a number in [0, 1), got -0.1"},
      {R"("optimizer": {"type": "Adam", "params": {"betas": [0.9]}})",
       "optimizer.params.betas: expected two numbers [beta1, beta2], each a number in [0, 1), got [0.9]"},
      {R"("optimizer": {"type": "Adam", "params": {"betas": ["a", 0.9]}})",
       "optimizer.params.betas[0]: expected a number in [0, 1), got \"a\""},
      {R"("optimizer": {"type": "Adam", "params": {"lr": -0.001}})",
       "optimizer.params.lr: expected a number >= 0, got -0.001"},
      {R"("optimizer": {"type": "Adam", "params": {"eps": 0}})",
       "optimizer.params.eps: expected a number > 0, got 0"},
      {R"("optimizer": {"type": "Adam", "params": {"eps": 1e-50}})",
       "optimizer.params.eps: expected a number > 0, got 1e-50"},
      {R"("optimizer": {"type": "Adam", "params": {"weight_decay": -0.01}})",
       "optimizer.params.weight_decay: expected a number >= 0, got -0.01"},
      {R"("optimizer": {"type": "Adam", "params": {"lr": 1e39}})",
       "optimizer.params.lr: expected a number >= 0 that fits a 32-bit float, got 1e+39"},
      {R"("fp16": {"hysteresis": 0})", "fp16.hysteresis: expected a positive integer"},
      {R"("fp16": {"loss_scale_window": 0})", "fp16.loss_scale_window: expected a positive integer"},
      {R"("fp16": {"loss_scale_window": 3000000000})", "fp16.loss_scale_window: expected a positive integer (at most 2147483647), got 3000000000"},
      {R"("fp16": {"min_loss_scale": -0.5})", "fp16.min_loss_scale: expected a number >= 0, got -0.5"},
      {R"("fp16": {"loss_scale": -1})", "fp16.loss_scale: expected a number >= 0, got -1"},
      {R"("fp16": {"initial_scale_power": 128})", "fp16.initial_scale_power: expected an integer 0..127, got 128"},
      {R"("zero_optimization": {"reduce_bucket_size": -1})", "zero_optimization.reduce_bucket_size: expected an integer >= 0, got -1"},
      {R"("zero_optimization": {"allgather_bucket_size": -5})", "zero_optimization.allgather_bucket_size: expected an integer >= 0, got -5"},
      {R"("zero_optimization": {"stage3_prefetch_bucket_size": -1})", "zero_optimization.stage3_prefetch_bucket_size: expected an integer >= 0, got -1"},
      {R"("zero_optimization": {"stage3_max_live_parameters": -2})", "zero_optimization.stage3_max_live_parameters: expected an integer >= 0"},
      {R"("zero_optimization": {"stage3_param_persistence_threshold": -1})", "zero_optimization.stage3_param_persistence_threshold: expected an integer >= 0, got -1"},
      {R"("zero_optimization": {"reduce_bucket_size": 1e30})", "zero_optimization.reduce_bucket_size: expected an integer >= 0, got 1e+30"},
      {R"("seed": 18446744073709551615)", "seed: expected an integer >= 0, got 18446744073709551615: too large (at most 9223372036854775807)"},
      {R"("seed": -1)", "seed: expected an integer >= 0, got -1"},
      {R"("train_micro_batch_size_per_gpu": 1e20)", "train_micro_batch_size_per_gpu: expected a positive integer, got 1e+20: too large (at most 9223372036854775807)"},
      {R"("zero_optimization": {"reduce_bucket_size": 18446744073709551615})", "zero_optimization.reduce_bucket_size: expected an integer >= 0, got 18446744073709551615"},
      {R"("zero_optimization": {"offload_optimizer": {"cpu_threads": -1}})", "zero_optimization.offload_optimizer.cpu_threads: expected an integer >= 0"},
      {R"("zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 1.5}})", "zero_optimization.offload_optimizer.ratio: expected a number in [0, 1], got 1.5"},
      {R"("zero_optimization": {"offload_optimizer": {"delayed_param_update_warmup_steps": -1}})", "zero_optimization.offload_optimizer.delayed_param_update_warmup_steps: expected an integer >= 0 (at most 2147483647), got -1"},
      {R"("steps_per_print": 0)", "steps_per_print: expected a positive integer, got 0"},
      {R"("device_memory_limit": -1)", "device_memory_limit: expected a byte count >= 0"},
      {R"("device_memory_limit": "lots")", "device_memory_limit: expected a byte count >= 0: an integer, or a string such as \"2GB\""},
      {R"("device_memory_limit": "2G")", "device_memory_limit: expected a byte count >= 0: an integer, or a string such as \"2GB\", \"512MiB\" or \"1.5 GiB\" (KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024), got \"2G\""},
  };
  for (const RangeCase& rc : cases) {
    std::string e = error_of(with(rc.extra));
    EXPECT_CONTAINS(e, std::string("test.json: ") + rc.message);
  }
}

TEST(Config, BoundaryValuesAreAccepted) {
  Config c = parse(with(R"("optimizer": {"type": "Adam", "params": {"betas": [0, 0.9999], "lr": 0,
                                                                    "weight_decay": 0}},
                           "gradient_clipping": 0, "fp16": {"hysteresis": 1, "loss_scale_window": 1,
                                                            "initial_scale_power": 0},
                           "zero_optimization": {"stage3_param_persistence_threshold": 0,
                                                 "reduce_bucket_size": 1})"));
  EXPECT_EQ(c.optimizer.beta1, 0.0f);
  EXPECT_EQ(c.optimizer.lr, 0.0f);
  EXPECT_EQ(c.fp16.initial_scale_power, 0);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 1);
}

TEST(Config, DeviceMemoryLimit) {
  EXPECT_EQ(parse(with(R"("device_memory_limit": "2GB")")).device_memory_limit, 2000000000);
  EXPECT_EQ(parse(with(R"("device_memory_limit": "512MiB")")).device_memory_limit, 512LL << 20);
  EXPECT_EQ(parse(with(R"("device_memory_limit": "1.5 GiB")")).device_memory_limit, 3LL << 29);
  EXPECT_EQ(parse(with(R"("device_memory_limit": 1073741824)")).device_memory_limit, 1LL << 30);
  EXPECT_EQ(parse(with(R"("device_memory_limit": 2e9)")).device_memory_limit, 2000000000);
  EXPECT_EQ(parse(with(R"("device_memory_limit": 0)")).device_memory_limit, 0);
}

// --- Rules between keys ------------------------------------------------------

TEST(Config, Fp16AndBf16Exclude) {
  EXPECT_CONTAINS(error_of(with(R"("fp16": {"enabled": true}, "bf16": {"enabled": true})")),
                  "fp16.enabled and bf16.enabled are both true; enable at most one of them");
  Config c = parse(with(R"("fp16": {"enabled": false}, "bf16": {"enabled": true})"));
  EXPECT_TRUE(c.bf16.enabled);
}

TEST(Config, Bfloat16IsTheOldNameOfBf16) {
  Config c = parse(with(R"("bfloat16": {"enabled": true})"));
  EXPECT_TRUE(c.bf16.enabled);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_CONTAINS(c.warnings[0], "'bfloat16' is DeepSpeed's older name for 'bf16'");
  EXPECT_CONTAINS(error_of(with(R"("bf16": {"enabled": true}, "bfloat16": {"enabled": true})")),
                  "both 'bf16' and 'bfloat16'");
  EXPECT_CONTAINS(error_of(with(R"("bfloat16": {"enabled": 1})")),
                  "bfloat16.enabled: expected true or false, got 1");
}

TEST(Config, OffloadDevice) {
  Config c = parse(with(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "CPU"}})"));
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, "cpu");
  EXPECT_CONTAINS(error_of(with(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}})")),
                  "zero_optimization.offload_optimizer.device: expected one of \"none\", \"cpu\", "
                  "\"nvme\", got \"gpu\"");
  EXPECT_CONTAINS(error_of(with(R"("zero_optimization": {"stage": 3, "offload_param": {"device": 1}})")),
                  "zero_optimization.offload_param.device: expected one of \"none\", \"cpu\", \"nvme\", got 1");
}

// The optimizer's NVMe tier as DeepSpeed spells it (offload_optimizer.nvme_path,
// buffer_count, sub_group_size, aio).
TEST(Config, NvmeOptimizerTierIsRead) {
  Config c = parse(with(R"("zero_optimization": {"stage": 3, "sub_group_size": 5000,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 3,
                            "pipeline_read": true, "delayed_param_update": true}},
      "aio": {"block_size": 262144, "queue_depth": 8, "thread_count": 2, "single_submit": false,
              "overlap_events": true})"));
  const auto& oo = c.zero_optimization.offload_optimizer;
  EXPECT_EQ(oo.device, "nvme");
  EXPECT_EQ(oo.nvme_path, "/local_nvme");
  EXPECT_EQ(oo.buffer_count, 3);
  EXPECT_TRUE(oo.delayed_param_update);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 5000);
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_EQ(c.aio.thread_count, 2);
  EXPECT_CONTAINS(all_warnings(c), "'aio.queue_depth' is a DeepSpeed key that zerocpp ignores");
  EXPECT_CONTAINS(all_warnings(c), "'zero_optimization.offload_optimizer.pipeline_read'");
  EXPECT_EQ(parse(with(R"("aio": {"intra_op_parallelism": 4})")).aio.thread_count, 4);  // DeepSpeed's newer name
  EXPECT_CONTAINS(error_of(with(R"("aio": {"intra_op_parallelism": 4, "thread_count": 1})")),
                  "aio.intra_op_parallelism: and aio.thread_count are the same setting");

  EXPECT_CONTAINS(error_of(with(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}})")),
                  "test.json: zero_optimization.offload_optimizer.nvme_path: is required with "
                  "offload_optimizer.device \"nvme\"");
  EXPECT_CONTAINS(error_of(with(R"("zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/n", "buffer_count": 1}})")),
                  "zero_optimization.offload_optimizer.buffer_count: expected an integer 2..64, got 1");
  EXPECT_CONTAINS(error_of(with(R"("aio": {"block_size": 5000})")), "aio.block_size: must be a multiple of 4096");
  EXPECT_CONTAINS(all_warnings(parse(with(R"("zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu", "buffer_count": 8}})"))),
                  "'zero_optimization.offload_optimizer.buffer_count'");
}

// The parameters' NVMe tier (ZeRO-Infinity) as DeepSpeed spells it: its
// folder is required, the optimizer must step on the CPU, buffer_size and
// max_in_cpu are read and ignored with a note that says why.
TEST(Config, NvmeParameterTierIsRead) {
  Config c = parse(with(R"("zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 4,
                        "buffer_size": 100000000, "max_in_cpu": 1000000000}})"));
  const auto& op = c.zero_optimization.offload_param;
  EXPECT_EQ(op.device, "nvme");
  EXPECT_EQ(op.nvme_path, "/local_nvme");
  EXPECT_EQ(op.buffer_count, 4);
  EXPECT_CONTAINS(all_warnings(c), "'zero_optimization.offload_param.buffer_size'");
  EXPECT_CONTAINS(all_warnings(c), "largest bucket's chunk");
  EXPECT_CONTAINS(all_warnings(c), "'zero_optimization.offload_param.max_in_cpu'");
  EXPECT_EQ(parse(with(R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "nvme", "nvme_path": "/n"}})")).zero_optimization.offload_param.buffer_count, 5);
  EXPECT_CONTAINS(error_of(with(R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "nvme"}})")),
                  "zero_optimization.offload_param.nvme_path: is required with offload_param.device \"nvme\"");
  EXPECT_CONTAINS(error_of(with(R"("zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": "/n"}})")),
                  "zero_optimization.offload_param.device: is \"nvme\" but offload_optimizer.device is \"none\"");
  const Config below = parse(with(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "nvme", "nvme_path": "/n"}})"));
  EXPECT_EQ(below.zero_optimization.offload_param.device, "none");
  EXPECT_CONTAINS(all_warnings(below), "parameter offload needs stage 3");
  EXPECT_CONTAINS(error_of(with(R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "nvme", "nvme_path": "/n", "buffer_count": 1}})")),
                  "zero_optimization.offload_param.buffer_count: expected an integer 2..64, got 1");
  EXPECT_CONTAINS(all_warnings(parse(with(R"("zero_optimization": {"stage": 3,
      "offload_param": {"device": "cpu", "buffer_count": 8}})"))),
                  "'zero_optimization.offload_param.buffer_count'");
}

TEST(Config, OffloadNeedsAPartitionedOptimizer) {
  std::string e = error_of(with(R"("zero_optimization": {"offload_optimizer": {"device": "cpu"}})"));
  EXPECT_CONTAINS(e, "zero_optimization.offload_optimizer.device: is \"cpu\" but zero_optimization.stage is 0");
  EXPECT_CONTAINS(e, "set zero_optimization.stage to 1 or 2");
  for (int stage : {1, 2, 3}) {
    EXPECT_NO_THROW(parse(with("\"zero_optimization\": {\"stage\": " + std::to_string(stage) +
                               ", \"offload_optimizer\": {\"device\": \"cpu\"}}")));
  }
}

TEST(Config, DelayedParamUpdateNeedsCpuOffload) {
  std::string e = error_of(with(R"("zero_optimization": {"stage": 2,
      "offload_optimizer": {"delayed_param_update": true}})"));
  EXPECT_CONTAINS(e, "zero_optimization.offload_optimizer.delayed_param_update: needs "
                     "offload_optimizer.device \"cpu\"");
  EXPECT_CONTAINS(e, "but the device is \"none\"");
  Config c = parse(with(R"("zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu", "delayed_param_update": true}})"));
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.delayed_param_update);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps, 10);
  // Unset: the engine's default, on wherever it applies.
  EXPECT_FALSE(c.zero_optimization.offload_optimizer.publish_in_backward.has_value());
}

// DeepSpeed's Twin-Flow share: the offloaded fraction of the optimizer
// state, read only where there is a CPU offload to share with.
TEST(Config, OffloadRatio) {
  Config c = parse(with(R"("zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu", "ratio": 0.3}})"));
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.ratio, 0.3f);
  EXPECT_EQ(parse(with(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}})"))
                .zero_optimization.offload_optimizer.ratio,
            1.0f);
  c = parse(with(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"ratio": 0.5}})"));
  ASSERT_EQ(c.warnings.size(), 1u) << all_warnings(c);
  EXPECT_CONTAINS(c.warnings[0], "ratio");
  EXPECT_CONTAINS(c.warnings[0], "offloaded optimizer");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.ratio, 1.0f);
  EXPECT_CONTAINS(error_of(with(R"("zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": -0.1}})")),
                  "zero_optimization.offload_optimizer.ratio: expected a number in [0, 1], got -0.1");
}

// Below stage 3 DeepSpeed accepts offload_param and does nothing with it
// (DeepSpeed-Chat's stage-2 offload config has it): ignored, said.
TEST(Config, ParamOffloadBelowStage3IsIgnoredWithAWarning) {
  for (int stage : {0, 1, 2}) {
    const Config c = parse(with("\"zero_optimization\": {\"stage\": " + std::to_string(stage) +
                                ", \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true}}"));
    EXPECT_EQ(c.zero_optimization.offload_param.device, "none");
    ASSERT_EQ(c.warnings.size(), 1u) << all_warnings(c);
    EXPECT_CONTAINS(c.warnings[0], "'zero_optimization.offload_param' is ignored: its device is \"cpu\" but "
                                   "zero_optimization.stage is " + std::to_string(stage));
    EXPECT_CONTAINS(c.warnings[0], "set zero_optimization.stage to 3");
  }
  const Config c = parse(with(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}})"));
  EXPECT_EQ(c.zero_optimization.offload_param.device, "cpu");
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
}

// deepspeed.ai's getting-started config: "zero_optimization": true.
TEST(Config, ZeroOptimizationAsABooleanIsStage1Or0) {
  Config c = parse(with(R"("zero_optimization": true)"));
  EXPECT_EQ(c.zero_optimization.stage, 1);
  ASSERT_EQ(c.warnings.size(), 1u) << all_warnings(c);
  EXPECT_CONTAINS(c.warnings[0], "'zero_optimization': true is DeepSpeed's deprecated spelling of stage 1");
  c = parse(with(R"("zero_optimization": false)"));
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_CONTAINS(all_warnings(c), "{\"stage\": 0}");
  EXPECT_CONTAINS(error_of(with(R"("zero_optimization": 2)")),
                  "zero_optimization: expected an object such as {\"stage\": 2}, got 2");
}

// "true" and "false" in quotes, as DeepSpeed's pydantic sections read them.
TEST(Config, BooleansAsStringsAreReadWithAWarning) {
  Config c = parse(with(R"("bf16": {"enabled": "true"}, "zero_optimization": {"stage": 2, "overlap_comm": "False"})"));
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_FALSE(c.zero_optimization.overlap_comm);
  ASSERT_EQ(c.warnings.size(), 2u) << all_warnings(c);
  EXPECT_CONTAINS(c.warnings[0], "'bf16.enabled' is the string \"true\", read as true (write true without quotes)");
  EXPECT_CONTAINS(c.warnings[1], "'zero_optimization.overlap_comm' is the string \"False\", read as false");
  EXPECT_CONTAINS(error_of(with(R"("bf16": {"enabled": "yes"})")), "bf16.enabled: expected true or false, got \"yes\"");
}

// Names that edit distance does not lead to: the key they mean.
TEST(Config, OlderNamesPointToTheKey) {
  Config c = parse(with(R"("zero_optimization": {"stage": 2, "comm_overlap": true},
                           "optimizer": {"type": "Adam", "params": {"lr": 0.001, "max_grad_norm": 1.0}})"));
  EXPECT_CONTAINS(all_warnings(c), "unknown key 'zero_optimization.comm_overlap' is ignored; did you mean 'overlap_comm'?");
  EXPECT_CONTAINS(all_warnings(c), "unknown key 'optimizer.params.max_grad_norm' is ignored; gradient clipping is the "
                                   "top-level 'gradient_clipping'");
}

TEST(Config, DeprecatedCpuOffloadIsReadAsOffloadOptimizer) {
  Config c = parse(with(R"("zero_optimization": {"stage": 2, "cpu_offload": true,
                                                 "cpu_offload_use_pin_memory": true})"));
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, "cpu");
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.pin_memory);
  EXPECT_CONTAINS(all_warnings(c), "'zero_optimization.cpu_offload' is deprecated in DeepSpeed; it is read as "
                                   "offload_optimizer.device \"cpu\"");
  // false: no offload, and said so (not "read as cpu").
  c = parse(with(R"("zero_optimization": {"stage": 2, "cpu_offload": false})"));
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, "none");
  EXPECT_CONTAINS(all_warnings(c), "false is read as offload_optimizer.device \"none\"");
  c = parse(with(R"("zero_optimization": {"stage": 2, "cpu_offload": true,
                                          "offload_optimizer": {"device": "none"}})"));
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, "none");
  EXPECT_CONTAINS(all_warnings(c), "'zero_optimization.cpu_offload' is ignored");
}

// --- Optimizer and scheduler -------------------------------------------------

TEST(Config, OptimizerTypesAreCaseInsensitive) {
  auto type_of = [](const char* t) {
    return parse(with(std::string(R"("optimizer": {"type": ")") + t + "\"}")).optimizer.type;
  };
  EXPECT_EQ(type_of("adamw"), "AdamW");
  EXPECT_EQ(type_of("ADAM"), "Adam");
  EXPECT_EQ(type_of("Adagrad"), "Adagrad");
  EXPECT_EQ(type_of("adagrad"), "Adagrad");
  EXPECT_EQ(type_of("lion"), "Lion");
  EXPECT_EQ(type_of("MUON"), "Muon");
}

TEST(Config, UnsupportedOptimizerListsTheSupported) {
  EXPECT_CONTAINS(error_of(with(R"("optimizer": {"type": "Lamb"})")),
                  "optimizer.type: expected one of \"Adam\", \"AdamW\", \"Adagrad\", \"Lion\", \"Muon\", got \"Lamb\"");
  EXPECT_CONTAINS(error_of(with(R"("optimizer": {"params": {"lr": 0.1}})")),
                  "optimizer.type: required when 'optimizer' is given");
}

TEST(Config, AdamWeightDecayMode) {
  // DeepSpeed: "Adam" decouples weight decay unless adam_w_mode is false.
  Config c = parse(with(R"("optimizer": {"type": "Adam"})"));
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_TRUE(c.optimizer.decoupled_weight_decay());
  c = parse(with(R"("optimizer": {"type": "Adam", "params": {"adam_w_mode": false}})"));
  EXPECT_FALSE(c.optimizer.adam_w_mode);
  EXPECT_FALSE(c.optimizer.decoupled_weight_decay());
  // "AdamW" forces it.
  c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}})"));
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_CONTAINS(all_warnings(c), "'optimizer.params.adam_w_mode' is ignored");
}

TEST(Config, AdagradDefaultsAndParams) {
  Config c = parse(with(R"("optimizer": {"type": "Adagrad"})"));
  EXPECT_EQ(c.optimizer.lr, 1e-2f);
  EXPECT_EQ(c.optimizer.eps, 1e-10f);
  EXPECT_FALSE(c.optimizer.adam_w_mode);
  EXPECT_FALSE(c.optimizer.decoupled_weight_decay());
  c = parse(with(R"("optimizer": {"type": "Adagrad", "params": {"lr": 0.05,
      "initial_accumulator_value": 0.1, "betas": [0.9, 0.99]}})"));
  EXPECT_EQ(c.optimizer.lr, 0.05f);
  EXPECT_EQ(c.optimizer.initial_accumulator_value, 0.1f);
  EXPECT_EQ(c.optimizer.beta2, 0.999f);  // not Adagrad's
  EXPECT_CONTAINS(all_warnings(c), "'optimizer.params.betas' is ignored: Adagrad has no betas.");
  c = parse(with(R"("optimizer": {"type": "Adam", "params": {"initial_accumulator_value": 0.1}})"));
  EXPECT_EQ(c.optimizer.initial_accumulator_value, 0.0f);
  EXPECT_CONTAINS(all_warnings(c), "it applies to Adagrad only");
}

// DeepSpeed's Lion (DeepSpeedCPULion, FusedLion): Adam's lr and betas by
// default, decay always decoupled, one moment; Adam's other keys are noted
// as ignored (DeepSpeed would pass eps to Lion's constructor and fail).
TEST(Config, LionDefaultsAndParams) {
  Config c = parse(with(R"("optimizer": {"type": "Lion"})"));
  EXPECT_EQ(c.optimizer.lr, 1e-3f);
  EXPECT_EQ(c.optimizer.beta1, 0.9f);
  EXPECT_EQ(c.optimizer.beta2, 0.999f);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0f);
  EXPECT_TRUE(c.optimizer.decoupled_weight_decay());
  EXPECT_EQ(c.optimizer.moments(), 1);
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  c = parse(with(R"("optimizer": {"type": "Lion", "params": {"lr": 1e-4, "betas": [0.95, 0.98],
      "weight_decay": 0.1, "eps": 1e-8, "adam_w_mode": false, "bias_correction": false,
      "initial_accumulator_value": 0.1}})"));
  EXPECT_EQ(c.optimizer.lr, 1e-4f);
  EXPECT_EQ(c.optimizer.beta1, 0.95f);
  EXPECT_EQ(c.optimizer.beta2, 0.98f);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1f);
  EXPECT_TRUE(c.optimizer.decoupled_weight_decay());
  const std::string w = all_warnings(c);
  EXPECT_CONTAINS(w, "'optimizer.params.eps' is ignored: Lion has no eps");
  EXPECT_CONTAINS(w, "'optimizer.params.adam_w_mode' is ignored: it applies to Adam only; Lion always decouples");
  EXPECT_CONTAINS(w, "'optimizer.params.bias_correction' is ignored");
  EXPECT_CONTAINS(w, "'optimizer.params.initial_accumulator_value' is ignored");
  EXPECT_CONTAINS(error_of(with(R"("optimizer": {"type": "Lion", "params": {"betas": [0.9, 1.5]}})")),
                  "optimizer.params.betas[1]");
  EXPECT_EQ(parse(with(R"("optimizer": {"type": "AdamW"})")).optimizer.moments(), 2);
  EXPECT_EQ(parse(with(R"("optimizer": {"type": "Adagrad"})")).optimizer.moments(), 1);
}

// DeepSpeed's Muon (MuonWithAuxAdam, built by its engine from the config):
// MuonWithAuxAdam's defaults where nothing is given (Muon at 0.02 with
// momentum 0.95, Adam at 3e-4 with betas [0.9, 0.95] and eps 1e-10), one
// shared lr for both halves unless muon_lr / adam_lr give their own.
TEST(Config, MuonDefaultsAndHalves) {
  Config c = parse(with(R"("optimizer": {"type": "muon"})"));
  const auto& o = c.optimizer;
  EXPECT_EQ(o.type, "Muon");
  EXPECT_EQ(o.lr, 0.02f);
  EXPECT_FALSE(o.muon_lr.has_value());  // lr
  EXPECT_EQ(o.adam_lr, 3e-4f);
  EXPECT_EQ(o.momentum, 0.95f);
  EXPECT_EQ(o.ns_method, "gram");
  EXPECT_EQ(o.beta1, 0.9f);
  EXPECT_EQ(o.beta2, 0.95f);
  EXPECT_EQ(o.eps, 1e-10f);
  EXPECT_EQ(o.weight_decay, 0.0f);
  EXPECT_TRUE(o.adam_w_mode);
  EXPECT_EQ(o.moments(), 2);
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);

  // One lr for both halves.
  c = parse(with(R"("optimizer": {"type": "Muon", "params": {"lr": 0.01, "momentum": 0.9, "ns_method": "standard",
      "betas": [0.8, 0.99], "eps": 1e-8, "weight_decay": 0.1, "adam_w_mode": false}})"));
  EXPECT_EQ(c.optimizer.lr, 0.01f);
  EXPECT_FALSE(c.optimizer.muon_lr || c.optimizer.adam_lr);  // both lr
  EXPECT_EQ(c.optimizer.momentum, 0.9f);
  EXPECT_EQ(c.optimizer.ns_method, "standard");
  EXPECT_EQ(c.optimizer.beta1, 0.8f);
  EXPECT_EQ(c.optimizer.eps, 1e-8f);
  EXPECT_FALSE(c.optimizer.decoupled_weight_decay());  // the Adam half's L2
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  // muon_lr / adam_lr: each half's own rate.
  c = parse(with(R"("optimizer": {"type": "Muon", "params": {"lr": 0.01, "muon_lr": 0.02, "adam_lr": 0.002}})"));
  EXPECT_EQ(c.optimizer.muon_lr, 0.02f);
  EXPECT_EQ(c.optimizer.adam_lr, 0.002f);
  // Without lr, lr is muon_lr.
  c = parse(with(R"("optimizer": {"type": "Muon", "params": {"muon_lr": 0.05}})"));
  EXPECT_EQ(c.optimizer.lr, 0.05f);
  EXPECT_EQ(c.optimizer.adam_lr, 3e-4f);

  EXPECT_CONTAINS(error_of(with(R"("optimizer": {"type": "Muon", "params": {"lr": 0, "adam_lr": 0.01}})")),
                  "optimizer.params.lr: is 0 while muon_lr or adam_lr is not");
  EXPECT_CONTAINS(error_of(with(R"("optimizer": {"type": "Muon", "params": {"ns_method": "polar"}})")),
                  "optimizer.params.ns_method: expected one of \"gram\", \"standard\"");
  EXPECT_CONTAINS(error_of(with(R"("optimizer": {"type": "Muon", "params": {"momentum": 1.0}})")),
                  "optimizer.params.momentum");
  EXPECT_CONTAINS(error_of(with(R"("optimizer": {"type": "Muon", "params": {"per_head_muon": true}})")),
                  "per-head orthogonalization of attention projections is not available");
  EXPECT_TRUE(parse(with(R"("optimizer": {"type": "Muon", "params": {"per_head_muon": false}})")).warnings.empty());
  // Muon's keys with another optimizer.
  c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"momentum": 0.9, "muon_lr": 0.02}})"));
  EXPECT_CONTAINS(all_warnings(c), "'optimizer.params.momentum' is ignored: it applies to Muon only");
  EXPECT_CONTAINS(all_warnings(c), "'optimizer.params.muon_lr' is ignored: it applies to Muon only");
  // OneCycle has no betas to cycle in MuonWithAuxAdam (DeepSpeed turns it off).
  c = parse(with(R"("optimizer": {"type": "Muon"}, "scheduler": {"type": "OneCycle",
      "params": {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2}})"));
  EXPECT_FALSE(c.scheduler.one_cycle.cycle_momentum);
  EXPECT_CONTAINS(all_warnings(c), "Muon's momentum and its Adam half's betas stay as configured");
}

TEST(Config, WarmupLRDefaults) {
  Config c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                           "scheduler": {"type": "warmuplr"})"));
  EXPECT_EQ(c.scheduler.type, "WarmupLR");
  EXPECT_EQ(c.scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.0f);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 0.01f);
  EXPECT_EQ(c.scheduler.warmup_type, "log");
  EXPECT_EQ(c.scheduler.cos_min_ratio, 0.0f);
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
}

TEST(Config, DecayingSchedulersNeedTotalSteps) {
  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "WarmupDecayLR", "params": {}})")),
                  "scheduler.params.total_num_steps: required by WarmupDecayLR");
  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "WarmupCosineLR"})")),
                  "scheduler.params.total_num_steps: required by WarmupCosineLR");
  Config c = parse(with(R"("scheduler": {"type": "WarmupDecayLR",
                                         "params": {"total_num_steps": 10, "warmup_num_steps": 20}})"));
  EXPECT_CONTAINS(all_warnings(c), "the learning rate never decays");
}

TEST(Config, WarmupCosineLRTakesRatios) {
  Config c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"lr": 0.5}},
                           "scheduler": {"type": "WarmupCosineLR",
                                         "params": {"total_num_steps": 100, "warmup_min_ratio": 0.25,
                                                    "warmup_num_steps": 10}})"));
  EXPECT_EQ(c.scheduler.warmup_max_lr, 0.5f);
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.125f);
  EXPECT_EQ(c.scheduler.cos_min_ratio, 1e-4f);
  EXPECT_EQ(c.scheduler.total_num_steps, 100);
  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "WarmupCosineLR", "params": {
      "total_num_steps": 100, "warmup_min_ratio": 0.1, "warmup_min_lr": 0.1}})")),
                  "give either warmup_min_lr or warmup_min_ratio, not both");
  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "WarmupCosineLR", "params": {
      "total_num_steps": 100, "cos_min_ratio": 2}})")),
                  "scheduler.params.cos_min_ratio: expected a number in [0, 1], got 2");
}

TEST(Config, UnsupportedSchedulerListsTheSupported) {
  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "OneCycleLR"})")),
                  "scheduler.type: expected one of \"WarmupLR\", \"WarmupDecayLR\", "
                  "\"WarmupCosineLR\", \"OneCycle\", \"LRRangeTest\", got \"OneCycleLR\"");
  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cubic"}})")),
                  "scheduler.params.warmup_type: expected one of \"log\", \"linear\", got \"cubic\"");
}

// DeepSpeed's OneCycle: its defaults, its two required rates, the stair
// count and second half that default to the first's, Adagrad (no betas to
// cycle), the betas it replaces, and keys of another scheduler named.
TEST(Config, OneCycleReadsDeepSpeedsParams) {
  Config c = parse(with(R"("scheduler": {"type": "onecycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3,
                                                                      "cycle_first_stair_count": 4}})"));
  const zero::config::OneCycleConfig& o = c.scheduler.one_cycle;
  EXPECT_EQ(c.scheduler.type, "OneCycle");
  EXPECT_EQ(o.cycle_min_lr, 1e-4f);
  EXPECT_EQ(o.cycle_max_lr, 1e-3f);
  EXPECT_EQ(o.cycle_first_step_size, 2000);
  EXPECT_EQ(o.cycle_second_step_size, 2000);
  EXPECT_EQ(o.cycle_first_stair_count, 4);
  EXPECT_EQ(o.cycle_second_stair_count, 4);
  EXPECT_EQ(o.decay_step_size, 0);
  EXPECT_TRUE(o.cycle_momentum);
  EXPECT_EQ(o.cycle_min_mom, 0.8f);
  EXPECT_EQ(o.cycle_max_mom, 0.9f);
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);  // no betas written: nothing of the user's replaced
  // DeepSpeed's command-line defaults write a stair count of -1: no stairs.
  c = parse(with(R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
                                                               "cycle_first_stair_count": -1}})"));
  EXPECT_EQ(c.scheduler.one_cycle.cycle_second_stair_count, -1);

  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 1e-3}})")),
                  "scheduler.params.cycle_min_lr: required by OneCycle");
  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-3}})")),
                  "scheduler.params.cycle_max_lr: required by OneCycle");
  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
                                                                           "cycle_first_step_size": 0}})")),
                  "scheduler.params.cycle_first_step_size: expected a positive integer, got 0");
  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
                                                                           "cycle_max_mom": 1}})")),
                  "scheduler.params.cycle_max_mom: expected a number in [0, 1), got 1");

  c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"betas": [0.5, 0.99]}},
                    "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1}})"));
  EXPECT_CONTAINS(all_warnings(c), "OneCycle's momentum cycle steps AdamW with betas [momentum, 0.99], as "
                                   "DeepSpeed's does: 'optimizer.params.betas' [0.5, 0.99] is not used");
  c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"betas": "auto"}},
                    "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1}})"));
  EXPECT_EQ(all_warnings(c).find("momentum cycle"), std::string::npos) << all_warnings(c);
  // A momentum decay that takes beta1 to 1 is named with its step (the
  // engine stops there): 0.95 * (1 + 0.03 j) >= 1 from j = 2, the step after
  // 4 + 2 taken, 7 (engine_behaviour_test's OneCycleBetas... case).
  c = parse(with(R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
      "cycle_first_step_size": 2, "cycle_min_mom": 0.9, "cycle_max_mom": 0.95, "decay_step_size": 1,
      "decay_mom_rate": 0.03}})"));
  EXPECT_CONTAINS(all_warnings(c), "'scheduler.params.decay_mom_rate' (0.03) takes beta1 from 0.95 to 1 at optimizer "
                                   "step 7: a run that long stops there");
  c = parse(with(R"("optimizer": {"type": "Adagrad"},
                    "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1}})"));
  EXPECT_FALSE(c.scheduler.one_cycle.cycle_momentum);
  EXPECT_CONTAINS(all_warnings(c), "'scheduler.params.cycle_momentum' is off: Adagrad has no momentum");
  c = parse(with(R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
                    "cycle_momentum": false, "warmup_num_steps": 10, "lr_range_test_step_size": 5}})"));
  EXPECT_CONTAINS(all_warnings(c), "'scheduler.params.warmup_num_steps' is ignored: it applies to the warm-up "
                                   "schedulers (WarmupLR, WarmupDecayLR, WarmupCosineLR), not OneCycle");
  EXPECT_CONTAINS(all_warnings(c), "'scheduler.params.lr_range_test_step_size' is ignored: it applies to "
                                   "LRRangeTest, not OneCycle");
  c = parse(with(R"("scheduler": {"type": "WarmupLR", "params": {"cycle_min_lr": 0.1}})"));
  EXPECT_CONTAINS(all_warnings(c), "'scheduler.params.cycle_min_lr' is ignored: it applies to OneCycle, not WarmupLR");
}

TEST(Config, LRRangeTestReadsDeepSpeedsParams) {
  Config c = parse(with(R"("scheduler": {"type": "LRRangeTest"})"));
  EXPECT_EQ(c.scheduler.type, "LRRangeTest");
  EXPECT_EQ(c.scheduler.range_test, zero::config::LrRangeTestConfig{});  // DeepSpeed's defaults
  EXPECT_EQ(c.scheduler.range_test.min_lr, 1e-3f);
  EXPECT_EQ(c.scheduler.range_test.step_size, 2000);
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  c = parse(with(R"("scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-5,
      "lr_range_test_step_size": 7, "lr_range_test_step_rate": 3, "lr_range_test_staircase": true}})"));
  EXPECT_EQ(c.scheduler.range_test.min_lr, 1e-5f);
  EXPECT_EQ(c.scheduler.range_test.step_size, 7);
  EXPECT_EQ(c.scheduler.range_test.step_rate, 3.0f);
  EXPECT_TRUE(c.scheduler.range_test.staircase);
  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_step_size": 0}})")),
                  "scheduler.params.lr_range_test_step_size: expected a positive integer, got 0");
}

// --- Round trip and files -----------------------------------------------------

// DeepSpeed's Adam flags: bias_correction is honoured, amsgrad true refused
// (DeepSpeed's CPU and fused Adam refuse it too), Adagrad notes the former.
TEST(Config, AdamBiasCorrectionAndAmsgrad) {
  EXPECT_TRUE(parse(with(R"("optimizer": {"type": "Adam", "params": {"lr": 0.1}})")).optimizer.bias_correction);
  Config c = parse(with(R"("optimizer": {"type": "Adam", "params": {"bias_correction": false, "amsgrad": false}})"));
  EXPECT_FALSE(c.optimizer.bias_correction);
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  EXPECT_CONTAINS(error_of(with(R"("optimizer": {"type": "AdamW", "params": {"amsgrad": true}})")),
                  "test.json: optimizer.params.amsgrad: AMSGrad is not available in zerocpp");
  EXPECT_CONTAINS(all_warnings(parse(with(R"("optimizer": {"type": "Adagrad", "params": {"bias_correction": false}})"))),
                  "'optimizer.params.bias_correction'");
}

// publish_in_backward's three states (unset: the engine decides; true;
// false) survive the round trip: a resumed run's config.json keeps them.
TEST(Config, ToJsonKeepsWhetherPublishInBackwardWasSaid) {
  for (const char* said : {"", R"(, "publish_in_backward": true)", R"(, "publish_in_backward": false)"}) {
    Config c = parse(with(std::string(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
                                         "delayed_param_update": true)") + said + "}}"));
    nlohmann::json j = to_json(c);
    EXPECT_EQ(j["zero_optimization"]["offload_optimizer"].contains("publish_in_backward"), *said != '\0') << j.dump();
    Config back = parse_config(j.dump(), 1);
    c.warnings.clear();
    back.warnings.clear();
    EXPECT_EQ(back.zero_optimization.offload_optimizer.publish_in_backward,
              c.zero_optimization.offload_optimizer.publish_in_backward) << said;
    EXPECT_EQ(back, c) << said;
  }
}

TEST(Config, ToJsonRoundTrips) {
  Config c = parse(R"({
    "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5,
    "gradient_clipping": 0.7, "bf16": {"enabled": true},
    "optimizer": {"type": "adam", "params": {"lr": 0.00123, "betas": [0.85, 0.97], "bias_correction": false,
                                             "adam_w_mode": false, "weight_decay": 0.03}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1000,
                                                       "warmup_min_ratio": 0.1}},
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": true},
                          "offload_optimizer": {"device": "cpu", "nvme_path": "/nvme", "ratio": 0.5},
                          "stage3_param_persistence_threshold": 0},
    "device_memory_limit": "3 GiB", "seed": 3
  })", 2);
  nlohmann::json j = to_json(c);
  EXPECT_EQ(j["optimizer"]["params"]["lr"].get<double>(), 0.00123);  // shortest form, not 0.0012300000...
  EXPECT_EQ(j["train_batch_size"], 30);
  Config back = parse_config(j.dump(), 2);
  EXPECT_TRUE(back.warnings.empty()) << all_warnings(back);
  c.warnings.clear();
  EXPECT_EQ(back, c) << j.dump(2);
  // Adagrad and the other schedulers too.
  c = parse(with(R"("optimizer": {"type": "Adagrad", "params": {"initial_accumulator_value": 0.5}},
                    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 9, "warmup_num_steps": 5}})"));
  back = parse_config(to_json(c).dump(), 1);
  EXPECT_TRUE(back.warnings.empty()) << all_warnings(back);
  c.warnings.clear();
  EXPECT_EQ(back, c);
  // Lion (no eps written, its betas are).
  c = parse(with(R"("optimizer": {"type": "Lion", "params": {"lr": 3e-4, "betas": [0.95, 0.98], "weight_decay": 0.1}})"));
  back = parse_config(to_json(c).dump(), 1);
  EXPECT_TRUE(back.warnings.empty()) << all_warnings(back);
  c.warnings.clear();
  EXPECT_EQ(back, c);
  EXPECT_FALSE(to_json(c)["optimizer"]["params"].contains("eps"));
  // Muon, with and without a half of its own.
  for (const char* params : {R"({"lr": 0.01, "adam_lr": 0.002, "momentum": 0.9, "ns_method": "standard"})", "{}"}) {
    c = parse(with(std::string(R"("optimizer": {"type": "Muon", "params": )") + params + "}"));
    back = parse_config(to_json(c).dump(), 1);
    EXPECT_TRUE(back.warnings.empty()) << all_warnings(back);
    c.warnings.clear();
    EXPECT_EQ(back, c) << to_json(c).dump(2);
  }
  // OneCycle (every param given) and LRRangeTest.
  c = parse(with(R"("optimizer": {"type": "Lion", "params": {"betas": [0.9, 0.99]}},
                    "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-5, "cycle_max_lr": 3e-4,
                      "decay_lr_rate": 0.25, "cycle_first_step_size": 11, "cycle_second_step_size": 13,
                      "cycle_first_stair_count": 2, "cycle_second_stair_count": 3, "decay_step_size": 5,
                      "cycle_momentum": true, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95, "decay_mom_rate": 0.001}})"));
  back = parse_config(to_json(c).dump(), 1);
  // The betas the cycle replaces (written out), and the step at which the
  // momentum decay reaches 1: 0.95 (1 + 0.001 j / 5) >= 1 from j = 264, step 11 + 13 + 264 + 1.
  ASSERT_EQ(back.warnings.size(), 2u) << all_warnings(back);
  EXPECT_CONTAINS(back.warnings[0], "momentum cycle");
  EXPECT_CONTAINS(back.warnings[1], "at optimizer step 289");
  back.warnings.clear();
  c.warnings.clear();
  EXPECT_EQ(back, c) << to_json(c).dump(2);
  c = parse(with(R"("scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 2e-5,
                    "lr_range_test_step_size": 9, "lr_range_test_step_rate": 0.5, "lr_range_test_staircase": true}})"));
  back = parse_config(to_json(c).dump(), 1);
  EXPECT_TRUE(back.warnings.empty()) << all_warnings(back);
  c.warnings.clear();
  EXPECT_EQ(back, c) << to_json(c).dump(2);
  // The NVMe tier's settings.
  c = parse(with(R"("zero_optimization": {"stage": 2, "sub_group_size": 777,
                       "offload_optimizer": {"device": "nvme", "nvme_path": "/n", "buffer_count": 5}},
                    "aio": {"block_size": 8192, "thread_count": 3})"));
  back = parse_config(to_json(c).dump(), 1);
  EXPECT_TRUE(back.warnings.empty()) << all_warnings(back);
  c.warnings.clear();
  EXPECT_EQ(back, c);
}

TEST(Config, LoadConfigNamesThePath) {
  const std::string missing = ::testing::TempDir() + "/no_such_dir/ds_config.json";
  try {
    load_config(missing, 1);
    FAIL() << "no error for a missing file";
  } catch (const zero::Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "cannot read config file '" + missing + "'");
    EXPECT_CONTAINS(std::string(e.what()), "No such file or directory");
  }
  try {
    load_config(::testing::TempDir(), 1);
    FAIL() << "no error for a directory";
  } catch (const zero::Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "it is a directory");
  }
}

TEST(Config, LoadConfigUsesThePathAsSource) {
  const std::string path = ::testing::TempDir() + "/zero_config_test_load.json";
  {
    std::ofstream out(path);
    out << "{\"train_batch_size\": 16,\n \"trian_batch_size\": 1}\n";
  }
  Config c = load_config(path, 4);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_EQ(c.warnings[0].rfind(path + ": ", 0), 0u) << c.warnings[0];
  {
    std::ofstream out(path);
    out << "{\"train_batch_size\": 16,\n \"x\" 1}\n";
  }
  try {
    load_config(path, 4);
    FAIL();
  } catch (const zero::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ":2:6: malformed JSON", 0), 0u) << e.what();
  }
  std::remove(path.c_str());
}

}  // namespace

// What DeepSpeed's own files mean, read as DeepSpeed reads them
// (deepspeed/runtime/lr_schedules.py, engine.py, fp16/loss_scaler.py).
TEST(Config, WarmupDecayLRPeaksAtDeepSpeedsDefaultWithoutWarmupMaxLr) {
  Config c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
                           "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 1000}})"));
  EXPECT_EQ(c.scheduler.warmup_max_lr, 0.001f);
  EXPECT_CONTAINS(all_warnings(c), "scheduler WarmupDecayLR has no 'warmup_max_lr', so it peaks at DeepSpeed's "
                                   "default 0.001, not at optimizer.params.lr (0.0003)");
  // The lr 0.001 itself says nothing; "auto" (Hugging Face) and WarmupLR peak at the lr.
  c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
                    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 1000}})"));
  EXPECT_EQ(c.scheduler.warmup_max_lr, 0.001f);
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
                    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10, "warmup_max_lr": "auto"}})"));
  EXPECT_EQ(c.scheduler.warmup_max_lr, 3e-4f);
  EXPECT_FALSE(contains(all_warnings(c), "WarmupDecayLR has no")) << all_warnings(c);
  c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
                    "scheduler": {"type": "WarmupLR", "params": {}})"));
  EXPECT_EQ(c.scheduler.warmup_max_lr, 3e-4f);
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
}

TEST(Config, WarmupTypeIsMatchedCaseSensitivelyAsInDeepSpeed) {
  EXPECT_EQ(parse(with(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear"}})")).scheduler.warmup_type,
            "linear");
  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_type": "Linear"}})")),
                  "scheduler.params.warmup_type: is \"Linear\", which DeepSpeed does not recognise (it matches "
                  "\"log\" and \"linear\" case-sensitively) and replaces by \"log\": write \"log\" or \"linear\"");
  EXPECT_CONTAINS(error_of(with(R"("scheduler": {"type": "WarmupCosineLR",
                                                 "params": {"total_num_steps": 9, "warmup_type": "LOG"}})")),
                  "is \"LOG\", which DeepSpeed does not recognise");
}

TEST(Config, MinLossScaleZeroAndNegativeClippingAreDeepSpeedsOff) {
  Config c = parse(with(R"("fp16": {"enabled": true, "min_loss_scale": 0}, "gradient_clipping": -1)"));
  EXPECT_EQ(c.fp16.min_loss_scale, std::numeric_limits<float>::min());
  EXPECT_EQ(c.gradient_clipping, 0.0f);
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  EXPECT_CONTAINS(error_of(with(R"("fp16": {"enabled": true, "min_loss_scale": -1})")),
                  "fp16.min_loss_scale: expected a number >= 0, got -1");
}

TEST(Config, TorchAdamDecaysAsTorchsAdamW) {
  Config c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": true}})"));
  EXPECT_EQ(c.optimizer.weight_decay, 0.01f);
  EXPECT_CONTAINS(all_warnings(c), "'optimizer.params.torch_adam' is true and 'weight_decay' is not given: "
                                   "weight_decay is 0.01, torch.optim.AdamW's default");
  // Adam is AdamW by default (adam_w_mode); given weight decay, or torch.optim.Adam, keep theirs.
  EXPECT_EQ(parse(with(R"("optimizer": {"type": "Adam", "params": {"torch_adam": true}})")).optimizer.weight_decay,
            0.01f);
  c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"torch_adam": true, "weight_decay": 0}})"));
  EXPECT_EQ(c.optimizer.weight_decay, 0.0f);
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  c = parse(with(R"("optimizer": {"type": "Adam", "params": {"torch_adam": true, "adam_w_mode": false}})"));
  EXPECT_EQ(c.optimizer.weight_decay, 0.0f);
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
  EXPECT_EQ(parse(with(R"("optimizer": {"type": "AdamW", "params": {"torch_adam": false}})")).optimizer.weight_decay,
            0.0f);
  c = parse(with(R"("optimizer": {"type": "Lion", "params": {"torch_adam": true}})"));
  EXPECT_CONTAINS(all_warnings(c), "'optimizer.params.torch_adam' is ignored: it applies to Adam and AdamW");
}

TEST(Config, Fp32AllreduceAndGradHooksAreNamedWithTheirReason) {
  Config c = parse(with(R"("fp32_allreduce": true, "zero_optimization": {"stage": 1, "grad_hooks": false})"));
  EXPECT_CONTAINS(all_warnings(c), "fp32_allreduce");
  EXPECT_CONTAINS(all_warnings(c), "zerocpp reduces gradients in the training precision");
  EXPECT_CONTAINS(all_warnings(c), "zerocpp always reduces from gradient hooks");
  EXPECT_FALSE(contains(all_warnings(c), "unknown key")) << all_warnings(c);
  c = parse(with(R"("fp32_allreduce": false, "zero_optimization": {"stage": 1, "grad_hooks": true})"));
  EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
}

TEST(Config, HjsonCommentsAndTrailingCommasSayWhatToRemove) {
  EXPECT_CONTAINS(error_of("{\n  // ZeRO-2\n  \"train_batch_size\": 8\n}"),
                  "this is a comment: remove it (DeepSpeed reads its config as hjson");
  EXPECT_CONTAINS(error_of("{\"train_batch_size\": 8, # hash\n}"), "this is a comment: remove it");
  EXPECT_CONTAINS(error_of("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2,}}"),
                  "a trailing comma precedes it: remove the comma");
  EXPECT_CONTAINS(error_of("{\"train_batch_size\": 8,\n}"), "a trailing comma precedes it");
  // Other syntax errors get no such hint.
  EXPECT_FALSE(contains(error_of("{\"train_batch_size\": 8 \"x\": 1}"), "hjson"));
}
