// zero-bench fit-plain: the largest GPT a plain LibTorch training loop fits on
// one device, and its speed; issue 6's baseline (a) for bench/gpu.
//
//   zero-bench fit-plain --device cuda --sizes gpt2,gpt2-medium,gpt2-xl,32x2560 [--json]
//   zero-bench fit-plain --device cpu --sizes gpt2-tiny --steps 2      (smoke test)
//
// First a bf16 square-matmul sweep on the device (--matmul): the MFU ceiling,
// measured in the same run. Then, for each size in order, the plain loop: the
// zero::models GPT built on the device with fp32 parameters,
// torch::optim::AdamW (fp32 moments), and --dtype bf16 = LibTorch's autocast
// to bf16 around forward and loss (what PyTorch AMP does: fp32 master params,
// bf16 matmuls; backward outside the autocast region), --dtype fp32 = no
// autocast. bf16 parameters with an fp32 optimizer are not what a plain
// LibTorch user writes, so they are not measured here. The first size that
// runs out of memory ends the sweep; the sizes after it are reported as not
// tried, and the one before it is the largest that fits.
//
// A size is a preset (gpt2-tiny ... gpt2-xl, zero::models::gpt_preset) or
// LxD[xH] for a custom GPT: L layers, width D, H heads (default D/128 when D
// is a multiple of 128, else D/64), context max(1024, --seq), vocabulary 256.
// The sequence is min(--seq, the model's context). FLOPs per token are
// GptConfig::flops_per_token, as zero-train and zero-bench step count them.
//
// --optimizer torch is torch::optim::AdamW (what the C++ API offers: one
// parameter at a time, several kernels each); --optimizer fused is ATen's
// multi-tensor fused AdamW (at::_fused_adamw_, what Python's
// torch.optim.AdamW(fused=True) calls), so the C++ and Python loops can be
// compared kernel for kernel (bench/plain_pytorch.py); --optimizer zero is
// zerocpp's own fused device Adam (zero::cuda::fused_adam_device, the
// engine's GPU step), in CUDA builds; --optimizer engine trains through
// zero::Engine instead (ZeRO --stage, default 0, on a single-process
// communicator; --dtype bf16 = the engine's bf16 parameters with fp32
// masters, no autocast; --offload cpu [--dpu] offloads the optimizer, the
// delayed update starting after one step; --offload-param, with --stage 3,
// the parameter partition; the engine's GPT is built on the meta device
// and filled by the engine on the device, as zero-train does): what
// a zerocpp user runs, compared with the plain loops. --checkpoint turns on
// the model's per-block activation checkpointing. --breakdown times forward,
// backward and the optimizer apart (a device sync after each); --profile N
// runs one step under LibTorch's Kineto profiler and prints the N device
// kernels with the most time, as bench/plain_pytorch.py --profile does.
//
// Peak memory is the caching allocator's peak of allocated bytes
// (at::accelerator::getDeviceStats, reset before each size), on CUDA only;
// on the CPU it is n/a. No CUDA header is included: CUDA is checked at run
// time (torch::cuda::is_available()), so this builds against any LibTorch.
#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_fused_adamw.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <fstream>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common/cli_range.h"
#include "zero/comm/communicator.h"
#include "zero/config/config.h"
#include "zero/core/error.h"
#include "zero/engine/engine.h"
#include "zero/models/autocast_scope.h"
#include "zero/models/gpt.h"
#include "zero/optim/adam.h"
#if ZERO_BENCH_WITH_CUDA
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "zero/cuda/device_adam.h"
#endif

