// parse_config: DeepSpeed-style JSON to a validated Config. Each section is
// read by its own function; the rules that span sections come after, then the
// batch sizes, so that a type error is reported before a consequence of it.
#include "zero/config/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "batch_size.h"
#include "section_reader.h"
#include "value_text.h"
#include "zero/config/json_error.h"
#include "zero/core/error.h"

namespace zero::config {
namespace {

using detail::IntRange;
using detail::Json;
using detail::kNonNegative;
using detail::kNonNegativeReal;
using detail::kPositive;
using detail::kPositiveReal;
using detail::kUnitInterval;
using detail::ParseContext;
using detail::RealRange;
using detail::SectionReader;

constexpr RealRange kBetaRange{0.0, false, 1.0, true};
constexpr std::string_view kEnabledExample = "{\"enabled\": true}";
constexpr float kDeepSpeedGradientClipping = 1.0f;
constexpr float kDeepSpeedWarmupDecayMaxLr = 0.001f;  // WarmupDecayLR's warmup_max_lr
constexpr float kTorchAdamWWeightDecay = 0.01f;       // torch.optim.AdamW's default

// A number in a message: whole numbers in full (a loss scale of 2^20), the
// rest as %g does.
std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, v == std::floor(v) && std::fabs(v) < 1e15 ? "%.0f" : "%g", v);
  return buf;
}

void read_fp16(SectionReader& top, Fp16Config& fp16) {
  SectionReader r(top.context(), "fp16", top.read_object("fp16", kEnabledExample));
  if (auto v = r.read_bool("enabled")) fp16.enabled = *v;
  if (auto v = r.read_float("loss_scale", kNonNegativeReal)) fp16.loss_scale = *v;
  // 2^127 is the largest power of two a float holds.
  if (auto v = r.read_int32("initial_scale_power", {0, 127})) fp16.initial_scale_power = *v;
  if (auto v = r.read_int32("loss_scale_window", kPositive)) fp16.loss_scale_window = *v;
  if (auto v = r.read_int32("hysteresis", kPositive)) fp16.hysteresis = *v;
  if (auto v = r.read_bool("consecutive_hysteresis")) fp16.consecutive_hysteresis = *v;
  // 0 is DeepSpeed's "no floor" (max(scale / 2, 0)); the scale then stops
  // at the smallest normal float, where dividing by it stays finite.
  if (auto v = r.read_float("min_loss_scale", kNonNegativeReal)) {
    fp16.min_loss_scale = std::max(*v, std::numeric_limits<float>::min());
  }
  // A floor above the start: DeepSpeed's max(scale / 2, min) raises the
  // scale to the floor at the first overflow that halves it. Taken as
  // DeepSpeed takes it, and said.
  const double initial = std::ldexp(1.0, fp16.initial_scale_power);
  if (fp16.enabled && fp16.loss_scale == 0.0f && fp16.min_loss_scale > initial) {
    r.context().warn("'fp16.min_loss_scale' (" + short_number(fp16.min_loss_scale) +
                     ") is above the dynamic loss scale's start, 2^initial_scale_power = " + short_number(initial) +
                     ": the first overflow that halves the scale raises it to " + short_number(fp16.min_loss_scale) +
                     " instead (DeepSpeed's max(scale / 2, min_loss_scale)), and an overflow there ends the run. "
                     "Give a min_loss_scale of at most " + short_number(initial) + " for a floor below the start");
  }
}

void read_bf16(SectionReader& top, Bf16Config& bf16) {
  const Json* current = top.read_object("bf16", kEnabledExample);
  const Json* old = top.read_object("bfloat16", kEnabledExample);
  if (current && old) {
    top.fail("bfloat16",
             "both 'bf16' and 'bfloat16' (DeepSpeed's older name for it) are given; keep 'bf16'");
  }
  if (old) {
    top.context().warn(
        "'bfloat16' is DeepSpeed's older name for 'bf16'; it is read as 'bf16'.");
  }
  SectionReader r(top.context(), old ? "bfloat16" : "bf16", old ? old : current, "bf16");
  if (auto v = r.read_bool("enabled")) bf16.enabled = *v;
}

// Muon's own keys (DeepSpeed's engine builds MuonWithAuxAdam's two halves
// from them): the shared lr unless muon_lr / adam_lr give a half its own,
// MuonWithAuxAdam's defaults (Muon 0.02, Adam 3e-4) where no rate is given.
// Called after lr and eps are read; betas default to MuonWithAuxAdam's.
void read_muon_params(SectionReader& p, OptimizerConfig& opt) {
  const bool lr_given = p.find_unless_auto("lr") != nullptr;
  opt.muon_lr = p.read_float("muon_lr", kNonNegativeReal);
  opt.adam_lr = p.read_float("adam_lr", kNonNegativeReal);
  if (!lr_given) {
    opt.lr = opt.muon_lr.value_or(0.02f);
    if (!opt.adam_lr) opt.adam_lr = 3e-4f;
  }
  if (opt.lr == 0.0f && (opt.muon_lr.value_or(0.0f) > 0.0f || opt.adam_lr.value_or(0.0f) > 0.0f)) {
    p.fail("lr", "is 0 while muon_lr or adam_lr is not: each half steps at the engine's rate times its share of "
                 "it (muon_lr / lr, adam_lr / lr), so lr must be > 0; set lr > 0 (or, with muon_lr > 0, leave lr "
                 "out: it then is muon_lr)");
  }
  opt.beta1 = 0.9f;
  opt.beta2 = 0.95f;
  if (auto v = p.read_float("momentum", kBetaRange)) opt.momentum = *v;
  if (auto v = p.read_choice("ns_method", {"gram", "standard"})) opt.ns_method = *v;
  if (p.read_bool("per_head_muon") == true) {
    p.fail("per_head_muon", "per-head orthogonalization of attention projections is not available in zerocpp: "
                            "set it to false or remove it (each matrix is orthogonalized whole)");
  }
}

