// zero-estimate: what fits where, before you run. Bytes per rank per tier for
// a model (a GPT preset or a parameter count), world size, stage, offload and
// precision, from docs/design.md's formulas as the engine lays them out
// (zero/memory_estimate.h), plus buckets and the activations of a micro-batch.
// With --device-mem and --host-mem: which configurations fit, best first.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli_range.h"
#include "common/option_suggestion.h"
#include "common/trainer_autos.h"
#include "zero/ckpt/shard_io.h"
#include "zero/config/byte_size.h"
#include "zero/config/config.h"
#include "zero/core/error.h"
#include "zero/memory/memory_ledger.h"
#include "zero/models/gpt.h"
#include "zero/zero/flat_layout.h"
#include "zero/zero/memory_estimate.h"
#include "zero/version.h"

using namespace zero;

namespace {

// A parameter count: digits with an optional fraction or exponent ("7.5e9")
// and an optional K, M, B or T suffix for thousand, million, billion,
// trillion ("1.5B" = 1,500,000,000). Byte units are refused: this is a count.
// `zero_ok`: 0 is a count too (--frozen-params 0: none).
std::int64_t parse_count(const std::string& s, const char* flag = "--params", bool zero_ok = false) {
  const std::string fix = "'" + s + "' is not a parameter count: write digits with an optional K, M, B or T "
                          "(thousand, million, billion, trillion), e.g. 350M, 1.5B or 7500000000";
  std::size_t pos = 0;
  double v = 0.0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    ZERO_CHECK(false, flag, " ", fix);
  }
  std::string unit = s.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double m = 0.0;
  if (unit.empty()) m = 1.0;
  else if (unit == "K") m = 1e3;
  else if (unit == "M") m = 1e6;
  else if (unit == "B") m = 1e9;
  else if (unit == "T") m = 1e12;
  ZERO_CHECK(m > 0.0 && std::isfinite(v) && (v > 0.0 || (zero_ok && v == 0.0)), flag, " ", fix);
  // Byte totals of 16+ bytes per parameter must stay in 64 bits.
  ZERO_CHECK(v * m <= 1e15, flag, " '", s, "' is more than 1000T (10^15) parameters, the most zero-estimate "
             "counts (its byte totals would overflow)");
  const std::int64_t n = static_cast<std::int64_t>(std::llround(v * m));
  ZERO_CHECK(v * m >= 1.0 || (zero_ok && v == 0.0), flag, " '", s, "' is less than one parameter: give ",
             zero_ok ? "0 or " : "", "a count of 1 or more, e.g. 350M");
  return n;
}

// A byte size, as device_memory_limit reads it: KB/MB/GB/TB are powers of
// 1000, KiB/MiB/GiB/TiB powers of 1024 (config/byte_size.h).
std::int64_t parse_bytes(const std::string& flag, const std::string& s) {
  const auto v = config::parse_byte_size(s);
  ZERO_CHECK(v && *v > 0, flag, " '", s, "' is not a byte size: write e.g. 80GB (10^9 bytes each) or 80GiB (2^30), "
             "as device_memory_limit does; a bare G or M is ambiguous and refused");
  return *v;
}

// --runtime-mem: a byte size, where 0 (in any unit) leaves it out.
std::int64_t runtime_bytes(const std::string& s) {
  const auto v = config::parse_byte_size(s);
  if (v && *v == 0) return 0;
  return parse_bytes("--runtime-mem", s);
}

// A parameter count in the unit that shows it: 120.6K, 86.41M, 1.500B (the
// suffixes --params reads), never "0.000B" for a small model.
std::string format_count(std::int64_t n) {
  char buf[32];
  const double v = static_cast<double>(n);
  if (v >= 1e12) std::snprintf(buf, sizeof buf, "%.3fT", v / 1e12);
  else if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.3fB", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1fK", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  return buf;
}

// A configuration the table may list: its stage, optimizer offload and
// parameter offload.
struct Candidate {
  int stage = 0;
  bool offload = false, params_off = false;
};

// The memory a configuration is checked against: --device-mem, --host-mem
// (0: not given), and what the host must hold for an estimate (its host
// total, on the CPU its device total too, and the runtime).
struct Limits {
  std::int64_t device = 0, host = 0;
  std::function<std::int64_t(const MemoryEstimate&)> host_need;
  bool device_fits(const MemoryEstimate& e) const { return device == 0 || e.device_total() <= device; }
  bool host_fits(const MemoryEstimate& e) const { return host == 0 || host_need(e) <= host; }
  bool fit(const MemoryEstimate& e) const { return device_fits(e) && host_fits(e); }
};