namespace zero::bench {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct FitOptions {
  std::string device = "cpu";
  std::string dtype = "bf16";
  std::string sizes = "gpt2-tiny,gpt2-small-test";
  std::string matmul = "256,512";
  std::string optimizer = "torch";
  int stage = 0;                 // --optimizer engine
  std::string offload = "none";  // --optimizer engine: none or cpu
  bool dpu = false;
  bool publish_in_backward = false;  // --optimizer engine --dpu: offload_optimizer.publish_in_backward
  bool offload_param = false;  // --optimizer engine --stage 3: offload_param.device "cpu"
  double offload_ratio = 1.0;  // --optimizer engine --offload cpu: offload_optimizer.ratio
  int cpu_threads = 0;     // --optimizer engine --offload cpu: offload_optimizer.cpu_threads (0: the engine's choice)
  std::int64_t prefetch = -1;  // --optimizer engine --stage 3: stage3_prefetch_bucket_size (-1: the config's default)
  std::string timeline;    // --optimizer engine: write PREFIX-SIZE.json, the engine's timeline of 2 steps
  std::int64_t micro = 4, seq = 1024;
  int steps = 3, warmup = 1;
  int profile = 0;
  bool checkpoint = false;
  bool breakdown = false;
  bool json = false;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// A preset name, or LxD[xH] (see the file comment).
models::GptConfig parse_size(const std::string& spec, std::int64_t seq) {
  const auto& names = models::gpt_preset_names();
  if (std::find(names.begin(), names.end(), spec) != names.end()) return models::gpt_preset(spec);
  const std::vector<std::string> parts = split(spec, 'x');
  std::vector<std::int64_t> v;
  try {
    for (const auto& p : parts) {
      std::size_t used = 0;
      v.push_back(std::stoll(p, &used));
      ZERO_CHECK(used == p.size(), "bad number '", p, "'");
    }
  } catch (const std::exception&) {
    v.clear();
  }
  if (v.size() != 2 && v.size() != 3) {
    models::gpt_preset(spec);  // throws, listing the presets
  }
  ZERO_CHECK(v.size() == 2 || v.size() == 3, "bad size '", spec, "': a preset or LAYERSxWIDTH[xHEADS]");
  models::GptConfig c;
  c.n_layer = v[0];
  c.n_embd = v[1];
  c.n_head = v.size() == 3 ? v[2] : (v[1] % 128 == 0 ? v[1] / 128 : v[1] / 64);
  c.block_size = std::max<std::int64_t>(1024, seq);
  ZERO_CHECK(c.n_layer > 0 && c.n_embd > 0 && c.n_head > 0 && c.n_embd % c.n_head == 0, "bad size '", spec,
             "': layers, width and heads must be positive and the width a multiple of the heads");
  return c;
}

// Out of memory on the device (c10::OutOfMemoryError, or a library's
// allocation failure reported as a c10::Error) or on the host.
bool is_oom(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return true;
  if (dynamic_cast<const c10::Error*>(&e) == nullptr) return false;
  const std::string m = e.what();
  return m.find("out of memory") != std::string::npos || m.find("CUBLAS_STATUS_ALLOC_FAILED") != std::string::npos ||
         m.find("not enough memory") != std::string::npos || m.find("can't allocate memory") != std::string::npos;
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

struct Dev {
  at::Device device{at::kCPU};
  bool cuda = false;
  void sync() const {
    if (cuda) torch::cuda::synchronize(device.index());
  }
  void reset_peak() const {
    if (cuda) at::accelerator::resetPeakStats(device.index());
  }
  std::optional<std::int64_t> peak_bytes() const {
    if (!cuda) return std::nullopt;
    // StatType 0 = AGGREGATE.
    return at::accelerator::getDeviceStats(device.index()).allocated_bytes[0].peak;
  }
  void empty_cache() const {
    if (cuda) at::accelerator::emptyCache();
  }
};

struct MatmulResult {
  std::int64_t n = 0;
  double tflops = 0;
};

// Square bf16 matmul C = A B on the device: best of 3 repetitions, each at
// least ~0.2 s of back-to-back matmuls, 2 n^3 FLOPs each.
MatmulResult time_matmul(const Dev& d, std::int64_t n) {
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(d.device);
  at::Tensor a = at::randn({n, n}, opts), b = at::randn({n, n}, opts), c = at::empty({n, n}, opts);
  at::mm_out(c, a, b);
  d.sync();
  int iters = 1;
  for (;;) {  // grow the count until one repetition takes >= 0.2 s
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) at::mm_out(c, a, b);
    d.sync();
    if (std::chrono::duration<double>(Clock::now() - t0).count() >= 0.2 || iters >= (1 << 16)) break;
    iters *= 2;
  }
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) at::mm_out(c, a, b);
    d.sync();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) * iters;
  return {n, flops / best / 1e12};
}

struct SizeResult {
  std::string size;
  models::GptConfig config;
  std::int64_t seq = 0;
  std::string status;  // "ok", "oom", "not tried"
  std::string error;
  double step_s = 0, tokens_per_s = 0, tflops = 0;
  std::optional<std::int64_t> peak_bytes;
  double host_peak_rss_gib = 0;  // the process's peak RSS so far (getrusage)
  std::optional<std::array<double, 3>> breakdown_ms;  // forward, backward, optimizer
  Json kernels;                                       // --profile
};