void read_optimizer(SectionReader& top, OptimizerConfig& opt) {
  const Json* section = top.read_object(
      "optimizer", "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}");
  if (!section) return;  // AdamW with the defaults
  SectionReader r(top.context(), "optimizer", section);
  auto type = r.read_choice("type", {"Adam", "AdamW", "Adagrad", "Lion", "Muon"});
  if (!type) {
    r.fail("type", "required when 'optimizer' is given: one of \"Adam\", \"AdamW\", \"Adagrad\", \"Lion\", "
                   "\"Muon\"");
  }
  opt.type = *type;
  SectionReader p(top.context(), "optimizer.params",
                  r.read_object("params", "{\"lr\": 0.001, \"weight_decay\": 0.01}"));

  // DeepSpeed's CPU Adagrad defaults differ from Adam's; its Lion's are
  // Adam's (lr 1e-3, betas 0.9, 0.999), without eps; its Muon's are
  // MuonWithAuxAdam's.
  const bool adagrad = opt.is_adagrad(), lion = opt.is_lion(), muon = opt.is_muon();
  opt.lr = p.read_float("lr", kNonNegativeReal).value_or(adagrad ? 1e-2f : 1e-3f);
  if (lion) {
    if (p.find_unless_auto("eps")) p.note_ignored("eps", "Lion has no eps (its update is a sign)");
  } else {
    opt.eps = p.read_float("eps", kPositiveReal).value_or(adagrad || muon ? 1e-10f : 1e-8f);
  }
  if (muon) {
    read_muon_params(p, opt);
  } else {
    for (std::string_view key : {"momentum", "ns_method", "muon_lr", "adam_lr", "per_head_muon"}) {
      if (p.given(key)) p.note_ignored(key, "it applies to Muon only");
    }
  }
  if (auto v = p.read_float("weight_decay", kNonNegativeReal)) opt.weight_decay = *v;

  if (const Json* betas = p.find_unless_auto("betas")) {
    if (adagrad) {
      p.note_ignored("betas", "Adagrad has no betas");
    } else {
      const std::string expected = "two numbers [beta1, beta2], each " + kBetaRange.describe();
      if (!betas->is_array() || betas->size() != 2) p.fail_expected("betas", expected, *betas);
      float b[2];
      for (std::size_t i = 0; i < 2; ++i) {
        const Json& e = (*betas)[i];
        std::string key = "betas[" + std::to_string(i) + "]";
        if (!e.is_number()) p.fail_expected(key, kBetaRange.describe(), e);
        auto f = static_cast<float>(std::clamp(e.get<double>(), -1e30, 1e30));
        if (!kBetaRange.contains(f)) p.fail_expected(key, kBetaRange.describe(), e);
        b[i] = f;
      }
      opt.beta1 = b[0];
      opt.beta2 = b[1];
    }
  }

  auto adam_w_mode = p.read_bool("adam_w_mode");
  if (adagrad || lion) {
    if (adam_w_mode) {
      p.note_ignored("adam_w_mode", lion ? "it applies to Adam only; Lion always decouples weight decay"
                                         : "it applies to Adam only");
    }
    opt.adam_w_mode = false;
  } else if (opt.type == "AdamW") {
    if (adam_w_mode == false) {
      p.note_ignored("adam_w_mode",
                     "type \"AdamW\" always decouples weight decay, as in DeepSpeed");
    }
    opt.adam_w_mode = true;
  } else {
    opt.adam_w_mode = adam_w_mode.value_or(true);  // DeepSpeed's default: Adam means AdamW
  }

  if (auto v = p.read_bool("bias_correction")) {
    if (adagrad || lion) {
      p.note_ignored("bias_correction", "it applies to Adam only");
    } else {
      opt.bias_correction = *v;
    }
  }
  // DeepSpeed's CPU and fused Adam refuse AMSGrad too (only its torch_adam
  // path has it); training without it where it was asked for would differ
  // silently.
  if (p.read_bool("amsgrad") == true) {
    p.fail("amsgrad", "AMSGrad is not available in zerocpp (nor in DeepSpeed's CPU and fused Adam, which refuse "
                      "it): set it to false or remove it");
  }

  // DeepSpeed's torch_adam builds torch.optim.AdamW (or Adam without
  // adam_w_mode) from the same params: the same step as zerocpp's Adam,
  // except that torch's AdamW decays weights by 0.01 where none is given.
  if (p.read_bool("torch_adam") == true) {
    if (adagrad || lion || muon) {
      p.note_ignored("torch_adam", "it applies to Adam and AdamW");
    } else if (opt.adam_w_mode && !p.given("weight_decay")) {
      opt.weight_decay = kTorchAdamWWeightDecay;
      top.context().warn("'optimizer.params.torch_adam' is true and 'weight_decay' is not given: weight_decay is "
                         "0.01, torch.optim.AdamW's default, which DeepSpeed then steps with (its own Adam's is 0).");
    }
  }

  auto accumulator = p.read_float("initial_accumulator_value", kNonNegativeReal);
  if (adagrad) {
    if (accumulator) opt.initial_accumulator_value = *accumulator;
  } else if (accumulator) {
    p.note_ignored("initial_accumulator_value", "it applies to Adagrad only");
  }
}

