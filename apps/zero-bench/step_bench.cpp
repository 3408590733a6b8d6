// zero-bench step: time of one training step of a GPT-style model, the plain
// LibTorch loop against zerocpp's stages, on the ranks it is launched with.
//
//   mpirun -np 2 --bind-to none build/bin/zero-bench step [--layers 8 --embd 512 ...] [--json]
//
// Variants (same model, same data, same number of steps):
//   plain     torch::optim::AdamW; gradients all-reduced as one flat fp32
//             buffer after backward (data parallelism without overlap)
//   stage0    zerocpp stage 0 (bucketed all-reduce overlapping backward)
//   stage1, stage2, stage3 (prefetch one unit ahead), stage3-noprefetch,
//   stage2+offload, stage2+offload+dpu
//   stage2+nvme, stage2+nvme+dpu (with --nvme-path: the optimizer state in
//             a swap file there, offload_optimizer.device "nvme")
//   stage3+params-host+dpu, stage3+params-nvme+dpu (with --nvme-path: stage
//             3 with CPU offload and DPU, the parameter partition in host
//             memory or in a swap file there, offload_param.device "nvme")
// Every variant is built first (its own model and engine), then the variants
// run interleaved, one step each per round, so that a change of machine load
// during the run hits them alike. The first --warmup rounds are not timed;
// the median of the rest is reported, with the ratio to plain and to stage0.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ops/cat.h>
#include <ATen/ops/randint.h>
#include <CLI/CLI.hpp>
#include <torch/optim/adamw.h>
#include <torch/utils.h>
#include <nlohmann/json.hpp>

#include "zero/comm/communicator.h"
#include "zero/engine/engine.h"

#include "commands.h"
#include "common/cli_range.h"
#include "job.h"
#include "zero/models/gpt.h"

namespace zero::bench {
namespace {

struct StepOptions {
  std::int64_t layers = 8, embd = 512, heads = 8, seq = 128, micro = 2;
  int steps = 10, warmup = 2;
  int cpu_threads = 1;  // CPU Adam threads per rank (offload variants)
  std::string nvme_path;  // the NVMe variants' folder ("" = no NVMe variants)
  bool json = false;
  bool summaries = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

using Clock = std::chrono::steady_clock;

std::shared_ptr<models::Gpt> make_gpt(const StepOptions& o) {
  torch::manual_seed(0);
  models::GptConfig c;
  c.n_layer = o.layers;
  c.n_embd = o.embd;
  c.n_head = o.heads;
  c.block_size = o.seq;
  return std::make_shared<models::Gpt>(c);
}

at::Tensor batch(const StepOptions& o, int step, int rank) {
  torch::manual_seed(100 + step * 64 + rank);
  return at::randint(256, {o.micro, o.seq + 1});
}

// One variant: step(s) runs training step s (untimed setup included, only
// the step itself timed by the caller).
struct Variant {
  std::string name;
  std::function<void(int)> step;
  std::function<std::string()> summary;  // engine variants: the engine's summary
  std::vector<double> times;
};

Variant make_plain(const StepOptions& o, comm::Communicator& comm) {
  auto model = make_gpt(o);
  auto opt = std::make_shared<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-4));
  Variant v;
  v.name = "plain";
  v.step = [model, opt, &o, &comm](int s) {
    at::Tensor b = batch(o, s, comm.rank());
    opt->zero_grad();
    model->loss(b.narrow(1, 0, o.seq), b.narrow(1, 1, o.seq)).backward();
    if (comm.world_size() > 1) {
      std::vector<at::Tensor> grads;
      for (auto& p : model->parameters()) grads.push_back(p.grad().reshape({-1}));
      at::Tensor flat = at::cat(grads);
      comm.all_reduce(flat.data_ptr(), static_cast<std::size_t>(flat.numel()), DType::kFloat32)->wait();
      flat.div_(comm.world_size());
      std::int64_t off = 0;
      for (auto& p : model->parameters()) {
        p.mutable_grad().copy_(flat.narrow(0, off, p.numel()).view_as(p));
        off += p.numel();
      }
    }
    opt->step();
  };
  return v;
}

// Each engine gets its own communicator (a duplicate of the world), so that
// the bytes its summary reports are its own, not the other variants'. The
// members are destroyed in reverse order: the engine before its communicator.
struct EngineRun {
  std::unique_ptr<comm::Communicator> comm;
  std::shared_ptr<models::Gpt> model;
  std::unique_ptr<Engine> engine;
};

// nvme: a folder for offload_optimizer.device "nvme" (offload must be set),
// or "" for the CPU offload. params: offload_param.device (stage 3);
// params_nvme: its folder for "nvme".
Variant make_engine(const StepOptions& o, const std::string& name, int stage, bool offload, bool dpu,
                    bool prefetch = true, const std::string& nvme = "", const std::string& params = "none",
                    const std::string& params_nvme = "") {
  auto run = std::make_shared<EngineRun>();
  run->comm = comm::make_communicator();
  run->model = make_gpt(o);
  const int world = run->comm->world_size();
  config::Config cfg;
  cfg.train_micro_batch_size_per_gpu = o.micro;
  cfg.gradient_accumulation_steps = 1;
  cfg.train_batch_size = o.micro * world;
  cfg.optimizer.lr = 1e-4f;
  cfg.zero_optimization.stage = stage;
  cfg.zero_optimization.reduce_bucket_size = 5'000'000;
  cfg.zero_optimization.offload_optimizer.device = !offload ? "none" : nvme.empty() ? "cpu" : "nvme";
  if (!nvme.empty()) {
    // A folder per variant: each engine's rank file is locked while it lives.
    ::mkdir(nvme.c_str(), 0700);  // (EEXIST from another rank is fine; a real failure the engine names)
    cfg.zero_optimization.offload_optimizer.nvme_path = nvme;
  }
  cfg.zero_optimization.offload_param.device = params;
  if (!params_nvme.empty()) {
    ::mkdir(params_nvme.c_str(), 0700);
    cfg.zero_optimization.offload_param.nvme_path = params_nvme;
  }
  cfg.zero_optimization.offload_optimizer.delayed_param_update = dpu;
  cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = 1;
  cfg.zero_optimization.offload_optimizer.cpu_threads = o.cpu_threads;
  // Stage 3: the blocks are the units; prefetch the next block's parameters
  // (about 12 embd^2 elements) while one computes, or nothing.
  cfg.zero_optimization.stage3_prefetch_bucket_size = prefetch ? 13 * o.embd * o.embd : 0;
  run->engine = std::make_unique<Engine>(run->model, cfg, *run->comm);
  Variant v;
  v.name = name;
  v.step = [run, &o](int s) {
    at::Tensor b = batch(o, s, run->comm->rank());
    run->engine->backward(run->model->loss(b.narrow(1, 0, o.seq), b.narrow(1, 1, o.seq)));
    run->engine->step();
  };
  v.summary = [run] {
    run->engine->flush();
    return run->engine->summary();
  };
  return v;
}

}  // namespace