// AdamW(lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0.1) over the
// model's parameters: torch::optim::AdamW, or ATen's fused multi-tensor
// kernel with the state Python's torch.optim.AdamW(fused=True) keeps.
class PlainAdamW {
 public:
  PlainAdamW(std::vector<at::Tensor> params, const std::string& kind)
      : params_(std::move(params)), zero_(kind == "zero") {
    if (kind == "torch") {
      torch_ = std::make_unique<torch::optim::AdamW>(params_, torch::optim::AdamWOptions(kLr).weight_decay(kWd));
      return;
    }
    for (const auto& p : params_) {
      exp_avg_.push_back(at::zeros_like(p));
      exp_avg_sq_.push_back(at::zeros_like(p));
      steps_.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
    }
  }
  void step() {
    if (torch_) return torch_->step(), void();
    if (zero_) return zero_step();
    std::vector<at::Tensor> grads;
    grads.reserve(params_.size());
    for (const auto& p : params_) grads.push_back(p.grad());
    at::_foreach_add_(steps_, 1);
    at::_fused_adamw_(params_, grads, exp_avg_, exp_avg_sq_, {}, steps_, kLr, 0.9, 0.999, kWd, 1e-8,
                      /*amsgrad=*/false, /*maximize=*/false);
  }
  void zero_grad() {
    if (torch_) return torch_->zero_grad(), void();
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
  }

 private:
  // zerocpp's own fused device Adam (zero::cuda::fused_adam_device), one
  // launch per parameter on the current stream: the kernel the engine's
  // stage 0-3 step runs on a GPU.
  void zero_step() {
#if ZERO_BENCH_WITH_CUDA
    ++step_;
    optim::AdamHyper h;
    h.lr = static_cast<float>(kLr);
    h.weight_decay = static_cast<float>(kWd);
    h.step = step_;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const at::Tensor& p = params_[i];
      const at::Tensor& g = p.grad();
      void* stream = c10::impl::getDeviceGuardImpl(p.device().type())->getStream(p.device()).native_handle();
      cuda::fused_adam_device(h, p.data_ptr<float>(), g.data_ptr(), DType::kFloat32, exp_avg_[i].data_ptr<float>(),
                              exp_avg_sq_[i].data_ptr<float>(), static_cast<std::size_t>(p.numel()), 1.0f, nullptr,
                              DType::kFloat32, stream);
    }
#else
    ZERO_CHECK(false, "--optimizer zero needs zero-bench built with CUDA (ZERO_WITH_CUDA)");
#endif
  }

  static constexpr double kLr = 1e-4, kWd = 0.1;
  std::vector<at::Tensor> params_, exp_avg_, exp_avg_sq_, steps_;
  std::unique_ptr<torch::optim::AdamW> torch_;
  bool zero_ = false;
  std::int64_t step_ = 0;
};