// The keys of each family of DeepSpeed's schedulers: a key of another
// family than the config's type is ignored, with a note (DeepSpeed would
// stop on it with a TypeError).
struct SchedulerKeys {
  std::vector<std::string_view> types;
  std::string_view family;
  std::vector<std::string_view> keys;
};
const SchedulerKeys kSchedulerFamilies[] = {
    {{"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"},
     "the warm-up schedulers (WarmupLR, WarmupDecayLR, WarmupCosineLR)",
     {"warmup_num_steps", "warmup_type", "warmup_min_lr", "warmup_max_lr", "warmup_min_ratio", "cos_min_ratio",
      "total_num_steps"}},
    {{"OneCycle"},
     "OneCycle",
     {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size", "cycle_second_step_size",
      "cycle_first_stair_count", "cycle_second_stair_count", "decay_step_size", "cycle_momentum", "cycle_min_mom",
      "cycle_max_mom", "decay_mom_rate"}},
    {{"LRRangeTest"},
     "LRRangeTest",
     {"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate", "lr_range_test_staircase"}},
};

void note_keys_of_other_schedulers(SectionReader& p, const std::string& type) {
  for (const SchedulerKeys& f : kSchedulerFamilies) {
    if (std::find(f.types.begin(), f.types.end(), type) != f.types.end()) continue;
    for (std::string_view key : f.keys) {
      if (p.given(key)) p.note_ignored(key, "it applies to " + std::string(f.family) + ", not " + type);
    }
  }
}

// The optimizer step (counted from 1) at which OneCycle's momentum decay
// takes beta1 to 1, as Engine::betas() computes it; 0 when it never does.
std::int64_t step_where_beta1_reaches_one(const OneCycleConfig& c) {
  if (!c.cycle_momentum || c.decay_step_size == 0 || c.decay_mom_rate == 0.0f || c.cycle_max_mom <= 0.0f) return 0;
  auto beta1 = [&](std::int64_t j) {  // j steps into the decay, from 1
    return static_cast<float>(static_cast<double>(c.cycle_max_mom) *
                              (1.0 + c.decay_mom_rate * static_cast<double>(j) / static_cast<double>(c.decay_step_size)));
  };
  const double estimate = static_cast<double>(c.decay_step_size) * (1.0 / c.cycle_max_mom - 1.0) / c.decay_mom_rate;
  if (!(estimate < 1e15)) return 0;
  std::int64_t j = std::max<std::int64_t>(1, static_cast<std::int64_t>(estimate) - 1);
  while (beta1(j) < 1.0f) ++j;
  while (j > 1 && beta1(j - 1) >= 1.0f) --j;  // (float rounding can reach 1 before the estimate)
  // betas(k) with k = F + S + j - 1 is the rate of the step after k + 1 taken.
  return c.cycle_first_step_size + c.cycle_second_step_size + j + 1;
}

void read_one_cycle(SectionReader& p, const OptimizerConfig& opt, bool betas_given, OneCycleConfig& c) {
  auto required = [&](const char* key) {
    auto v = p.read_float(key, kNonNegativeReal);
    if (!v) {
      p.fail(key, std::string(p.is_auto(key) ? "is \"auto\", and it is " : "") +
                      "required by OneCycle (DeepSpeed has no default): the rate at the cycle's " +
                      (std::string_view(key) == "cycle_min_lr" ? "start and end" : "peak") + ", a number >= 0");
    }
    return *v;
  };
  c.cycle_min_lr = required("cycle_min_lr");
  c.cycle_max_lr = required("cycle_max_lr");
  if (auto v = p.read_float("decay_lr_rate", kNonNegativeReal)) c.decay_lr_rate = *v;
  if (auto v = p.read_int("cycle_first_step_size", kPositive)) c.cycle_first_step_size = *v;
  c.cycle_second_step_size = p.read_int("cycle_second_step_size", kNonNegative).value_or(c.cycle_first_step_size);
  // (DeepSpeed steps in stairs for a count > 0 only: its own command-line
  // defaults write -1.)
  if (auto v = p.read_int("cycle_first_stair_count", IntRange{})) c.cycle_first_stair_count = *v;
  c.cycle_second_stair_count = p.read_int("cycle_second_stair_count", IntRange{}).value_or(c.cycle_first_stair_count);
  if (auto v = p.read_int("decay_step_size", kNonNegative)) c.decay_step_size = *v;
  if (auto v = p.read_bool("cycle_momentum")) c.cycle_momentum = *v;
  if (auto v = p.read_float("cycle_min_mom", kBetaRange)) c.cycle_min_mom = *v;
  if (auto v = p.read_float("cycle_max_mom", kBetaRange)) c.cycle_max_mom = *v;
  if (auto v = p.read_float("decay_mom_rate", kNonNegativeReal)) c.decay_mom_rate = *v;
  if (!c.cycle_momentum) return;
  if (opt.is_adagrad() || opt.is_muon()) {
    // DeepSpeed: "cycle_momentum is disabled because optimizer ... does not
    // support momentum" (MuonWithAuxAdam has no betas in its defaults).
    p.context().warn(opt.is_muon() ? "'scheduler.params.cycle_momentum' is off: Muon's momentum and its Adam half's "
                                     "betas stay as configured, as in DeepSpeed (MuonWithAuxAdam has no betas to cycle)."
                                   : "'scheduler.params.cycle_momentum' is off: Adagrad has no momentum (betas) to cycle.");
    c.cycle_momentum = false;
    return;
  }
  if (betas_given) {
    p.context().warn("OneCycle's momentum cycle steps " + opt.type + " with betas [momentum, 0.99], as DeepSpeed's "
                     "does: 'optimizer.params.betas' [" + short_number(opt.beta1) + ", " +
                     short_number(opt.beta2) + "] is not used; \"cycle_momentum\": false keeps it.");
  }
  if (const std::int64_t at = step_where_beta1_reaches_one(c)) {
    p.context().warn("'scheduler.params.decay_mom_rate' (" + short_number(c.decay_mom_rate) + ") takes beta1 from " +
                     short_number(c.cycle_max_mom) + " to 1 at optimizer step " + std::to_string(at) +
                     ": a run that long stops there (Adam and Lion need beta1 < 1).");
  }
}