// Where no configuration fits: what alone makes one fit, each tried through
// the same formulas on its own (a what-if): the fewest ranks (--world), on a
// GPU offload (--offload, --offload-param at stage 3), a micro-batch of 1,
// activation checkpointing. Where none does, the configuration nearest to
// fitting, what it needs of each memory short, and more of that memory: the
// advice never names a fix that does not help (more ranks at stage 0, or
// where the construction peak, whole on every rank, is the device total at
// any world size). listed: the table's rows; configure(input, candidate):
// the input for one.
template <class Configure>
std::string fixes_that_fit(const EstimateInput& in, const std::vector<Candidate>& listed, bool on_gpu,
                           const Limits& limits, const Configure& configure) {
  const auto first_fit = [&](const EstimateInput& base, const std::vector<Candidate>& candidates)
      -> std::optional<Candidate> {
    for (const Candidate& c : candidates) {
      EstimateInput x = base;
      configure(x, c);
      if (limits.fit(estimate_memory(x))) return c;
    }
    return std::nullopt;
  };
  const auto name = [](const Candidate& c) { return describe_config(c.stage, c.offload, c.params_off); };
  std::vector<std::string> fixes, tried;
  // The fewest ranks: doubling to one that fits (at most kMostRanks), then
  // halving the gap (the totals fall as the world grows, but for the padding).
  constexpr int kMostRanks = 1 << 20;
  int fails = in.world, fit_world = 0;
  while (fails < kMostRanks && fit_world == 0) {
    const int w = std::min(2 * fails, kMostRanks);
    EstimateInput x = in;
    x.world = w;
    if (first_fit(x, listed)) fit_world = w; else fails = w;
  }
  if (fails > in.world || fit_world > 0) tried.push_back("more ranks (up to " + std::to_string(fails) + ")");
  if (fit_world > 0) {
    while (fit_world - fails > 1) {
      const int mid = fails + (fit_world - fails) / 2;
      EstimateInput x = in;
      x.world = mid;
      (first_fit(x, listed) ? fit_world : fails) = mid;
    }
    EstimateInput x = in;
    x.world = fit_world;
    fixes.push_back("add ranks: " + name(*first_fit(x, listed)) + " fits from --world " + std::to_string(fit_world));
  }
  if (on_gpu) {
    std::vector<Candidate> offloaded;
    std::vector<Candidate> params_off;
    for (const Candidate& c : listed) {
      if (!c.offload && c.stage >= 1) offloaded.push_back({c.stage, true, c.params_off});
      if (c.stage == 3 && !c.params_off) params_off.push_back({3, true, true});
    }
    if (!offloaded.empty() || !params_off.empty()) tried.push_back("offload");
    if (const auto c = first_fit(in, offloaded)) fixes.push_back("offload: " + name(*c) + " fits (--offload)");
    else if (const auto p = first_fit(in, params_off)) {
      fixes.push_back("offload the parameters: " + name(*p) + " fits (--offload --offload-param)");
    }
  }
  if (in.micro_batch > 1) {
    tried.push_back("a micro-batch of 1");
    EstimateInput x = in;
    x.micro_batch = 1;
    if (const auto c = first_fit(x, listed)) {
      fixes.push_back("a micro-batch of 1: " + name(*c) + " fits (--micro 1; gradient accumulation keeps the batch)");
    }
  }
  if (in.micro_batch > 0 && !in.checkpoint_activations) {
    tried.push_back("activation checkpointing");
    EstimateInput x = in;
    x.checkpoint_activations = true;
    if (const auto c = first_fit(x, listed)) fixes.push_back(name(*c) + " fits with --checkpoint-activations");
  }
  if (!fixes.empty()) {
    std::string out = fixes.front();
    for (std::size_t i = 1; i < fixes.size(); ++i) out += "; or " + fixes[i];
    return out;
  }
  // Nothing alone: the configuration nearest to fitting (the least of its
  // needs over each limit, the worse of the two), and what it needs.
  double nearest = -1.0;
  Candidate at;
  MemoryEstimate at_e;
  for (const Candidate& c : listed) {
    EstimateInput x = in;
    configure(x, c);
    const MemoryEstimate e = estimate_memory(x);
    double over = 0.0;
    if (limits.device > 0) over = std::max(over, double(e.device_total()) / double(limits.device));
    if (limits.host > 0) over = std::max(over, double(limits.host_need(e)) / double(limits.host));
    if (nearest < 0.0 || over < nearest) {
      nearest = over;
      at = c;
      at_e = e;
    }
  }
  const bool device_short = limits.device > 0 && at_e.device_total() > limits.device;
  const bool host_short = limits.host > 0 && limits.host_need(at_e) > limits.host;
  const bool built = device_short && at_e.device_total() == at_e.device_construction + at_e.device_frozen;
  std::string needs;
  if (device_short) {
    needs = memory::format_bytes(at_e.device_total()) + " of device memory" +
            (built ? " (while the engine is built: the parameters' fp32 copy beside the flat ones, whole on every "
                     "rank)"
                   : "");
  }
  if (host_short) needs += (needs.empty() ? "" : " and ") + memory::format_bytes(limits.host_need(at_e)) + " of host memory";
  std::string out = "the nearest to fitting, " + name(at) + ", needs " + needs + ": use more " +
                    (device_short && host_short ? "device and host" : device_short ? "device" : "host") + " memory";
  if (!tried.empty()) {
    std::string list = tried.front();
    for (std::size_t i = 1; i < tried.size(); ++i) list += (i + 1 == tried.size() ? " nor " : ", ") + tried[i];
    out = "neither " + list + " alone makes one fit; " + out;
    if (tried.size() == 1) out.replace(0, 8, "no ");
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, model = "gpt2", params_text, frozen_text, device_mem_text, host_mem_text, precision = "bf16", stage_text, optimizer = "AdamW";
  // What each process holds beside the engine's buffers: LibTorch, MPI and
  // the process itself (491-505 MiB of resident memory measured for a
  // process training gpt2-tiny on the CPU build, 474 MiB before the engine
  // was built: docs/PERFORMANCE.md).
  std::string runtime_mem_text = "512MiB";
  config::OptimizerConfig optimizer_kind;  // --optimizer's type, for its moments
  int world = 1, stage = -1, accumulation = 1;
  bool offload = false, dpu = false, json = false, checkpoint = false, cpu_checkpoint = false, on_gpu = false;
  bool offload_param = false, nvme = false, param_nvme = false;
  int nvme_buffers = 4, param_buffers = 5;
  std::int64_t sub_group = 1000000000;
  std::int64_t prefetch = 50'000'000, persistence = 100'000;
  double offload_ratio = 1.0;
  std::int64_t micro = 1, seq = 0, bucket = 500'000'000, n_layer = 0, n_head = 0, n_embd = 0, block_size = 0;
  CLI::App app{"zero-estimate: memory per rank per tier for a ZeRO configuration, and what fits"};
  app.set_version_flag("--version", std::string("zero-estimate (zerocpp ") + zero::version() + ")");
  auto* model_opt = app.add_option("--model", model, "GPT preset: gpt2-tiny, gpt2-small-test, gpt2, gpt2-medium, "
                                   "gpt2-large, gpt2-xl")->capture_default_str();
  app.add_option("--params", params_text, "parameter count instead of a model (K, M, B, T = "
                                    "thousand ... trillion: 1.5B, 7.5e9); no activation estimate");
  app.add_option("--frozen-params", frozen_text, "frozen parameters beside the trained ones (a base model under "
                 "adapters; same suffixes as --params): in the training precision, whole on every rank at stages "
                 "0-2; at stage 3 partitioned with the units (spread over them as the trained parameters are; in "
                 "host memory with --offload-param); counted in dev total");
  auto* layer_opt = app.add_option("--n-layer", n_layer, "override the preset's layers");
  auto* head_opt = app.add_option("--n-head", n_head, "override the preset's heads");
  auto* embd_opt = app.add_option("--n-embd", n_embd, "override the preset's width");
  auto* block_opt = app.add_option("--block-size", block_size, "override the preset's context length");
  app.add_option("--config", config_path, "a DeepSpeed-style JSON config (docs/config.md): its stage, offload, "
                 "precision, optimizer, micro-batch, accumulation, buckets, stage-3 keys, cpu_checkpointing and "
                 "device_memory_limit stand for the flags below; a flag given as well overrides it")
      ->check(CLI::ExistingFile);
  app.add_option("--world", world, "data-parallel ranks")
      ->check(tools::in_range<int>(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--stage", stage_text, "ZeRO stage 0, 1, 2 or 3 (default: all)")
      ->check(tools::non_empty("a stage: 0, 1, 2 or 3"));
  app.add_flag("--offload", offload, "offload_optimizer.device = cpu (stage 1, 2 or 3)");
  app.add_flag("--offload-param", offload_param, "offload_param.device = cpu: stage 3's parameter partition in "
               "host memory (lists stage 3 only)");
  app.add_flag("--param-nvme", param_nvme, "offload_param.device = nvme: stage 3's parameter partition in a "
               "swap file (the nvme column), read through --param-buffer-count host buffers of one bucket's chunk "
               "each; implies --offload-param and --offload");
  app.add_option("--param-buffer-count", param_buffers, "with --param-nvme: offload_param.buffer_count")
      ->capture_default_str();
  app.add_option("--prefetch", prefetch, "stage3_prefetch_bucket_size in elements (0: no prefetch); stage 3 "
                 "holds the largest unit plus this much fetched ahead")->capture_default_str();
  app.add_option("--persistence-threshold", persistence, "stage3_param_persistence_threshold: parameters with "
                 "fewer elements stay gathered")->capture_default_str();
  app.add_flag("--nvme", nvme, "offload_optimizer.device = nvme: the offloaded configurations with the "
               "master and moments in a swap file (the nvme column), swapped through --buffer-count host buffers "
               "of one step piece each (implies --offload)");
  app.add_option("--buffer-count", nvme_buffers, "with --nvme: offload_optimizer.buffer_count, the swap buffers")
      ->capture_default_str();
  app.add_option("--sub-group-size", sub_group, "with --nvme: zero_optimization.sub_group_size, the most "
                 "elements stepped and swapped as one piece")->capture_default_str();
  app.add_flag("--dpu", dpu, "delayed parameter update (needs --offload)");
  app.add_option("--offload-ratio", offload_ratio, "offload_optimizer.ratio: the share of the optimizer state "
                 "offloaded (needs --offload); the rest stays on the device, stepped there")->capture_default_str();
  app.add_option("--precision", precision, "bf16, fp16 or fp32")->capture_default_str();
  app.add_option("--optimizer", optimizer, "AdamW, Adam, Muon (two moments), Adagrad or Lion (one)")->capture_default_str();
  app.add_flag("--gpu", on_gpu, "the model on a GPU: with --offload, host gradients as they come down "
               "(training precision) and the update written over them");
  app.add_option("--accumulation", accumulation, "gradient_accumulation_steps: with --gpu --offload, the device keeps "
                 "the window's fp32 gradient sum (4 bytes per parameter of the rank's partition)")
      ->capture_default_str();
  auto* micro_opt = app.add_option("--micro", micro, "micro-batch per rank (activations)")->capture_default_str();
  auto* seq_opt = app.add_option("--seq", seq, "sequence length (default: the model's context)");
  app.add_flag("--checkpoint-activations", checkpoint, "activations with per-block checkpointing (as zero-train's)");
  app.add_flag("--cpu-checkpointing", cpu_checkpoint,
               "checkpoints kept on the host (activation_checkpointing.cpu_checkpointing; implies "
               "--checkpoint-activations)");
  app.add_option("--bucket", bucket, "reduce_bucket_size in elements (0: a bucket per parameter; at stage 3 with "
                 "prefetch, at most --prefetch)")->capture_default_str();
  app.add_option("--device-mem", device_mem_text, "device memory per rank (80GB = 80*10^9 B, 80GiB = 80*2^30 B); "
                 "lists what fits");
  app.add_option("--host-mem", host_mem_text, "host memory per rank (e.g. 256GiB); what fits counts --runtime-mem "
                 "too");
  app.add_option("--runtime-mem", runtime_mem_text, "host memory each process holds beside the engine's buffers "
                 "(LibTorch, MPI: about 0.5 GiB measured on the CPU; a GPU's CUDA runtime adds more), counted "
                 "against --host-mem; 0 leaves it out")->capture_default_str();
  app.footer("Exit status: 0, or 3 when --device-mem/--host-mem leave nothing that fits; 1 for an error, 2 for a "
             "usage error. docs/train.md, \"zero-estimate\".");
  app.add_flag("--json", json, "also print one JSON object (bytes per configuration) as the last line");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (tools::say_near_options("zero-estimate", app, e)) return 2;
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a usage error: 2
  }
  try {
    // A config: its settings where the flags are not given (given flags win).
    if (!config_path.empty()) {
      // A Hugging Face config's "auto" batch takes --micro, else zero-train's
      // own micro-batch, as zero-train fills it: the estimate is of the run
      // zero-train would make. Its scheduler's "auto"s are filled too but do
      // not matter here.
      train::TrainerSettings settings;
      settings.steps = 1;
      settings.warmup_given = true;
      settings.micro_batch =
          micro_opt->count() ? micro : config::parse_config(train::kDefaultConfig, 1).train_micro_batch_size_per_gpu;
      if (micro_opt->count()) settings.micro_from = "--micro";
      settings.accumulation_from = "as zero-train fills it";
      const train::FilledAutos autos = train::fill_trainer_autos(config::read_config_text(config_path), settings);
      const config::Config c = autos.filled.empty() ? config::load_config(config_path, world)
                                                    : config::parse_config(autos.text, world, config_path);
      bool scheduler_filled = false;
      std::vector<std::string> stand_ins;  // "'scheduler.params.total_num_steps'", as warnings quote keys
      for (const std::string& f : autos.filled) {
        if (f.rfind("scheduler.", 0) == 0) {
          scheduler_filled = true;
          stand_ins.push_back("'" + f.substr(0, f.find(' ')) + "'");
          continue;
        }
        std::printf("config %s: \"auto\" filled: %s\n", config_path.c_str(), f.c_str());
      }
      if (scheduler_filled) {
        std::printf("config %s: the scheduler's \"auto\" values do not change the memory: filled with stand-ins "
                    "(1 step), and the schedule is not checked here (zero-train fills them from --steps and "
                    "--warmup)\n", config_path.c_str());
      }
      for (const std::string& w : c.warnings) {
        // (What the stand-ins make of the schedule is no concern of the
        // user's; a warning on a key the user wrote still is.)
        const bool of_stand_in = std::any_of(stand_ins.begin(), stand_ins.end(),
                                             [&](const std::string& k) { return w.find(k) != std::string::npos; });
        if (of_stand_in) continue;
        std::fprintf(stderr, "config warning: %s\n", w.c_str());
      }
      auto unless = [&](const char* flag) { return app.get_option(flag)->count() == 0; };
      const auto& z = c.zero_optimization;
      const auto& oo = z.offload_optimizer;
      const auto& op = z.offload_param;
      if (unless("--stage")) stage_text = std::to_string(z.stage);
      // The stage the estimate is for (a --stage given wins): the config's
      // keys of other stages are left out, as the engine leaves them.
      const bool stage_flag_ok = stage_text.find_first_not_of("0123456789") == std::string::npos &&
                                 !stage_text.empty() && stage_text.size() <= 2;
      const int at = stage_flag_ok ? std::stoi(stage_text) : z.stage;
      if (unless("--offload")) offload = oo.device != "none" && at != 0;
      // (--offload given is offload_optimizer.device "cpu": over a config's
      // "nvme" too, as every flag given overrides the config.)
      if (unless("--nvme")) nvme = oo.device == "nvme" && at != 0 && unless("--offload");
      if (unless("--offload-param")) offload_param = op.device != "none" && at == 3;
      if (unless("--param-nvme")) param_nvme = op.device == "nvme" && at == 3 && unless("--offload-param");
      if (unless("--buffer-count") && nvme) nvme_buffers = oo.buffer_count;
      if (unless("--sub-group-size") && nvme) sub_group = z.sub_group_size;
      if (unless("--param-buffer-count") && param_nvme) param_buffers = op.buffer_count;
      if (unless("--dpu")) dpu = oo.delayed_param_update && offload;
      if (unless("--offload-ratio") && offload) offload_ratio = oo.ratio;
      if (unless("--precision")) precision = c.fp16.enabled ? "fp16" : c.bf16.enabled ? "bf16" : "fp32";
      if (unless("--optimizer")) optimizer = c.optimizer.type;
      optimizer_kind.ns_method = c.optimizer.ns_method;  // (Muon's work)
      if (unless("--micro") && app.get_option("--params")->count() == 0) micro = c.train_micro_batch_size_per_gpu;
      if (unless("--bucket")) bucket = z.reduce_bucket_size;
      if (unless("--accumulation") && c.gradient_accumulation_steps > 0) {
        accumulation = static_cast<int>(c.gradient_accumulation_steps);
      }
      if (at == 3 && unless("--prefetch")) prefetch = z.stage3_prefetch_bucket_size;
      if (at == 3 && unless("--persistence-threshold")) persistence = z.stage3_param_persistence_threshold;
      // (Activations are a GPT's: not estimated for --params.)
      if (unless("--cpu-checkpointing") && app.get_option("--params")->count() == 0) {
        cpu_checkpoint = c.activation_checkpointing.cpu_checkpointing;
      }
      if (unless("--device-mem") && c.device_memory_limit > 0) device_mem_text = std::to_string(c.device_memory_limit);
      std::printf("config %s: stage %d%s%s%s, %s, %s, micro-batch %lld, accumulation %d, reduce_bucket_size %lld%s\n",
                  config_path.c_str(), z.stage, oo.device != "none" ? (", offload_optimizer " + oo.device).c_str() : "",
                  oo.delayed_param_update ? " with the delayed update" : "",
                  op.device != "none" ? (", offload_param " + op.device).c_str() : "", precision.c_str(),
                  optimizer.c_str(), static_cast<long long>(c.train_micro_batch_size_per_gpu),
                  accumulation, static_cast<long long>(z.reduce_bucket_size), " (flags given override it)");
      // A --stage where the config's offload cannot be: left out, and said.
      const bool drops_optimizer = oo.device != "none" && at == 0 && unless("--offload");
      const bool drops_param = op.device != "none" && at != 3 && unless("--offload-param");
      if (stage_flag_ok && (drops_optimizer || drops_param)) {
        const bool both = drops_optimizer && drops_param;
        const char* what = both ? "offload_optimizer and offload_param are"
                           : drops_optimizer ? "offload_optimizer is" : "offload_param is";
        const char* why = both ? "only at stages 1-3 (parameters: 3)"
                          : drops_optimizer ? "only at stages 1-3" : "parameters only at stage 3";
        std::printf("(--stage %d: the config's %s left out, as the engine offloads %s)\n", at, what, why);
      }
    }
    // Flags first, each error naming the fix: a usage error (exit 2).
    models::GptConfig gpt;  // (with --model)
    try {
      if (!stage_text.empty()) {
        ZERO_CHECK(stage_text.find_first_not_of("0123456789") == std::string::npos && stage_text.size() <= 2,
                   "--stage '", stage_text, "' is not a ZeRO stage: use 0, 1, 2 or 3, or leave --stage out to list "
                   "all");
        stage = std::stoi(stage_text);
        ZERO_CHECK(stage <= 3, "--stage ", stage, " does not exist: ZeRO stages are 0, 1, 2 and 3");
      }
      ZERO_CHECK(param_buffers >= 2 && param_buffers <= 64, "--param-buffer-count must be in [2, 64], got ",
                 param_buffers);
      ZERO_CHECK(param_nvme || param_buffers == 5, "--param-buffer-count is the parameters' NVMe tier's: it needs "
                 "--param-nvme");
      ZERO_CHECK(!param_nvme || stage < 0 || stage == 3, "--param-nvme needs --stage 3 (parameter offload "
                 "partitions the parameters), got --stage ", stage);
      if (param_nvme) offload_param = offload = true;
      ZERO_CHECK(!offload_param || stage < 0 || stage == 3, "--offload-param needs --stage 3 (parameter offload "
                 "partitions the parameters), got --stage ", stage);
      ZERO_CHECK(prefetch >= 0 && persistence >= 0, "--prefetch and --persistence-threshold must be >= 0");
      ZERO_CHECK(!nvme || offload_ratio == 1.0, "--nvme offloads the whole optimizer state: drop --offload-ratio");
      ZERO_CHECK(nvme_buffers >= 2 && nvme_buffers <= 64, "--buffer-count must be in [2, 64], got ", nvme_buffers);
      ZERO_CHECK(sub_group >= 1, "--sub-group-size must be >= 1, got ", sub_group);
      ZERO_CHECK(nvme || (nvme_buffers == 4 && sub_group == 1000000000),
                 "--buffer-count and --sub-group-size are the NVMe tier's: they need --nvme");
      if (nvme) offload = true;
      ZERO_CHECK(!(offload && stage == 0), "--stage 0 --", nvme ? "nvme" : "offload", ": the engine refuses "
                 "offload_optimizer.device=\"", nvme ? "nvme" : "cpu", "\" at stage 0 (ZeRO-Offload offloads the "
                 "rank's optimizer partition): use --stage 1, 2 or 3");
      ZERO_CHECK(!dpu || offload, "--dpu (delayed parameter update) needs --offload: the delayed step is the CPU "
                 "optimizer's");
      ZERO_CHECK(offload_ratio >= 0.0 && offload_ratio <= 1.0, "--offload-ratio must be in [0, 1], got ",
                 offload_ratio);
      ZERO_CHECK(offload_ratio == 1.0 || offload, "--offload-ratio is the offloaded share of the optimizer state: "
                 "it needs --offload");
      ZERO_CHECK(bucket >= 0, "--bucket (reduce_bucket_size) must be 0 or more, got ", bucket);
      ZERO_CHECK(micro >= 1, "--micro must be at least 1, got ", micro);
      ZERO_CHECK(accumulation >= 1, "--accumulation (gradient_accumulation_steps) must be at least 1, got ",
                 accumulation);
      ZERO_CHECK(seq >= 0 && (seq > 0 || !seq_opt->count()), "--seq must be positive, got ", seq);
      ZERO_CHECK(stage < 0 || stage == 3 || (prefetch == 50'000'000 && persistence == 100'000),
                 "--prefetch and --persistence-threshold are stage 3's (stage3_prefetch_bucket_size, "
                 "stage3_param_persistence_threshold): they need --stage 3 or no --stage");
      const bool shape_given = layer_opt->count() || head_opt->count() || embd_opt->count() || block_opt->count();
      if (!params_text.empty()) {
        ZERO_CHECK(!model_opt->count() && !shape_given, "--params and --model/--n-layer/... both give the model: "
                   "use one (--params for a bare parameter count, --model with overrides for a GPT)");
        ZERO_CHECK(!micro_opt->count() && !seq_opt->count() && !checkpoint && !cpu_checkpoint,
                   "--micro, --seq and --checkpoint-activations estimate a GPT's activations, which --params "
                   "alone does not describe: give --model (and --n-layer, --n-embd, ...) instead");
      }
      ZERO_CHECK(precision == "bf16" || precision == "fp16" || precision == "fp32",
                 "--precision must be bf16, fp16 or fp32, got '", precision, "'");
      optimizer_kind.type = optimizer;
      ZERO_CHECK(optimizer_kind.is_adam() || optimizer_kind.is_adagrad() || optimizer_kind.is_lion() ||
                     optimizer_kind.is_muon(),
                 "--optimizer must be AdamW, Adam, Adagrad, Lion or Muon, got '", optimizer, "'");
      // (As the engine refuses them: Muon's step reads its state whole, in one place.)
      ZERO_CHECK(!optimizer_kind.is_muon() || (!nvme && offload_ratio == 1.0), "optimizer Muon with ",
                 nvme ? "--nvme (offload_optimizer.device \"nvme\")" : "--offload-ratio below 1",
                 " is not available: zerocpp's Muon keeps its state in host or device memory, in one place");
      if (!params_text.empty()) parse_count(params_text);
      if (!frozen_text.empty()) parse_count(frozen_text, "--frozen-params", /*zero_ok=*/true);
      if (!device_mem_text.empty()) parse_bytes("--device-mem", device_mem_text);
      if (!host_mem_text.empty()) parse_bytes("--host-mem", host_mem_text);
      runtime_bytes(runtime_mem_text);
      if (params_text.empty()) {
        // The GPT: its preset, and the overrides given (given means given:
        // 0 is not "the preset's", as zero-train refuses it too).
        gpt = models::gpt_preset(model);
        if (layer_opt->count()) gpt.n_layer = n_layer;
        if (head_opt->count()) gpt.n_head = n_head;
        if (embd_opt->count()) gpt.n_embd = n_embd;
        if (block_opt->count()) gpt.block_size = block_size;
        ZERO_CHECK(gpt.n_layer > 0 && gpt.n_head > 0 && gpt.n_embd > 0 && gpt.block_size > 0 &&
                       gpt.n_embd % gpt.n_head == 0,
                   "the model's shape must be positive with --n-embd a multiple of --n-head: n_layer ", gpt.n_layer,
                   ", n_head ", gpt.n_head, ", n_embd ", gpt.n_embd, ", block_size ", gpt.block_size);
        ZERO_CHECK(seq <= gpt.block_size, "--seq ", seq, " is longer than the model's block_size ", gpt.block_size,
                   ": use --seq <= ", gpt.block_size, " or --block-size ", seq);
        // The byte totals are 64-bit: a shape past 1000T parameters, or
        // activations past an exabyte, is refused as --params is.
        const long double e = gpt.n_embd, l = gpt.n_layer, v = gpt.vocab_size, b = gpt.block_size;
        const long double psi = 12.0L * l * e * e + (v + b) * e;
        ZERO_CHECK(psi <= 1e15L, "the model's shape (n_layer ", gpt.n_layer, ", n_embd ", gpt.n_embd, ", block_size ",
                   gpt.block_size, ") is about ", static_cast<double>(psi), " parameters, more than 1000T (10^15), the "
                   "most zero-estimate counts (its byte totals would overflow)");
        const long double s_len = seq > 0 ? seq : b;
        const long double activations =
            static_cast<long double>(micro) * s_len * (l * (34.0L * e + 5.0L * gpt.n_head * s_len) * 4.0L + 8.0L * v);
        ZERO_CHECK(activations <= 1e18L, "--micro ", micro, " x --seq ", static_cast<long long>(s_len),
                   " with this shape needs about ", static_cast<double>(activations), " bytes of activations, more "
                   "than zero-estimate counts (an exabyte): give a smaller --micro, --seq or model");
      }
    } catch (const zero::Error& e) {
      std::fprintf(stderr, "zero-estimate: error: %s\n", e.what());
      return 2;
    }
    EstimateInput in;
    in.world = world;
    in.bucket_numel = static_cast<std::int64_t>(bucket_numel_from_config(bucket));
    in.element_bytes = precision == "fp32" ? 4 : 2;
    in.moments = optimizer_kind.moments();
    in.on_gpu = on_gpu;
    in.accumulation = accumulation;
    in.prefetch_elements = prefetch;
    in.persistence_threshold = persistence;
    if (!frozen_text.empty()) in.frozen_params = parse_count(frozen_text, "--frozen-params", /*zero_ok=*/true);
    if (!params_text.empty()) {
      in.params = parse_count(params_text);
    } else {
      const models::GptConfig& g = gpt;
      in.params = g.num_parameters();
      in.param_numels = g.parameter_numels();
      in.param_units = g.parameter_units();
      in.micro_batch = micro;
      in.seq_len = seq > 0 ? seq : g.block_size;
      in.n_layer = g.n_layer;
      in.n_embd = g.n_embd;
      in.n_head = g.n_head;
      in.vocab = g.vocab_size;
      in.checkpoint_activations = checkpoint || cpu_checkpoint;
      in.cpu_checkpointing = cpu_checkpoint;
      if (optimizer_kind.is_muon()) {
        // zero-train's choice: every matrix but the token and position
        // tables (the first two), which Adam steps.
        in.muon_gram = optimizer_kind.ns_method != "standard";
        const auto shapes = g.parameter_shapes();
        for (std::size_t i = 2; i < shapes.size(); ++i) {
          if (shapes[i].size() >= 2) in.muon.push_back(muon_matrix(static_cast<int>(i), shapes[i]));
        }
      }
    }
    const std::int64_t device_mem = device_mem_text.empty() ? 0 : parse_bytes("--device-mem", device_mem_text);
    const std::int64_t host_mem = host_mem_text.empty() ? 0 : parse_bytes("--host-mem", host_mem_text);
    const std::int64_t runtime_mem = runtime_bytes(runtime_mem_text);
    std::printf("%s: %s parameters%s, %d rank(s), %s%s%s\n", params_text.empty() ? model.c_str() : "model",
                format_count(in.params).c_str(),
                in.frozen_params ? (" + " + format_count(in.frozen_params) + " frozen").c_str() : "", world,
                precision.c_str(),
                in.micro_batch ? (", activations of micro-batch " + std::to_string(micro) + " x " + std::to_string(in.seq_len)).c_str() : "",
                in.checkpoint_activations ? (in.cpu_checkpointing ? ", checkpointed on the host" : ", checkpointed") : "");
    if (params_text.empty() == false && (stage < 0 || stage == 3)) {
      std::printf("(stage 3 with --params: the model is taken as one unit, gathered whole in forward and "
                  "backward; give --model for a GPT's per-block units)\n");
    }
    std::printf("%-40s %12s %12s %12s %12s %12s %12s | %12s %12s%s\n", "configuration", "dev states", "dev padding",
                "dev buckets", "dev units", "dev activ.", "dev total", "host states", "host total",
                nvme || param_nvme ? " |         nvme" : "");
    struct Row { int stage; bool offload; MemoryEstimate e; bool fits; bool device_fits; bool host_fits; };
    std::vector<Row> rows;
    // Best first: the least communication and host work that fits.
    // --offload lists only offloaded configurations; --stage only that stage.
    // --offload-param: stage 3 only, its partition on the host.
    const std::vector<std::pair<int, bool>> order = {{0, false}, {1, false}, {2, false}, {3, false},
                                                     {1, true},  {2, true},  {3, true}};
    const auto listed = [&](int s, bool off, bool params_off) {
      if (stage >= 0 && s != stage) return false;
      if (offload != off && (stage >= 0 || offload)) return false;
      return !(params_off && s != 3);
    };
    const auto configure = [&](EstimateInput& x, int s, bool off, bool params_off) {
      x.stage = s;
      x.offload = off;
      x.dpu = off && dpu;
      x.offload_ratio = off ? offload_ratio : 1.0;
      x.offload_param = params_off && s == 3;
      x.nvme = off && nvme;
      x.nvme_buffers = nvme_buffers;
      x.sub_group_elements = sub_group;
      x.param_nvme = param_nvme && x.offload_param;
      x.param_nvme_buffers = param_buffers;
    };
    // On the CPU (no --gpu) the "device" is host memory too: both columns
    // come out of --host-mem. Each process's runtime (--runtime-mem) beside it.
    const auto host_need_of = [&](const MemoryEstimate& e) {
      return (on_gpu ? e.host_total() : e.host_total() + e.device_total()) + runtime_mem;
    };
    const Limits limits{device_mem, host_mem, host_need_of};
    for (auto [s, off] : order) {
      if (!listed(s, off, offload_param)) continue;
      configure(in, s, off, offload_param);
      MemoryEstimate e = estimate_memory(in);
      const bool device_fits = limits.device_fits(e), host_fits = limits.host_fits(e);
      rows.push_back({s, off, e, device_fits && host_fits, device_fits, host_fits});
      std::printf("%-40s %12s %12s %12s %12s %12s %12s | %12s %12s%s%s\n",
                  (describe_config(s, off, in.offload_param) +
                   (in.nvme && in.param_nvme ? " (all nvme)" : in.nvme ? " (nvme)" : in.param_nvme ? " (params nvme)" : ""))
                      .c_str(),
                  memory::format_bytes(e.device_model_states()).c_str(), memory::format_bytes(e.device_padding).c_str(),
                  memory::format_bytes(e.device_buckets).c_str(), memory::format_bytes(e.device_gathered).c_str(),
                  memory::format_bytes(e.device_activations).c_str(), memory::format_bytes(e.device_total()).c_str(),
                  memory::format_bytes(e.host_model_states()).c_str(), memory::format_bytes(e.host_total()).c_str(),
                  nvme || param_nvme ? (" | " + std::string(12 - std::min<std::size_t>(12, memory::format_bytes(e.nvme_total()).size()), ' ') +
                          memory::format_bytes(e.nvme_total())).c_str() : "",
                  (device_mem || host_mem) ? (rows.back().fits ? "  fits" : "  does not fit") : "");
    }
    for (const Row& r : rows) {
      if (r.e.nvme_total() == 0) continue;
      const bool state = r.e.nvme_master > 0, params = r.e.nvme_params > 0;
      std::printf("(a checkpoint save or load of an NVMe run streams %s between the swap file%s and the checkpoint's "
                  "files through %s of host memory per rank, not in host total",
                  state && params ? "the optimizer state and the parameters" : state ? "the optimizer state" : "the parameters",
                  state && params ? "s" : "",
                  memory::format_bytes(static_cast<std::int64_t>(ckpt::kIoBlock * (ckpt::kIoRing + 2))).c_str());
      if (params && !state) {
        std::printf("; an asynchronous save reads the parameters into host memory instead (so that training does not "
                    "wait for them): about %s more per rank until they are written",
                    memory::format_bytes(r.e.nvme_params).c_str());
      }
      std::printf(")\n");
      break;
    }
    for (const Row& r : rows) {
      if (r.e.device_workspace == 0) continue;
      std::printf("(Muon's step holds up to %s per rank on the device after backward, for its whole matrices and "
                  "Newton-Schulz products: dev total counts it where it is larger than backward's buckets and "
                  "activations)\n", memory::format_bytes(r.e.device_workspace).c_str());
      break;
    }
    if (optimizer_kind.is_muon() && !params_text.empty()) {
      std::printf("(Muon's step work is not counted with --params: give --model for the matrices' shapes)\n");
    }
    if (in.frozen_params > 0 && !rows.empty()) {
      // Whole on every rank at stages 0-2; stage 3 partitions them with the units.
      for (const Row& r : rows) {
        if (r.stage == 3) continue;
        std::printf("(dev total includes %s per rank for the %s frozen parameters: whole on every rank at stages "
                    "0-2)\n", memory::format_bytes(r.e.device_frozen).c_str(), format_count(in.frozen_params).c_str());
        break;
      }
      for (const Row& r : rows) {
        if (r.stage != 3) continue;
        const bool host = r.e.host_frozen > 0;
        std::printf("(stage 3 partitions the %s frozen parameters with the units: %s per rank in %s memory, each "
                    "unit's share gathered with it)\n", format_count(in.frozen_params).c_str(),
                    memory::format_bytes(host ? r.e.host_frozen : r.e.device_frozen).c_str(),
                    host ? "host" : "device");
        break;
      }
    }
    for (const Row& r : rows) {
      if (r.e.device_staging == 0) continue;
      std::printf("(dev total includes %s per rank of staging for the device share's update: offload_optimizer.ratio "
                  "%.2f keeps %.0f%% of the optimizer state on the device)\n",
                  memory::format_bytes(r.e.device_staging).c_str(), offload_ratio, 100.0 * (1.0 - offload_ratio));
      break;
    }
    for (const Row& r : rows) {
      if (!on_gpu || !r.offload || accumulation <= 1 || r.e.device_grads == 0) continue;
      std::printf("(with gradient_accumulation_steps %d on a GPU, dev states includes %s per rank for the window's "
                  "fp32 gradient sum, 4 bytes per element of the rank's partition, and the host gradients come down "
                  "as that sum in fp32)\n",
                  accumulation, memory::format_bytes(r.e.device_grads).c_str());
      break;
    }
    bool nothing_fits = false;
    if (host_mem && runtime_mem) {
      std::printf("(fits: host total%s plus %s of each process's own runtime, LibTorch and MPI (--runtime-mem), "
                  "within --host-mem)\n", on_gpu ? "" : " and dev total", memory::format_bytes(runtime_mem).c_str());
    }
    if (device_mem || host_mem) {
      const Row* best = nullptr;
      for (const Row& r : rows) if (r.fits && !best) best = &r;
      if (best) {
        const bool params_off = offload_param && best->stage == 3;
        std::printf("best fit: %s (zero_optimization.stage=%d%s%s)\n",
                    describe_config(best->stage, best->offload, params_off).c_str(), best->stage,
                    best->offload ? (nvme ? ", offload_optimizer.device=\"nvme\"" : ", offload_optimizer.device=\"cpu\"") : "",
                    params_off ? (param_nvme ? ", offload_param.device=\"nvme\"" : ", offload_param.device=\"cpu\"") : "");
      } else {
        // Which limit stops every row: the advice for that one.
        bool any_device = false, any_host = false;
        for (const Row& r : rows) {
          any_device = any_device || r.device_fits;
          any_host = any_host || r.host_fits;
        }
        std::vector<Candidate> candidates;
        for (const Row& r : rows) candidates.push_back({r.stage, r.offload, offload_param && r.stage == 3});
        const std::string fix = fixes_that_fit(
            in, candidates, on_gpu, limits,
            [&](EstimateInput& x, const Candidate& c) { configure(x, c.stage, c.offload, c.params_off); });
        if (!any_host && runtime_mem >= host_mem) {
          std::printf("nothing fits: --host-mem is no more than each process's own runtime (--runtime-mem %s), "
                      "before any of the engine's buffers; give the host memory per rank, or your runtime's size\n",
                      memory::format_bytes(runtime_mem).c_str());
        } else if (!any_device && !any_host) {
          std::printf("nothing fits: no configuration fits --device-mem nor --host-mem; %s\n", fix.c_str());
        } else if (!any_device) {
          std::printf("nothing fits: no configuration fits --device-mem (dev total); %s\n", fix.c_str());
        } else if (!any_host) {
          std::printf("nothing fits: no configuration fits --host-mem (host total%s%s); %s\n",
                      runtime_mem ? " and --runtime-mem" : "",
                      on_gpu ? "" : "; on the CPU the device columns are host memory too", fix.c_str());
        } else {
          std::printf("nothing fits: the configurations that fit --device-mem need more than --host-mem, and "
                      "those that fit --host-mem more than --device-mem; %s\n", fix.c_str());
        }
        nothing_fits = true;
      }
    }
    // The JSON last, as --help says (a script reads the last line).
    if (json) {
      std::printf("{\"params\":%lld,\"world\":%d,\"runtime_mem\":%lld,\"configs\":[", (long long)in.params, world,
                  (long long)runtime_mem);
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const MemoryEstimate& e = rows[i].e;
        std::printf("%s{\"stage\":%d,\"offload\":%s,\"device_model_states\":%lld,\"host_model_states\":%lld,"
                    "\"device_buckets\":%lld,\"device_gathered\":%lld,\"device_padding\":%lld,\"device_staging\":%lld,"
                    "\"device_workspace\":%lld,\"device_frozen\":%lld,\"host_frozen\":%lld,"
                    "\"device_activations\":%lld,\"host_activations\":%lld,"
                    "\"device_total\":%lld,\"host_total\":%lld,\"nvme_total\":%lld,\"fits\":%s}",
                    i ? "," : "", rows[i].stage, rows[i].offload ? "true" : "false",
                    (long long)e.device_model_states(), (long long)e.host_model_states(), (long long)e.device_buckets,
                    (long long)e.device_gathered,
                    (long long)e.device_padding, (long long)e.device_staging, (long long)e.device_workspace,
                    (long long)e.device_frozen, (long long)e.host_frozen,
                    (long long)e.device_activations, (long long)e.host_activations,
                    (long long)e.device_total(),
                    (long long)e.host_total(), (long long)e.nvme_total(), rows[i].fits ? "true" : "false");
      }
      std::printf("]}\n");
    }
    if (nothing_fits) return 3;  // (documented: 2 is a usage error)
  } catch (const zero::Error& e) {
    std::fprintf(stderr, "zero-estimate: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-estimate: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