void run_step_on(const StepOptions& o, comm::Communicator& job);

void add_step_command(CLI::App& app) {
  auto o = std::make_shared<StepOptions>();
  CLI::App* cmd = app.add_subcommand(
      "step", "training step time of a GPT: plain LibTorch loop vs zerocpp stages (run under mpirun)");
  // Ranges checked as the command line is read: a usage error (exit 2).
  cmd->add_option("--layers", o->layers, "GPT layers")->check(tools::at_least<long long>(1))->capture_default_str();
  cmd->add_option("--embd", o->embd, "GPT width")->check(tools::at_least<long long>(1))->capture_default_str();
  cmd->add_option("--heads", o->heads, "attention heads (dividing --embd)")->check(tools::at_least<long long>(1))
      ->capture_default_str();
  cmd->add_option("--seq", o->seq, "sequence length")->check(tools::at_least<long long>(1))->capture_default_str();
  cmd->add_option("--micro", o->micro, "micro-batch per rank")->check(tools::at_least<long long>(1))->capture_default_str();
  cmd->add_option("--steps", o->steps, "timed steps per variant")->check(tools::at_least<long long>(1))->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed steps per variant")->check(tools::at_least<long long>(0))
      ->capture_default_str();
  cmd->add_option("--cpu-threads", o->cpu_threads,
                  "CPU Adam threads per rank in the offload variants (0: all cores)")
      ->check(tools::at_least<long long>(0))
      ->capture_default_str();
  cmd->add_option("--nvme-path", o->nvme_path,
                  "also time stage 2 with the optimizer state on NVMe (offload_optimizer.device \"nvme\"), "
                  "without and with DPU, and stage 3 + offload + DPU with the parameter partition in host "
                  "memory and on NVMe (offload_param.device \"nvme\"), their swap files in subfolders of this "
                  "existing folder")
      ->check(CLI::ExistingDirectory);
  cmd->add_flag("--summaries", o->summaries, "print every engine variant's memory/comm summary");
  cmd->add_flag("--json", o->json, "print one JSON object as the last line");
  cmd->callback([o] {
    require_heads_divide(o->embd, o->heads);
    run_as_job("zero-bench step", [&](comm::Communicator& job) { run_step_on(*o, job); });
  });
}