void read_range_test(SectionReader& p, LrRangeTestConfig& c) {
  if (auto v = p.read_float("lr_range_test_min_lr", kNonNegativeReal)) c.min_lr = *v;
  if (auto v = p.read_int("lr_range_test_step_size", kPositive)) c.step_size = *v;
  if (auto v = p.read_float("lr_range_test_step_rate", kNonNegativeReal)) c.step_rate = *v;
  if (auto v = p.read_bool("lr_range_test_staircase")) c.staircase = *v;
}

void read_warmup_schedule(SectionReader& top, SectionReader& p, const OptimizerConfig& opt, SchedulerConfig& sched) {
  const bool cosine = sched.type == "WarmupCosineLR";
  const bool decays = sched.type != "WarmupLR";
  // Defaults are DeepSpeed's (lr_schedules.py): WarmupLR peaks at the
  // optimizer's lr, WarmupDecayLR at a fixed 0.001 (said when that is not
  // the lr); "auto" (the Hugging Face Trainer fills in its learning rate)
  // is the lr.
  sched.warmup_num_steps = p.read_int("warmup_num_steps", kNonNegative).value_or(1000);
  if (const Json* t = p.find_unless_auto("warmup_type"); t && t->is_string()) {
    // DeepSpeed compares it case-sensitively and warms up along the log
    // curve for anything else: "Linear" would mean log there.
    const std::string& s = t->get_ref<const std::string&>();
    std::string lower = s;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (s != lower && (lower == "log" || lower == "linear")) {
      p.fail("warmup_type", "is \"" + s + "\", which DeepSpeed does not recognise (it matches \"log\" and "
                            "\"linear\" case-sensitively) and replaces by \"log\": write \"log\" or \"linear\"");
    }
  }
  sched.warmup_type = p.read_choice("warmup_type", {"log", "linear"}).value_or("log");
  const bool max_given = p.given("warmup_max_lr");
  sched.warmup_max_lr = p.read_float("warmup_max_lr", kNonNegativeReal)
                            .value_or(sched.type == "WarmupDecayLR" && !max_given ? kDeepSpeedWarmupDecayMaxLr : opt.lr);
  if (sched.type == "WarmupDecayLR" && !max_given && opt.lr != kDeepSpeedWarmupDecayMaxLr) {
    p.context().warn("scheduler WarmupDecayLR has no 'warmup_max_lr', so it peaks at DeepSpeed's default 0.001, not "
                     "at optimizer.params.lr (" + short_number(opt.lr) + "): give warmup_max_lr to choose the peak.");
  }

  auto min_lr = p.read_float("warmup_min_lr", kNonNegativeReal);
  auto min_ratio = p.read_float("warmup_min_ratio", kUnitInterval);
  if (min_ratio && !cosine) {
    p.note_ignored("warmup_min_ratio", "it applies to WarmupCosineLR (use warmup_min_lr)");
    min_ratio.reset();
  }
  if (min_lr && min_ratio) {
    p.fail("warmup_min_ratio", "give either warmup_min_lr or warmup_min_ratio, not both");
  }
  sched.warmup_min_lr = min_ratio ? *min_ratio * sched.warmup_max_lr : min_lr.value_or(0.0f);

  auto cos_min_ratio = p.read_float("cos_min_ratio", kUnitInterval);
  if (cosine) {
    sched.cos_min_ratio = cos_min_ratio.value_or(1e-4f);
  } else if (cos_min_ratio) {
    p.note_ignored("cos_min_ratio", "it applies to WarmupCosineLR");
  }

  const bool total_auto = p.is_auto("total_num_steps");
  auto total = p.read_int("total_num_steps", kPositive);
  if (decays) {
    if (!total) {
      p.fail("total_num_steps", std::string(total_auto ? "is \"auto\" (the Hugging Face Trainer fills in its step "
                                                         "count), and it is " : "") +
                                    "required by " + sched.type +
                                    ": the step at which the decay ends (a positive integer; zero-train: the "
                                    "--steps of the run)");
    }
    sched.total_num_steps = *total;
    if (sched.total_num_steps < sched.warmup_num_steps) {
      top.context().warn("'scheduler.params.total_num_steps' (" + std::to_string(*total) +
                         ") is less than warmup_num_steps (" +
                         std::to_string(sched.warmup_num_steps) +
                         "): the learning rate never decays.");
    }
  } else if (total) {
    p.note_ignored("total_num_steps", "WarmupLR keeps the rate constant after warmup");
  }
}

