// zero-bench step: time of one training step of a GPT-style model, the plain
// LibTorch loop against zerocpp's stages, on the ranks it is launched with.
//
//   mpirun -np 2 --bind-to none build/bin/zero-bench step [--layers 8 --embd 512 ...] [--json]
//
// Variants (same model, same data, same number of steps):
//   plain     torch::optim::AdamW; gradients all-reduced as one flat fp32
//             buffer after backward (data parallelism without overlap)
//   stage0    zerocpp stage 0 (bucketed all-reduce overlapping backward)
//   stage1, stage2, stage2+offload, stage2+offload+dpu
// The first --warmup steps of each variant are not timed; the median of the
// rest is reported, with the ratio to plain and to stage0.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ops/cat.h>
#include <ATen/ops/randint.h>
#include <CLI/CLI.hpp>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include "zero/comm/communicator.h"
#include "zero/engine/engine.h"
#include "commands.h"
#include "zero/models/gpt.h"

namespace zero::bench {
namespace {

struct StepOptions {
  std::int64_t layers = 8, embd = 512, heads = 8, seq = 128, micro = 2;
  int steps = 6, warmup = 2;
  bool json = false;
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

double time_plain(const StepOptions& o, comm::Communicator& comm) {
  auto model = make_gpt(o);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4));
  std::vector<double> times;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    at::Tensor b = batch(o, s, comm.rank());
    comm.barrier()->wait();
    const auto t0 = Clock::now();
    opt.zero_grad();
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
    opt.step();
    if (s >= o.warmup) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(times);
}

double time_engine(const StepOptions& o, comm::Communicator& comm, int stage, bool offload, bool dpu,
                   std::string* summary) {
  auto model = make_gpt(o);
  config::Config cfg;
  cfg.train_micro_batch_size_per_gpu = o.micro;
  cfg.gradient_accumulation_steps = 1;
  cfg.train_batch_size = o.micro * comm.world_size();
  cfg.optimizer.lr = 1e-4f;
  cfg.zero_optimization.stage = stage;
  cfg.zero_optimization.reduce_bucket_size = 5'000'000;
  cfg.zero_optimization.offload_optimizer.device = offload ? "cpu" : "none";
  cfg.zero_optimization.offload_optimizer.delayed_param_update = dpu;
  cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = 1;
  cfg.zero_optimization.offload_optimizer.cpu_threads = 1;
  Engine engine(model, cfg, comm);
  std::vector<double> times;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    at::Tensor b = batch(o, s, comm.rank());
    comm.barrier()->wait();
    const auto t0 = Clock::now();
    engine.backward(model->loss(b.narrow(1, 0, o.seq), b.narrow(1, 1, o.seq)));
    engine.step();
    if (s >= o.warmup) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  engine.flush();
  *summary = engine.summary();
  return median(times);
}

}  // namespace

void run_step(const StepOptions& o);

void add_step_command(CLI::App& app) {
  auto o = std::make_shared<StepOptions>();
  CLI::App* cmd = app.add_subcommand(
      "step", "training step time of a GPT: plain LibTorch loop vs zerocpp stages (run under mpirun)");
  cmd->add_option("--layers", o->layers, "GPT layers")->capture_default_str();
  cmd->add_option("--embd", o->embd, "GPT width")->capture_default_str();
  cmd->add_option("--heads", o->heads, "attention heads")->capture_default_str();
  cmd->add_option("--seq", o->seq, "sequence length")->capture_default_str();
  cmd->add_option("--micro", o->micro, "micro-batch per rank")->capture_default_str();
  cmd->add_option("--steps", o->steps, "timed steps per variant")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed steps per variant")->capture_default_str();
  cmd->add_flag("--json", o->json, "print one JSON object as the last line");
  cmd->callback([o] { run_step(*o); });
}

void run_step(const StepOptions& o) {
  auto comm = comm::make_communicator();
  const bool root = comm->rank() == 0;
  models::GptConfig gc = make_gpt(o)->config();
  if (root) {
    std::printf("zero-bench step: GPT %lld layers x %lld wide, %.1fM parameters, micro-batch %lld x %lld tokens, "
                "%d rank(s), %d timed steps (median)\n",
                (long long)o.layers, (long long)o.embd, gc.num_parameters() / 1e6, (long long)o.micro,
                (long long)o.seq, comm->world_size(), o.steps);
  }
  struct Row {
    std::string name;
    double seconds;
  };
  std::vector<Row> rows;
  std::string summary;
  rows.push_back({"plain", time_plain(o, *comm)});
  rows.push_back({"stage0", time_engine(o, *comm, 0, false, false, &summary)});
  rows.push_back({"stage1", time_engine(o, *comm, 1, false, false, &summary)});
  rows.push_back({"stage2", time_engine(o, *comm, 2, false, false, &summary)});
  rows.push_back({"stage2+offload", time_engine(o, *comm, 2, true, false, &summary)});
  rows.push_back({"stage2+offload+dpu", time_engine(o, *comm, 2, true, true, &summary)});
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
  std::printf("(step-time ratios: below 1 is faster)\n%s", summary.c_str());
  if (o.json) {
    std::printf("{\"params\":%lld,\"world\":%d", (long long)gc.num_parameters(), comm->world_size());
    for (const Row& r : rows) std::printf(",\"%s_ms\":%.3f", r.name.c_str(), r.seconds * 1e3);
    std::printf("}\n");
  }
}

}  // namespace zero::bench