// The device kernels of a profiled region: name, calls, total ms; most time first.
Json kernel_table(const torch::autograd::profiler::ProfilerResult& result, int top) {
  std::map<std::string, std::pair<std::int64_t, double>> rows;
  double total = 0;
  for (const auto& e : result.events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    auto& r = rows[e.name()];
    r.first += 1;
    r.second += static_cast<double>(e.durationNs()) / 1e6;
    total += static_cast<double>(e.durationNs()) / 1e6;
  }
  std::vector<std::pair<std::string, std::pair<std::int64_t, double>>> v(rows.begin(), rows.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  Json list = Json::array();
  for (std::size_t i = 0; i < v.size() && static_cast<int>(i) < top; ++i) {
    list.push_back({{"name", v[i].first}, {"calls", v[i].second.first}, {"ms", v[i].second.second}});
  }
  return Json{{"total_ms", total}, {"top", list}};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void train_size(const FitOptions& o, const Dev& d, SizeResult& r) {
  const bool bf16 = o.dtype == "bf16";
  d.reset_peak();
  torch::manual_seed(0);
  const bool use_engine = o.optimizer == "engine";
  // The plain loops: built on the host (the constructor initialises there),
  // then moved. The engine: built on meta and filled on the device bucket by
  // bucket (EngineOptions), so that no full fp32 copy ever lands there.
  auto model = std::make_shared<models::Gpt>(r.config, /*on_meta=*/use_engine);
  if (!use_engine) model->to(d.device);
  model->set_activation_checkpointing(o.checkpoint);
  std::unique_ptr<comm::Communicator> single;
  std::unique_ptr<Engine> engine;
  std::optional<PlainAdamW> opt;
  if (use_engine) {
    // The plain loops' AdamW hyperparameters, no clipping; one process.
    Json c = {{"train_micro_batch_size_per_gpu", o.micro},
              {"gradient_clipping", 0},  // (a parsed config's default is DeepSpeed's 1.0)
              {"bf16", {{"enabled", bf16}}},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}, {"betas", {0.9, 0.999}}, {"eps", 1e-8},
                                                             {"weight_decay", 0.1}}}}},
              {"zero_optimization", {{"stage", o.stage},
                                     {"offload_optimizer", {{"device", o.offload}, {"delayed_param_update", o.dpu},
                                                            {"delayed_param_update_warmup_steps", 1},
                                                            {"cpu_threads", o.cpu_threads},
                                                            {"ratio", o.offload_ratio}}}}},
              {"steps_per_print", 1000000}};
    if (o.offload_param) c["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
    // Said either way, so that the loop's name says what ran.
    if (o.dpu) c["zero_optimization"]["offload_optimizer"]["publish_in_backward"] = o.publish_in_backward;
    if (o.prefetch >= 0) c["zero_optimization"]["stage3_prefetch_bucket_size"] = o.prefetch;
    single = comm::make_single_process_communicator();
    EngineOptions build;
    build.device = d.device;
    build.init = [gpt = model.get()](const std::string& name, const at::Tensor& value) {
      gpt->init_parameter(name, value);
    };
    engine = std::make_unique<Engine>(model, config::parse_config(c.dump(), 1, "<fit-plain engine config>"), *single,
                                      std::move(build));
  } else {
    opt.emplace(model->parameters(), o.optimizer);
  }
  auto batch = [&](int s) {
    torch::manual_seed(100 + s);
    return at::randint(r.config.vocab_size, {o.micro, r.seq + 1}, at::TensorOptions().dtype(at::kLong)).to(d.device);
  };
  // One step; with `phases`, a sync after forward and backward and the three times appended.
  auto step = [&](const at::Tensor& b, std::vector<std::array<double, 3>>* phases) {
    const auto t0 = Clock::now();
    if (opt) opt->zero_grad();
    at::Tensor loss;
    {
      // bf16 autocast around forward and loss, as Python's torch.autocast; backward outside it.
      // The engine's parameters are bf16 already: no autocast.
      models::AutocastScope autocast(d.device.type(), bf16 && !use_engine, at::kBFloat16);
      loss = model->loss(b.narrow(1, 0, r.seq), b.narrow(1, 1, r.seq));
    }
    if (phases) d.sync();
    const auto t1 = Clock::now();
    if (engine) {
      engine->backward(loss);
    } else {
      loss.backward();
    }
    if (phases) d.sync();
    const auto t2 = Clock::now();
    if (engine) {
      engine->step();
    } else {
      opt->step();
    }
    d.sync();
    const auto t3 = Clock::now();
    auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    if (phases) phases->push_back({ms(t0, t1), ms(t1, t2), ms(t2, t3)});
    return loss;
  };
  std::vector<double> times;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    at::Tensor b = batch(s);
    d.sync();
    const auto t0 = Clock::now();
    at::Tensor loss = step(b, nullptr);
    if (s >= o.warmup) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    ZERO_CHECK(std::isfinite(loss.item<double>()), "size ", r.size, ": loss is not finite at step ", s);
  }
  r.peak_bytes = d.peak_bytes();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  r.host_peak_rss_gib = static_cast<double>(ru.ru_maxrss) / (1 << 20);  // KiB -> GiB
  r.step_s = median(times);
  const double tokens = static_cast<double>(o.micro * r.seq);
  r.tokens_per_s = tokens / r.step_s;
  r.tflops = tokens * r.config.flops_per_token(r.seq) / r.step_s / 1e12;
  if (engine && !o.timeline.empty()) {
    // Two steps as they run in the timed loop, traced (the host-clock
    // step boundaries are marked too), written for bench/timeline_svg.py.
    engine->trace(true);
    const auto t0 = Clock::now();
    Json bounds = Json::array();
    for (int s = 0; s < 2; ++s) {
      at::Tensor b = batch(3000 + s);
      d.sync();
      const double begin = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      step(b, nullptr);
      bounds.push_back({begin, std::chrono::duration<double, std::milli>(Clock::now() - t0).count()});
    }
    Json iv = Json::array();
    for (const TimelineInterval& t : engine->take_timeline()) {
      iv.push_back({{"lane", t.lane}, {"what", t.what}, {"step", t.step}, {"start_ms", t.start_ms},
                    {"end_ms", t.end_ms}});
    }
    engine->trace(false);
    const std::string path = o.timeline + "-" + r.size + ".json";
    std::ofstream out(path);
    out << Json{{"size", r.size}, {"params", r.config.num_parameters()}, {"device", o.device},
                {"stage", o.stage}, {"offload", o.offload}, {"dpu", o.dpu}, {"offload_param", o.offload_param},
                {"offload_ratio", o.offload_ratio}, {"prefetch", o.prefetch},
                {"publish_in_backward", o.publish_in_backward},
                {"median_step_ms", r.step_s * 1e3},
                {"steps_ms", bounds}, {"intervals", iv}}
               .dump();
    ZERO_CHECK(out.good(), "could not write the timeline to ", path);
    std::printf("  %s: timeline of 2 steps (%zu intervals) in %s\n", r.size.c_str(), iv.size(), path.c_str());
  }
  if (o.breakdown) {
    std::vector<std::array<double, 3>> phases;
    for (int s = 0; s < o.steps; ++s) step(batch(1000 + s), &phases);
    std::array<double, 3> med{};
    for (int i = 0; i < 3; ++i) {
      std::vector<double> v;
      for (const auto& p : phases) v.push_back(p[i]);
      med[i] = median(v);
    }
    r.breakdown_ms = med;
    std::printf("  %s: forward %.1f ms, backward %.1f ms, optimizer %.1f ms\n", r.size.c_str(), med[0], med[1],
                med[2]);
  }
  if (o.profile > 0 && d.cuda) {
    namespace prof = torch::autograd::profiler;
    using torch::profiler::impl::ActivityType;
    const std::set<ActivityType> acts{ActivityType::CPU, ActivityType::CUDA};
    const torch::profiler::impl::ProfilerConfig cfg(torch::profiler::impl::ProfilerState::KINETO);
    prof::prepareProfiler(cfg, acts);
    prof::enableProfiler(cfg, acts);
    step(batch(2000), nullptr);
    r.kernels = kernel_table(*prof::disableProfiler(), o.profile);
    std::printf("  %s: device kernel time in one step %.1f ms; top %zu:\n", r.size.c_str(),
                r.kernels["total_ms"].get<double>(), r.kernels["top"].size());
    for (const auto& k : r.kernels["top"]) {
      std::printf("    %9.2f ms %6lld x  %.110s\n", k["ms"].get<double>(), (long long)k["calls"].get<std::int64_t>(),
                  k["name"].get<std::string>().c_str());
    }
  }
  if (engine) engine->flush();  // the delayed update of the last step
}