void read_scheduler(SectionReader& top, const OptimizerConfig& opt, SchedulerConfig& sched) {
  const Json* section = top.read_object(
      "scheduler", "{\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 1000}}");
  if (!section) return;
  SectionReader r(top.context(), "scheduler", section);
  auto type = r.read_choice("type", {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"});
  if (!type) {
    r.fail("type", "required when 'scheduler' is given: one of \"WarmupLR\", \"WarmupDecayLR\", "
                   "\"WarmupCosineLR\", \"OneCycle\", \"LRRangeTest\"");
  }
  sched.type = *type;
  const std::string_view example = sched.type == "OneCycle"
                                       ? "{\"cycle_min_lr\": 1e-4, \"cycle_max_lr\": 1e-3}"
                                       : sched.type == "LRRangeTest" ? "{\"lr_range_test_min_lr\": 1e-5}"
                                                                     : "{\"warmup_num_steps\": 1000}";
  SectionReader p(top.context(), "scheduler.params", r.read_object("params", example));
  if (sched.type == "OneCycle") {
    // Whether the user wrote betas (not "auto", which Hugging Face fills in).
    const Json* o = top.find("optimizer");
    const Json* params = o && o->is_object() && o->contains("params") ? &o->at("params") : nullptr;
    const bool betas_given = params && params->is_object() && params->contains("betas") &&
                             params->at("betas").is_array();
    read_one_cycle(p, opt, betas_given, sched.one_cycle);
  } else if (sched.type == "LRRangeTest") {
    read_range_test(p, sched.range_test);
  } else {
    read_warmup_schedule(top, p, opt, sched);
  }
  note_keys_of_other_schedulers(p, sched.type);
}

void read_offload_optimizer(SectionReader& zero, OffloadOptimizerConfig& off) {
  SectionReader r(zero.context(), "zero_optimization.offload_optimizer",
                  zero.read_object("offload_optimizer", "{\"device\": \"cpu\", \"pin_memory\": true}"));
  if (auto v = r.read_choice("device", {"none", "cpu", "nvme"})) off.device = *v;
  if (auto v = r.read_bool("pin_memory")) off.pin_memory = *v;
  if (auto v = r.read_string("nvme_path")) off.nvme_path = *v;
  if (auto v = r.read_bool("delayed_param_update")) off.delayed_param_update = *v;
  if (auto v = r.read_int32("delayed_param_update_warmup_steps", kNonNegative)) {
    off.delayed_param_update_warmup_steps = *v;
  }
  if (auto v = r.read_bool("publish_in_backward")) off.publish_in_backward = *v;
  if (auto v = r.read_int32("cpu_threads", kNonNegative)) off.cpu_threads = *v;
  if (auto v = r.read_int32("buffer_count", {2, 64})) {
    if (off.device == "nvme") {
      off.buffer_count = *v;
    } else if (*v != 4) {
      r.note_ignored("buffer_count", "it is the swap buffers of device \"nvme\"");
    }
  }
  if (auto v = r.read_float("ratio", kUnitInterval)) {
    if (off.device == "cpu") {
      off.ratio = *v;
    } else if (*v != 1.0f) {
      r.note_ignored("ratio", "it is the share of an offloaded optimizer (device \"cpu\")");
    }
  }
}

void read_offload_param(SectionReader& zero, OffloadParamConfig& off) {
  SectionReader r(zero.context(), "zero_optimization.offload_param",
                  zero.read_object("offload_param", "{\"device\": \"cpu\"}"));
  if (auto v = r.read_choice("device", {"none", "cpu", "nvme"})) off.device = *v;
  if (auto v = r.read_bool("pin_memory")) off.pin_memory = *v;
  if (auto v = r.read_string("nvme_path")) off.nvme_path = *v;
  if (auto v = r.read_int32("buffer_count", {2, 64})) {
    if (off.device == "nvme") {
      off.buffer_count = *v;
    } else if (*v != 5) {
      r.note_ignored("buffer_count", "it is the parameter buffers of device \"nvme\"");
    }
  }
}

// DeepSpeed's pre-0.5 spellings of offload, still found in older configs.
void read_deprecated_offload(SectionReader& z, ZeroOptimizationConfig& zero) {
  ParseContext& ctx = z.context();
  if (auto v = z.read_bool("cpu_offload")) {
    if (z.given("offload_optimizer")) {
      z.note_ignored("cpu_offload", "'offload_optimizer' is given and takes precedence");
    } else {
      ctx.warn(*v ? "'zero_optimization.cpu_offload' is deprecated in DeepSpeed; it is read as "
                    "offload_optimizer.device \"cpu\" (write \"offload_optimizer\": {\"device\": \"cpu\"} instead)."
                  : "'zero_optimization.cpu_offload' is deprecated in DeepSpeed; false is read as "
                    "offload_optimizer.device \"none\" (leave it out, or write \"offload_optimizer\": "
                    "{\"device\": \"none\"}).");
      if (*v) zero.offload_optimizer.device = "cpu";
    }
  }
  if (auto v = z.read_bool("cpu_offload_params")) {
    if (z.given("offload_param")) {
      z.note_ignored("cpu_offload_params", "'offload_param' is given and takes precedence");
    } else {
      ctx.warn("'zero_optimization.cpu_offload_params' is deprecated in DeepSpeed; it is read "
               "as offload_param.device \"cpu\".");
      if (*v) zero.offload_param.device = "cpu";
    }
  }
  if (auto v = z.read_bool("cpu_offload_use_pin_memory")) {
    if (z.given("offload_optimizer") || z.given("offload_param")) {
      z.note_ignored("cpu_offload_use_pin_memory",
                     "'offload_optimizer'/'offload_param' are given and take precedence");
    } else {
      ctx.warn("'zero_optimization.cpu_offload_use_pin_memory' is deprecated in DeepSpeed; it "
               "is read as pin_memory of offload_optimizer and offload_param.");
      zero.offload_optimizer.pin_memory = *v;
      zero.offload_param.pin_memory = *v;
    }
  }
}

void read_zero_optimization(SectionReader& top, ZeroOptimizationConfig& zero) {
  // DeepSpeed's oldest spelling: true is stage 1, false stage 0 (its
  // read_zero_config_deprecated; deepspeed.ai's getting-started config).
  if (const Json* v = top.find("zero_optimization"); v && v->is_boolean()) {
    zero.stage = v->get<bool>() ? 1 : 0;
    top.context().warn("'zero_optimization': " + std::string(v->get<bool>() ? "true" : "false") +
                       " is DeepSpeed's deprecated spelling of stage " + std::to_string(zero.stage) +
                       "; it is read so (write \"zero_optimization\": {\"stage\": " + std::to_string(zero.stage) +
                       "}).");
    return;
  }
  SectionReader z(top.context(), "zero_optimization",
                  top.read_object("zero_optimization", "{\"stage\": 2}"));
  if (auto v = z.read_int32("stage", {0, 3})) zero.stage = *v;
  read_offload_optimizer(z, zero.offload_optimizer);
  read_offload_param(z, zero.offload_param);
  read_deprecated_offload(z, zero);
  if (auto v = z.read_bool("overlap_comm")) zero.overlap_comm = *v;
  if (auto v = z.read_bool("contiguous_gradients")) zero.contiguous_gradients = *v;
  // 0 is DeepSpeed's too (its configs use it: transformers' ZeRO-3 test
  // config): every parameter reduced on its own, a bucket each.
  if (auto v = z.read_int("reduce_bucket_size", kNonNegative)) zero.reduce_bucket_size = *v;
  if (auto v = z.read_int("allgather_bucket_size", kNonNegative)) zero.allgather_bucket_size = *v;
  if (auto v = z.read_bool("reduce_scatter")) zero.reduce_scatter = *v;
  // DeepSpeed's pydantic section takes each stage-3 key by its field name
  // too (prefetch_bucket_size for stage3_prefetch_bucket_size).
  auto stage3_key = [&](const char* name, std::int64_t& field) {
    const std::string prefixed = std::string("stage3_") + name;
    if (z.given(prefixed) && z.given(name)) {
      z.fail(name, "gives the same setting as '" + z.path_of(prefixed) + "' (DeepSpeed reads either name): keep one");
    }
    if (auto v = z.read_int(z.given(name) ? name : prefixed, kNonNegative)) field = *v;
  };
  stage3_key("prefetch_bucket_size", zero.stage3_prefetch_bucket_size);
  stage3_key("param_persistence_threshold", zero.stage3_param_persistence_threshold);
  stage3_key("max_live_parameters", zero.stage3_max_live_parameters);
  if (auto v = z.read_int("sub_group_size", kNonNegative)) {
    if (*v == 0) {
      // DeepSpeed's 0 is a sub-group per parameter (axolotl's ZeRO-3 configs
      // write it); zerocpp's pieces follow its buckets instead.
      z.note_ignored("sub_group_size", "0 (DeepSpeed: a sub-group per parameter) keeps zerocpp's own pieces, an "
                                       "eighth of a bucket's chunk at most");
    } else {
      zero.sub_group_size = *v;
    }
  }
}

void read_activation_checkpointing(SectionReader& top, ActivationCheckpointingConfig& ac) {
  SectionReader r(top.context(), "activation_checkpointing",
                  top.read_object("activation_checkpointing", "{\"partition_activations\": false}"));
  if (auto v = r.read_bool("partition_activations")) ac.partition_activations = *v;
  if (auto v = r.read_bool("cpu_checkpointing")) ac.cpu_checkpointing = *v;
  if (auto v = r.read_bool("contiguous_memory_optimization")) {
    ac.contiguous_memory_optimization = *v;
  }
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// DeepSpeed's keys for how gradients are reduced and accumulated. zerocpp
// averages over the ranks and reduces (and, in most layouts, accumulates)
// in the training precision: a dtype that names it, or null, is what it
// does anyway; another one changes DeepSpeed's rounding, which zerocpp does
// not follow, so it says so. "sum" would change every step by a factor of
// the world size, so it is refused.
void read_reduction_keys(SectionReader& top, const Config& c) {
  const std::string training = c.bf16.enabled ? "bf16" : c.fp16.enabled ? "fp16" : "fp32";
  if (auto v = top.read_choice("communication_data_type", {"fp32", "fp16", "bf16"}); v && *v != training) {
    top.context().warn("'communication_data_type' \"" + *v + "\" is not supported: zerocpp reduces gradients in the "
                       "training precision (" + training + "), so its rounding differs from DeepSpeed's run.");
  }
  SectionReader types(top.context(), "data_types",
                      top.read_object("data_types", "{\"grad_accum_dtype\": \"fp32\"}"));
  // DeepSpeed's DtypeEnum names (runtime/config.py), each to its short one.
  auto accum = types.read_choice("grad_accum_dtype", {"fp32", "float32", "float", "torch.float32", "fp16", "float16",
                                                      "half", "torch.float16", "bf16", "bfloat16", "torch.bfloat16"});
  if (accum) {
    const std::string& a = *accum;
    accum = a == "fp32" || a == "float32" || a == "float" || a == "torch.float32" ? "fp32"
            : a == "bf16" || a == "bfloat16" || a == "torch.bfloat16"             ? "bf16"
                                                                                    : "fp16";
  }
  if (const auto& v = accum; v && *v != training) {
    types.context().warn("'data_types.grad_accum_dtype' \"" + *v + "\" is not supported: zerocpp accumulates the "
                         "micro-batches' gradients as docs/engine.md says (in the training precision, " + training +
                         ", except the fp32 partition of optimizer offload on a GPU), so its rounding differs from "
                         "DeepSpeed's run.");
  }
  if (auto v = top.read_choice("gradient_allreduce_op", {"mean", "sum"}); v && *v == "sum") {
    top.fail("gradient_allreduce_op", "\"sum\" is not supported: zerocpp averages gradients over the ranks "
                                      "(\"mean\", DeepSpeed's default); to sum, scale the loss by the world size");
  }
}

// Rules between keys; each message names both keys and the way out.
void check_combinations(const ParseContext& ctx, const Config& c) {
  const ZeroOptimizationConfig& z = c.zero_optimization;
  if (c.fp16.enabled && c.bf16.enabled) {
    ctx.fail("", "fp16.enabled and bf16.enabled are both true; enable at most one of them");
  }
  const auto& oo = z.offload_optimizer;
  const auto& op = z.offload_param;
  if (op.device == "nvme" && op.nvme_path.empty()) {
    ctx.fail("zero_optimization.offload_param.nvme_path",
             "is required with offload_param.device \"nvme\": the folder on the NVMe drive for the "
             "parameters (each rank writes one file there)");
  }
  if (op.device == "nvme" && z.stage == 3 && oo.device == "none") {
    ctx.fail("zero_optimization.offload_param.device",
             "is \"nvme\" but offload_optimizer.device is \"none\": with the parameters on NVMe the optimizer "
             "steps on the CPU (ZeRO-Infinity); set offload_optimizer.device to \"cpu\" or \"nvme\", or "
             "offload_param.device to \"cpu\"");
  }
  if (oo.device == "nvme" && oo.nvme_path.empty()) {
    ctx.fail("zero_optimization.offload_optimizer.nvme_path",
             "is required with offload_optimizer.device \"nvme\": the folder on the NVMe drive for the "
             "optimizer state (each rank writes one file there)");
  }
  if (oo.device != "none" && z.stage == 0) {
    ctx.fail("zero_optimization.offload_optimizer.device",
             "is " + quoted(oo.device) +
                 " but zero_optimization.stage is 0: ZeRO-Offload needs a partitioned "
                 "optimizer; set zero_optimization.stage to 1 or 2 (or 3), or set "
                 "offload_optimizer.device to \"none\"");
  }
  if (oo.delayed_param_update && oo.device != "cpu" && oo.device != "nvme") {
    ctx.fail("zero_optimization.offload_optimizer.delayed_param_update",
             "needs offload_optimizer.device \"cpu\" or \"nvme\" (it overlaps the CPU optimizer step with "
             "the next step), but the device is " +
                 quoted(oo.device) +
                 "; set offload_optimizer.device to \"cpu\" or delayed_param_update to false");
  }
}

// Parameter offload below stage 3: DeepSpeed accepts it and does nothing
// with it (DeepSpeed-Chat's stage-2 offload config has it); so here, said.
void ignore_param_offload_below_stage3(ParseContext& ctx, ZeroOptimizationConfig& z) {
  if (z.offload_param.device == "none" || z.stage == 3) return;
  ctx.warn("'zero_optimization.offload_param' is ignored: its device is \"" + z.offload_param.device + "\"" +
           " but zero_optimization.stage is " + std::to_string(z.stage) +
           ", and parameter offload needs stage 3 (partitioned parameters), as in DeepSpeed; set "
           "zero_optimization.stage to 3 to offload the parameters.");
  z.offload_param = OffloadParamConfig{};
}

void read_failure_handling(SectionReader& top, Config& c) {
  // Up to a week: longer is a typo (milliseconds?), and it keeps the
  // millisecond count far inside an int64.
  if (auto v = top.read_float("comm_timeout", RealRange{0.0, true, 7 * 24 * 3600.0, false})) {
    c.comm_timeout = *v;
  }
  if (auto v = top.read_bool("comm_sequence_check")) c.comm_sequence_check = *v;
  if (const Json* section = top.read_object("nonfinite", "{\"policy\": \"stop\", \"stop_after\": 3}")) {
    SectionReader r(top.context(), "nonfinite", section);
    if (auto v = r.read_choice("policy", {"skip", "stop"})) c.nonfinite.policy = *v;
    if (auto v = r.read_int("stop_after", kPositive)) c.nonfinite.stop_after = *v;
  }
  if (const Json* section = top.read_object("aio", "{\"block_size\": 1048576, \"thread_count\": 1}")) {
    SectionReader r(top.context(), "aio", section);
    if (auto v = r.read_int("block_size", {4096, std::int64_t{1} << 30})) {
      if (*v % 4096 != 0) r.fail("block_size", "must be a multiple of 4096 bytes (what O_DIRECT asks), got " + std::to_string(*v));
      c.aio.block_size = *v;
    }
    const auto threads = r.read_int32("thread_count", {1, 64});
    const auto intra = r.read_int32("intra_op_parallelism", {1, 64});  // DeepSpeed's newer name for it
    if (threads && intra && *threads != *intra) {
      r.fail("intra_op_parallelism", "and aio.thread_count are the same setting (DeepSpeed's newer and older "
                                     "name) and give " + std::to_string(*intra) + " and " + std::to_string(*threads) +
                                     ": give one of them");
    }
    if (threads) c.aio.thread_count = *threads;
    if (intra) c.aio.thread_count = *intra;
  }
  if (const Json* section = top.read_object("flight_recorder", "{\"entries\": 1024, \"dir\": \"/tmp/fr\"}")) {
    SectionReader r(top.context(), "flight_recorder", section);
    if (auto v = r.read_int("entries", {1, 1 << 20})) c.flight_recorder.entries = *v;
    if (auto v = r.read_string("dir")) c.flight_recorder.dir = *v;
  }
}

}  // namespace

Config parse_config(std::string_view json_text, int world_size, std::string_view source) {
  ZERO_CHECK(world_size >= 1, source, ": the world size (data-parallel ranks) must be at least 1, got ",
             world_size);
  Config c;
  c.world_size = world_size;
  Json root = parse_json(json_text, source);
  ParseContext ctx(source, &c.warnings);
  if (!root.is_object()) {
    ctx.fail("", "expected a JSON object ({...}) at the top level, got " +
                     detail::describe_value(root));
  }
  SectionReader top(ctx, "", &root);

  detail::GivenBatchSizes given;
  given.train_batch_size = top.read_int("train_batch_size", kPositive);
  given.micro_batch_per_gpu = top.read_int("train_micro_batch_size_per_gpu", kPositive);
  given.gradient_accumulation_steps = top.read_int("gradient_accumulation_steps", kPositive);
  given.any_auto = top.is_auto("train_batch_size") || top.is_auto("train_micro_batch_size_per_gpu") ||
                   top.is_auto("gradient_accumulation_steps");
  // DeepSpeed 0.19's default is 1.0 (GRADIENT_CLIPPING_DEFAULT), as the
  // Hugging Face Trainer's max_grad_norm: a config without the key clips
  // there as it would.
  // DeepSpeed clips only when the value is above 0: a negative one is off.
  c.gradient_clipping = std::max(top.read_float("gradient_clipping", RealRange{}).value_or(kDeepSpeedGradientClipping),
                                 0.0f);

  read_fp16(top, c.fp16);
  read_bf16(top, c.bf16);
  read_optimizer(top, c.optimizer);
  read_scheduler(top, c.optimizer, c.scheduler);
  read_zero_optimization(top, c.zero_optimization);
  read_activation_checkpointing(top, c.activation_checkpointing);
  read_reduction_keys(top, c);

  if (auto v = top.read_byte_size("device_memory_limit")) c.device_memory_limit = *v;
  if (auto v = top.read_int("steps_per_print", kPositive)) c.steps_per_print = *v;
  if (auto v = top.read_int("seed", kNonNegative)) {
    c.seed = *v;
    c.seed_given = true;
  }
  if (auto v = top.read_bool("wall_clock_breakdown")) c.wall_clock_breakdown = *v;
  read_failure_handling(top, c);

  ignore_param_offload_below_stage3(ctx, c.zero_optimization);
  check_combinations(ctx, c);

  detail::BatchSizes batch = detail::resolve_batch_sizes(given, world_size, source);
  c.train_batch_size = batch.train_batch_size;
  c.train_micro_batch_size_per_gpu = batch.micro_batch_per_gpu;
  c.gradient_accumulation_steps = batch.gradient_accumulation_steps;
  ctx.name_auto_values(to_json(c));
  return c;
}

std::string read_config_text(const std::filesystem::path& path) {
  std::error_code ec;
  ZERO_CHECK(!std::filesystem::is_directory(path, ec), "cannot read config file '", path.string(),
             "': it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    ZERO_CHECK(false, "cannot read config file '", path.string(), "': ",
               err ? std::strerror(err) : "cannot open it");
  }
  std::ostringstream text;
  text << in.rdbuf();
  ZERO_CHECK(!in.bad(), "cannot read config file '", path.string(), "': read error");
  return text.str();
}

Config load_config(const std::filesystem::path& path, int world_size) {
  return parse_config(read_config_text(path), world_size, path.string());
}

}  // namespace zero::config
