// to_json: the resolved Config in DeepSpeed's layout. Written so that
// parse_config(to_json(c).dump()) gives c back, which the tests and the fuzzer
// check.
#include <charconv>

#include "zero/config/config.h"

namespace zero::config {
namespace {

using nlohmann::json;

// A float as the double with its shortest decimal form, so that reports show
// 0.001 rather than 0.0010000000474974513; the check keeps the round trip
// exact should double rounding ever pick a different float.
double shown(float f) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f);
  double d = 0;
  std::from_chars(buf, end, d);
  return static_cast<float>(d) == f ? d : static_cast<double>(f);
}

json optimizer_json(const OptimizerConfig& o) {
  json params = {{"lr", shown(o.lr)}, {"weight_decay", shown(o.weight_decay)}};
  if (!o.is_lion()) params["eps"] = shown(o.eps);
  if (o.is_adagrad()) {
    params["initial_accumulator_value"] = shown(o.initial_accumulator_value);
  } else if (o.is_lion()) {
    params["betas"] = {shown(o.beta1), shown(o.beta2)};
  } else {
    params["betas"] = {shown(o.beta1), shown(o.beta2)};
    params["adam_w_mode"] = o.adam_w_mode;
    params["bias_correction"] = o.bias_correction;
  }
  if (o.is_muon()) {
    params["momentum"] = shown(o.momentum);
    params["ns_method"] = o.ns_method;
    if (o.muon_lr) params["muon_lr"] = shown(*o.muon_lr);
    if (o.adam_lr) params["adam_lr"] = shown(*o.adam_lr);
  }
  return {{"type", o.type}, {"params", params}};
}

json scheduler_json(const SchedulerConfig& s) {
  if (s.type == "OneCycle") {
    const OneCycleConfig& c = s.one_cycle;
    return {{"type", s.type},
            {"params",
             {{"cycle_min_lr", shown(c.cycle_min_lr)},
              {"cycle_max_lr", shown(c.cycle_max_lr)},
              {"decay_lr_rate", shown(c.decay_lr_rate)},
              {"cycle_first_step_size", c.cycle_first_step_size},
              {"cycle_second_step_size", c.cycle_second_step_size},
              {"cycle_first_stair_count", c.cycle_first_stair_count},
              {"cycle_second_stair_count", c.cycle_second_stair_count},
              {"decay_step_size", c.decay_step_size},
              {"cycle_momentum", c.cycle_momentum},
              {"cycle_min_mom", shown(c.cycle_min_mom)},
              {"cycle_max_mom", shown(c.cycle_max_mom)},
              {"decay_mom_rate", shown(c.decay_mom_rate)}}}};
  }
  if (s.type == "LRRangeTest") {
    const LrRangeTestConfig& c = s.range_test;
    return {{"type", s.type},
            {"params",
             {{"lr_range_test_min_lr", shown(c.min_lr)},
              {"lr_range_test_step_size", c.step_size},
              {"lr_range_test_step_rate", shown(c.step_rate)},
              {"lr_range_test_staircase", c.staircase}}}};
  }
  json params = {{"warmup_num_steps", s.warmup_num_steps},
                 {"warmup_min_lr", shown(s.warmup_min_lr)},
                 {"warmup_max_lr", shown(s.warmup_max_lr)},
                 {"warmup_type", s.warmup_type}};
  if (s.type != "WarmupLR") params["total_num_steps"] = s.total_num_steps;
  if (s.type == "WarmupCosineLR") params["cos_min_ratio"] = shown(s.cos_min_ratio);
  return {{"type", s.type}, {"params", params}};
}

json zero_json(const ZeroOptimizationConfig& z) {
  const auto& oo = z.offload_optimizer;
  const auto& op = z.offload_param;
  json zero = {
      {"stage", z.stage},
      {"offload_optimizer",
       {{"device", oo.device},
        {"pin_memory", oo.pin_memory},
        {"nvme_path", oo.nvme_path},
        {"delayed_param_update", oo.delayed_param_update},
        {"delayed_param_update_warmup_steps", oo.delayed_param_update_warmup_steps},
        {"cpu_threads", oo.cpu_threads},
        {"ratio", oo.ratio},
        {"buffer_count", oo.buffer_count}}},
      {"offload_param",
       {{"device", op.device},
        {"pin_memory", op.pin_memory},
        {"nvme_path", op.nvme_path},
        {"buffer_count", op.buffer_count}}},
      {"overlap_comm", z.overlap_comm},
      {"contiguous_gradients", z.contiguous_gradients},
      {"reduce_bucket_size", z.reduce_bucket_size},
      {"allgather_bucket_size", z.allgather_bucket_size},
      {"reduce_scatter", z.reduce_scatter},
      {"stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size},
      {"stage3_param_persistence_threshold", z.stage3_param_persistence_threshold},
      {"stage3_max_live_parameters", z.stage3_max_live_parameters},
      {"sub_group_size", z.sub_group_size},
  };
  // Written only when the config said it (unset and false are both off),
  // so that the round trip keeps whether it was said.
  if (oo.publish_in_backward) zero["offload_optimizer"]["publish_in_backward"] = *oo.publish_in_backward;
  return zero;
}

}  // namespace

json to_json(const Config& c) {
  json out = {
      {"train_batch_size", c.train_batch_size},
      {"train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu},
      {"gradient_accumulation_steps", c.gradient_accumulation_steps},
      {"gradient_clipping", shown(c.gradient_clipping)},
      {"fp16",
       {{"enabled", c.fp16.enabled},
        {"loss_scale", shown(c.fp16.loss_scale)},
        {"initial_scale_power", c.fp16.initial_scale_power},
        {"loss_scale_window", c.fp16.loss_scale_window},
        {"hysteresis", c.fp16.hysteresis},
        {"consecutive_hysteresis", c.fp16.consecutive_hysteresis},
        {"min_loss_scale", shown(c.fp16.min_loss_scale)}}},
      {"bf16", {{"enabled", c.bf16.enabled}}},
      {"optimizer", optimizer_json(c.optimizer)},
      {"zero_optimization", zero_json(c.zero_optimization)},
      {"activation_checkpointing",
       {{"partition_activations", c.activation_checkpointing.partition_activations},
        {"cpu_checkpointing", c.activation_checkpointing.cpu_checkpointing},
        {"contiguous_memory_optimization",
         c.activation_checkpointing.contiguous_memory_optimization}}},
      {"device_memory_limit", c.device_memory_limit},
      {"steps_per_print", c.steps_per_print},
      {"wall_clock_breakdown", c.wall_clock_breakdown},
      {"comm_timeout", c.comm_timeout},
      {"comm_sequence_check", c.comm_sequence_check},
      {"nonfinite", {{"policy", c.nonfinite.policy}, {"stop_after", c.nonfinite.stop_after}}},
      {"flight_recorder", {{"entries", c.flight_recorder.entries}, {"dir", c.flight_recorder.dir}}},
      {"aio", {{"block_size", c.aio.block_size}, {"thread_count", c.aio.thread_count}}},
  };
  if (c.seed_given) out["seed"] = c.seed;  // (round trip: absent stays absent)
  if (!c.scheduler.type.empty()) out["scheduler"] = scheduler_json(c.scheduler);
  return out;
}

}  // namespace zero::config