std::string fmt_bytes(const std::optional<std::int64_t>& b) {
  if (!b) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(*b) / (1 << 30));
  return buf;
}

Json size_json(const FitOptions& o, const SizeResult& r, double peak_tflops) {
  Json j;
  j["size"] = r.size;
  j["layers"] = r.config.n_layer;
  j["width"] = r.config.n_embd;
  j["heads"] = r.config.n_head;
  j["params"] = r.config.num_parameters();
  j["micro_batch"] = o.micro;
  j["seq"] = r.seq;
  j["status"] = r.status;
  if (!r.error.empty()) j["error"] = r.error;
  if (r.status == "ok") {
    j["step_ms"] = r.step_s * 1e3;
    j["tokens_per_s"] = r.tokens_per_s;
    j["tflops"] = r.tflops;
    j["mfu"] = peak_tflops > 0 ? Json(r.tflops / peak_tflops) : Json(nullptr);
    j["peak_mem_gib"] = r.peak_bytes ? Json(static_cast<double>(*r.peak_bytes) / (1 << 30)) : Json(nullptr);
    j["host_peak_rss_gib"] = r.host_peak_rss_gib;
    if (r.breakdown_ms) {
      j["breakdown_ms"] = {{"forward", (*r.breakdown_ms)[0]},
                           {"backward", (*r.breakdown_ms)[1]},
                           {"optimizer", (*r.breakdown_ms)[2]}};
    }
    if (!r.kernels.is_null()) j["kernels"] = r.kernels;
  }
  return j;
}