void run_step_on(const StepOptions& o, comm::Communicator& job) {
  comm::Communicator* const comm = &job;
  const bool root = comm->rank() == 0;
  models::GptConfig gc = make_gpt(o)->config();
  if (root) {
    std::printf("zero-bench step: GPT %lld layers x %lld wide, %.1fM parameters, micro-batch %lld x %lld tokens, "
                "%d rank(s), %d timed steps (median)\n",
                (long long)o.layers, (long long)o.embd, gc.num_parameters() / 1e6, (long long)o.micro,
                (long long)o.seq, comm->world_size(), o.steps);
  }
  std::vector<Variant> vs;
  vs.push_back(make_plain(o, *comm));
  vs.push_back(make_engine(o, "stage0", 0, false, false));
  vs.push_back(make_engine(o, "stage1", 1, false, false));
  vs.push_back(make_engine(o, "stage2", 2, false, false));
  vs.push_back(make_engine(o, "stage3", 3, false, false));
  vs.push_back(make_engine(o, "stage3-noprefetch", 3, false, false, /*prefetch=*/false));
  vs.push_back(make_engine(o, "stage2+offload", 2, true, false));
  vs.push_back(make_engine(o, "stage2+offload+dpu", 2, true, true));
  if (!o.nvme_path.empty()) {
    vs.push_back(make_engine(o, "stage2+nvme", 2, true, false, true, o.nvme_path + "/stage2-nvme"));
    vs.push_back(make_engine(o, "stage2+nvme+dpu", 2, true, true, true, o.nvme_path + "/stage2-nvme-dpu"));
    vs.push_back(make_engine(o, "stage3+params-host+dpu", 3, true, true, true, "", "cpu"));
    vs.push_back(make_engine(o, "stage3+params-nvme+dpu", 3, true, true, true, "", "nvme",
                             o.nvme_path + "/stage3-params-nvme"));
  }
  for (int round = 0; round < o.warmup + o.steps; ++round) {
    for (Variant& v : vs) {
      comm->barrier()->wait();
      const auto t0 = Clock::now();
      v.step(round);
      // The step ends when every rank is done with it: a rank that finishes
      // early would otherwise time less than the step costs.
      comm->barrier()->wait();
      if (round >= o.warmup) v.times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  struct Row {
    std::string name;
    double seconds;
  };
  std::vector<Row> rows;
  std::vector<std::string> summaries;
  for (Variant& v : vs) {
    rows.push_back({v.name, median(v.times)});
    if (v.summary) summaries.push_back(v.name + ":\n" + v.summary());
  }
  if (!root) return;
  const double plain = rows[0].seconds, stage0 = rows[1].seconds;
  const double tokens = static_cast<double>(o.micro * o.seq * comm->world_size());
  std::printf("%-20s %10s %10s %9s %9s %10s\n", "variant", "step ms", "tokens/s", "vs plain", "vs stage0",
              "TFLOP/s");
  for (const Row& r : rows) {
    std::printf("%-20s %10.1f %10.0f %8.3fx %8.3fx %10.4f\n", r.name.c_str(), r.seconds * 1e3,
                tokens / r.seconds, r.seconds / plain, r.seconds / stage0,
                tokens * gc.flops_per_token(o.seq) / r.seconds / 1e12);
  }
  std::printf("(step-time ratios: below 1 is faster)\n");
  auto seconds = [&](const std::string& name) {
    for (const Row& r : rows) {
      if (r.name == name) return r.seconds;
    }
    return 0.0;
  };
  std::printf("stage3 / stage2: %.3fx; stage3 without prefetch / with: %.3fx\n", seconds("stage3") / seconds("stage2"),
              seconds("stage3-noprefetch") / seconds("stage3"));
  if (!o.nvme_path.empty()) {
    std::printf("stage 3 + offload + dpu, parameters on NVMe / in host memory: %.3fx\n",
                seconds("stage3+params-nvme+dpu") / seconds("stage3+params-host+dpu"));
  }
  if (o.summaries) {
    for (const std::string& sm : summaries) std::printf("%s", sm.c_str());
  } else if (!summaries.empty()) {
    std::printf("%s", summaries.back().c_str());  // the last variant's; --summaries prints each
  }
  if (o.json) {
    std::printf("{\"params\":%lld,\"world\":%d", (long long)gc.num_parameters(), comm->world_size());
    for (const Row& r : rows) std::printf(",\"%s_ms\":%.3f", r.name.c_str(), r.seconds * 1e3);
    std::printf(",\"command\":%s}\n", nlohmann::json(command_line()).dump().c_str());
  }
}

}  // namespace zero::bench
