#include "common/trainer_autos.h"

#include <nlohmann/json.hpp>

namespace zero::train {
namespace {

using Json = nlohmann::ordered_json;

bool is_auto(const Json& object, const char* key) {
  if (!object.is_object()) return false;
  const auto it = object.find(key);
  return it != object.end() && it->is_string() && it->get<std::string>() == "auto";
}

}  // namespace

FilledAutos fill_trainer_autos(const std::string& text, const TrainerSettings& s) {
  FilledAutos out{text, {}};
  // (Parsed as parse_config would, comments refused. A key given twice
  // loses parse_config's warning where there is something to fill: the
  // rewritten text has it once, the last value, as parse_config reads it.)
  Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object()) return out;
  auto fill = [&](Json& object, const char* key, std::int64_t value, const std::string& path, const char* from) {
    if (!is_auto(object, key)) return;
    object[key] = value;
    out.filled.push_back(path + " = " + std::to_string(value) + " (" + from + ")");
  };
  // The batch: the Trainer's per-device batch and accumulation; the global
  // size is then derived (filling it too could contradict a given one).
  const bool global_given = root.contains("train_batch_size") && root["train_batch_size"].is_number();
  if (!global_given) {
    fill(root, "train_micro_batch_size_per_gpu", s.micro_batch, "train_micro_batch_size_per_gpu",
         s.micro_from.c_str());
    fill(root, "gradient_accumulation_steps", 1, "gradient_accumulation_steps", s.accumulation_from.c_str());
  }
  if (root.contains("scheduler") && root["scheduler"].is_object()) {
    Json& sched = root["scheduler"];
    if (sched.contains("params") && sched["params"].is_object()) {
      Json& p = sched["params"];
      fill(p, "total_num_steps", s.steps, "scheduler.params.total_num_steps", "--steps");
      out.filled_warmup = is_auto(p, "warmup_num_steps");
      fill(p, "warmup_num_steps", s.warmup, "scheduler.params.warmup_num_steps",
           s.warmup_given ? "--warmup" : "--warmup's default, max(1, steps/10)");
    }
  }
  // The precision: the Trainer's --bf16/--fp16 are zero-train's default,
  // bf16 (a literal fp16 true keeps bf16 off: the two exclude each other).
  auto fill_enabled = [&](const char* section, bool value, const char* from) {
    if (!root.contains(section) || !is_auto(root[section], "enabled")) return false;
    root[section]["enabled"] = value;
    out.filled.push_back(std::string(section) + ".enabled = " + (value ? "true" : "false") + " (" + from + ")");
    return true;
  };
  const bool fp16_true = root.contains("fp16") && root["fp16"].is_object() && root["fp16"].contains("enabled") &&
                         root["fp16"]["enabled"].is_boolean() && root["fp16"]["enabled"].get<bool>();
  out.filled_bf16 = fill_enabled("bf16", !fp16_true,
                                 fp16_true ? "the config's fp16 is on" : "zero-train's default precision");
  fill_enabled("fp16", false, "zero-train trains fp16 only where a config says true");
  if (!out.filled.empty()) out.text = root.dump(2);
  return out;
}

}  // namespace zero::train