// The options, before anything runs (the callback makes a failure here a
// usage error, exit 2): each message names the option and the fix.
void check_options(const FitOptions& o) {
  ZERO_CHECK(o.device == "cpu" || o.device == "cuda", "--device must be cpu or cuda, not '", o.device, "'");
  ZERO_CHECK(o.offload == "none" || o.offload == "cpu", "--offload must be none or cpu, not '", o.offload,
             "' (fit-plain has no NVMe folder: zero-bench step --nvme-path times the NVMe tier)");
  for (const std::string& n : split(o.matmul, ',')) {
    ZERO_CHECK(n == "none" || (!n.empty() && n.size() <= 6 && n.find_first_not_of("0123456789") == std::string::npos &&
                               std::stoll(n) > 0),
               "--matmul: '", n, "' is not a positive matrix size (e.g. 4096,8192) or none");
  }
  if (!o.timeline.empty()) {
    const std::filesystem::path folder = std::filesystem::path(o.timeline).parent_path();
    std::error_code ec;
    ZERO_CHECK(folder.empty() || std::filesystem::is_directory(folder, ec), "--timeline ", o.timeline,
               ": the folder ", folder.string(), " does not exist (the files are PREFIX-SIZE.json there)");
  }
  ZERO_CHECK(o.dtype == "bf16" || o.dtype == "fp32", "--dtype must be bf16 or fp32, not '", o.dtype, "'");
  ZERO_CHECK(o.optimizer == "torch" || o.optimizer == "fused" || o.optimizer == "zero" || o.optimizer == "engine",
             "--optimizer must be torch, fused, zero or engine, not '", o.optimizer, "'");
  ZERO_CHECK(o.optimizer == "engine" ||
                 (o.stage == 0 && o.offload == "none" && !o.dpu && !o.offload_param && o.cpu_threads == 0 &&
                  o.timeline.empty()),
             "--stage, --offload, --dpu, --offload-param, --cpu-threads and --timeline configure --optimizer engine");
  ZERO_CHECK(!o.offload_param || o.stage == 3, "--offload-param offloads stage 3's parameter partition: add --stage 3");
  ZERO_CHECK(!o.publish_in_backward || (o.optimizer == "engine" && o.dpu && (o.stage == 1 || o.stage == 2)),
             "--publish-in-backward takes the delayed update in during backward: it needs --optimizer engine, "
             "--stage 1 or 2 and --dpu");
  ZERO_CHECK(o.prefetch == -1 || (o.prefetch >= 0 && o.stage == 3),
             "--prefetch is stage 3's stage3_prefetch_bucket_size in elements (0: off): it needs --stage 3 and a "
             "value of 0 or more");
  ZERO_CHECK(o.offload_ratio >= 0.0 && o.offload_ratio <= 1.0, "--offload-ratio must be in [0, 1], got ",
             o.offload_ratio);
  ZERO_CHECK(o.offload_ratio == 1.0 || (o.optimizer == "engine" && o.offload == "cpu"),
             "--offload-ratio is the offloaded share of the optimizer: it needs --optimizer engine --offload cpu");
  ZERO_CHECK(o.cpu_threads >= 0, "--cpu-threads must be 0 (the engine's choice) or positive");
  ZERO_CHECK(o.optimizer != "zero" || o.device == "cuda",
             "--optimizer zero is zerocpp's device Adam: it needs --device cuda");
  ZERO_CHECK(o.profile >= 0, "--profile must not be negative");
  ZERO_CHECK(o.micro > 0 && o.seq > 0 && o.steps > 0 && o.warmup >= 0,
             "--micro-batch, --seq and --steps must be positive, --warmup not negative");
  const std::vector<std::string> sizes = split(o.sizes, ',');
  ZERO_CHECK(!sizes.empty(), "--sizes is empty");
  for (const auto& s : sizes) parse_size(s, o.seq);
}

void run_fit_plain(const FitOptions& o) {
  Dev d;
  if (o.device == "cuda") {
    ZERO_CHECK(torch::cuda::is_available(), "--device cuda: this LibTorch sees no CUDA device (",
               static_cast<int>(torch::cuda::device_count()), " devices)");
    d.device = at::Device(at::kCUDA, 0);
    d.cuda = true;
    // The caching allocator exists once the device has been used: its peak
    // statistics cannot be reset before ("Invalid device argument").
    at::empty({1}, at::TensorOptions().device(d.device)).zero_();
    d.sync();
  }
  const std::vector<std::string> sizes = split(o.sizes, ',');
  std::vector<SizeResult> results;
  for (const auto& s : sizes) {
    SizeResult r;
    r.size = s;
    r.config = parse_size(s, o.seq);  // all parsed before anything runs
    r.seq = std::min(o.seq, r.config.block_size);
    r.status = "not tried";
    results.push_back(r);
  }
  // Smallest first whatever the order given: the sweep stops at the first
  // size out of memory, and the last that ran is the largest that fits.
  const auto fewer = [](const SizeResult& a, const SizeResult& b) {
    return a.config.num_parameters() < b.config.num_parameters();
  };
  if (!std::is_sorted(results.begin(), results.end(), fewer)) {
    std::stable_sort(results.begin(), results.end(), fewer);
    std::string order;
    for (const auto& r : results) order += (order.empty() ? "" : ",") + r.size;
    std::printf("zero-bench fit-plain: --sizes run smallest first: %s\n", order.c_str());
  }

  const std::string opt_name =
      o.optimizer == "torch"   ? "torch::optim::AdamW"
      : o.optimizer == "fused" ? "at::_fused_adamw_"
      : o.optimizer == "zero"  ? "zero::cuda::fused_adam_device"
                               : "zero::Engine stage " + std::to_string(o.stage) +
                                    (o.offload == "cpu" ? (o.dpu ? " + CPU offload + DPU" : " + CPU offload") : "") +
                                    (o.offload_param ? " + offload_param" : "") +
                                    (o.publish_in_backward ? " (published in backward)" : "") +
                                    (o.prefetch >= 0 ? " (prefetch " + std::to_string(o.prefetch) + ")" : "") +
                                    (o.offload_ratio < 1.0 ? " (ratio " + std::to_string(o.offload_ratio).substr(0, 4) + ")" : "");
  const char* precision = o.optimizer == "engine" ? (o.dtype == "bf16" ? ", bf16 params + fp32 masters" : ", fp32")
                                                  : (o.dtype == "bf16" ? ", fp32 params, bf16 autocast" : ", fp32");
  std::printf("zero-bench fit-plain: %s loop (%s%s%s) on %s, "
              "micro-batch %lld, %d timed steps (median) after %d warmup\n",
              o.optimizer == "engine" ? "zerocpp engine" : "plain LibTorch", opt_name.c_str(), precision,
              o.checkpoint ? ", activation checkpointing" : "", o.device.c_str(), (long long)o.micro, o.steps,
              o.warmup);

  // 1. The bf16 matmul ceiling.
  std::vector<MatmulResult> mm;
  double peak = 0;
  for (const auto& n : split(o.matmul, ',')) {
    if (n == "none") continue;
    mm.push_back(time_matmul(d, std::stoll(n)));
    peak = std::max(peak, mm.back().tflops);
    std::printf("bf16 matmul %lld^3: %.2f TFLOP/s\n", (long long)mm.back().n, mm.back().tflops);
    std::fflush(stdout);
  }

  Json mj = Json::array();
  for (const auto& m : mm) mj.push_back({{"n", m.n}, {"tflops", m.tflops}});
  const Json peak_json = peak > 0 ? Json(peak) : Json(nullptr);
  if (o.json) std::printf("%s\n", Json{{"matmul_bf16", mj}, {"matmul_peak_tflops", peak_json}}.dump().c_str());

  // 2. The sizes, smallest first, until one runs out of memory.
  std::string largest;
  for (auto& r : results) {
    try {
      train_size(o, d, r);
      r.status = "ok";
      largest = r.size;
    } catch (const std::exception& e) {
      if (!is_oom(e)) throw;
      r.status = "oom";
      r.error = first_line(e.what());
    }
    d.empty_cache();
    if (o.json) std::printf("%s\n", size_json(o, r, peak).dump().c_str());
    std::printf("  %-16s %s\n", r.size.c_str(), r.status.c_str());
    std::fflush(stdout);
    if (r.status == "oom") break;
  }

  std::printf("%-16s %9s %6s %9s %10s %10s %8s %6s %9s\n", "size", "params M", "seq", "status", "step ms",
              "tokens/s", "TFLOP/s", "MFU", "peak GiB");
  for (const auto& r : results) {
    if (r.status == "ok") {
      std::printf("%-16s %9.1f %6lld %9s %10.1f %10.0f %8.3f %6s %9s\n", r.size.c_str(),
                  r.config.num_parameters() / 1e6, (long long)r.seq, r.status.c_str(), r.step_s * 1e3,
                  r.tokens_per_s, r.tflops,
                  peak > 0 ? (std::to_string(static_cast<int>(100 * r.tflops / peak + 0.5)) + "%").c_str() : "-",
                  fmt_bytes(r.peak_bytes).c_str());
    } else {
      std::printf("%-16s %9.1f %6lld %9s\n", r.size.c_str(), r.config.num_parameters() / 1e6, (long long)r.seq,
                  r.status.c_str());
    }
  }
  std::printf("largest that fits: %s%s\n", largest.empty() ? "none" : largest.c_str(),
              results.back().status == "ok" ? " (every size asked fit: ask for larger ones)" : "");
  if (!o.json) return;
  Json j;
  j["bench"] = "fit-plain";
  j["device"] = o.device;
  j["dtype"] = o.dtype;
  j["optimizer"] = opt_name;
  j["checkpoint"] = o.checkpoint;
  j["precision"] = std::string(precision).substr(2);
  j["matmul_bf16"] = mj;
  j["matmul_peak_tflops"] = peak_json;
  Json sj = Json::array();
  for (const auto& r : results) sj.push_back(size_json(o, r, peak));
  j["sizes"] = sj;
  j["largest_fit"] = largest.empty() ? Json(nullptr) : Json(largest);
  j["command"] = command_line();
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace

void add_fit_plain_command(CLI::App& app) {
  auto o = std::make_shared<FitOptions>();
  CLI::App* cmd = app.add_subcommand(
      "fit-plain",
      "largest GPT a plain LibTorch loop (AdamW, bf16 autocast) trains on one device, its TFLOP/s and "
      "peak memory, against a bf16 matmul peak");
  cmd->add_option("--device", o->device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "bf16 (fp32 params + bf16 autocast) or fp32")->capture_default_str();
  cmd->add_option("--sizes", o->sizes, "comma-separated presets or LAYERSxWIDTH[xHEADS] (run smallest first)")
      ->capture_default_str();
  cmd->add_option("--matmul", o->matmul, "bf16 square matmul sizes for the peak, or none")->capture_default_str();
  cmd->add_option("--micro-batch", o->micro, "sequences per step")->capture_default_str();
  cmd->add_option("--seq", o->seq, "tokens per sequence (capped at each model's context)")->capture_default_str();
  cmd->add_option("--steps", o->steps, "timed steps per size")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed steps per size")->capture_default_str();
  cmd->add_option("--optimizer", o->optimizer,
                  "torch (torch::optim::AdamW), fused (at::_fused_adamw_, as Python's AdamW(fused=True)), zero "
                  "(zerocpp's device Adam, CUDA builds) or engine (zero::Engine; see --stage)")
      ->capture_default_str();
  cmd->add_option("--stage", o->stage, "--optimizer engine: ZeRO stage")
      ->check(tools::in_range<int>(0, 3))
      ->capture_default_str();
  cmd->add_option("--offload", o->offload, "--optimizer engine: none or cpu (offload_optimizer.device)")
      ->capture_default_str();
  cmd->add_flag("--dpu", o->dpu, "--optimizer engine with --offload cpu: the delayed parameter update");
  cmd->add_flag("--publish-in-backward", o->publish_in_backward,
                "--optimizer engine --dpu at stage 1 or 2: offload_optimizer.publish_in_backward, the update's "
                "pieces copied in as soon as backward has reduced their bucket (without it: false, the update "
                "after backward)");
  cmd->add_flag("--offload-param", o->offload_param,
                "--optimizer engine --stage 3: the parameter partition in (pinned) host memory (offload_param)");
  cmd->add_option("--prefetch", o->prefetch,
                  "--optimizer engine --stage 3: stage3_prefetch_bucket_size in elements, how far ahead the next "
                  "units are gathered (0: no prefetch; default: the config's, DeepSpeed's 5e7)");
  cmd->add_option("--offload-ratio", o->offload_ratio,
                  "--optimizer engine --offload cpu: offload_optimizer.ratio, the share of the optimizer state on "
                  "the CPU; the rest is stepped on the device (Twin-Flow)")
      ->capture_default_str();
  cmd->add_option("--cpu-threads", o->cpu_threads,
                  "--optimizer engine --offload cpu: CPU Adam threads (0: the engine's choice, all cores but one "
                  "on a GPU)")
      ->capture_default_str();
  cmd->add_option("--timeline", o->timeline,
                  "--optimizer engine: trace 2 more steps per size into PREFIX-SIZE.json (bench/timeline_svg.py "
                  "draws it)");
  cmd->add_flag("--checkpoint", o->checkpoint, "per-block activation checkpointing");
  cmd->add_flag("--breakdown", o->breakdown, "time forward, backward and the optimizer apart (extra steps)");
  cmd->add_option("--profile", o->profile, "print the N device kernels with the most time in one step (CUDA)")
      ->capture_default_str();
  cmd->add_flag("--json", o->json,
                "print JSON lines as results come (the matmul peak, then each size) and one object of all "
                "as the last line");
  cmd->callback([o] {
    require_one_process("fit-plain");
    try {
      check_options(*o);
    } catch (const Error& e) {
      throw CLI::ValidationError(e.what());
    }
    run_fit_plain(*o);
  });
}

}  // namespace zero::bench
