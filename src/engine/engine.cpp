// zero::Engine: validation, wiring and the backward/step/flush sequence. The
// parts (src/engine/, private to zero_engine), each one concept:
//   device_context  where the tensors live; streams, events, pinned memory
//   precision       training dtype, loss scaling, the step's skip/clip decision
//   param_store     the flat parameters, construction, publish and gather
//   grad_path       hooks -> buckets -> reduced gradients, and their norm
//   optimizer_partition  master weights, moments, the CPU or device step
//   delayed_update  the DPU worker, its pending update and sticky error
//   step_timeline   the tracer behind Engine::trace()
//   module_guard    what the engine changed in the module, undone at the end
#include "zero/engine/engine.h"
#include "zero/core/log.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <sstream>
#include <thread>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function_hook.h>

#include "any_rank.h"
#include "dpu_advice.h"
#include "engine_impl.h"
#include "out_of_memory.h"
#include "rank_agreement.h"
#include "setup_agreement.h"
#include "released_use.h"
#include "param_hypers.h"
#include "zero/comm/comm_errors.h"
#include "zero/comm/launcher_env.h"
#include "zero/core/cpu_cores.h"
#include "zero/core/error.h"
#include "zero/core/host_memory.h"
#include "zero/core/text_list.h"
#include "zero/zero/memory_plan.h"

namespace zero {

using memory::Kind;
using memory::Tier;

namespace {

// Settings the config accepts (DeepSpeed's names) that this engine does not
// act on, each with what it does instead: said once, at construction.
std::vector<std::string> ignored_settings(const config::Config& c, bool on_gpu) {
  std::vector<std::string> w;
  const auto& z = c.zero_optimization;
  if (!z.reduce_scatter) {
    w.push_back("zero_optimization.reduce_scatter=false is ignored: zerocpp reduce-scatters the gradients at "
                "stage >= 1 (and all-reduces them at stage 0)");
  }
  if (!z.contiguous_gradients) {
    w.push_back("zero_optimization.contiguous_gradients=false is ignored: gradients always go to contiguous "
                "buckets");
  }
  // (Equal to reduce_bucket_size, as DeepSpeed's examples have it: what it asks is what happens.)
  if (z.allgather_bucket_size != config::ZeroOptimizationConfig{}.allgather_bucket_size &&
      z.allgather_bucket_size != z.reduce_bucket_size) {
    w.push_back("zero_optimization.allgather_bucket_size is ignored: the parameter all-gather uses the reduce "
                "buckets (reduce_bucket_size)");
  }
  if (z.offload_optimizer.device == "cpu" && on_gpu && !z.offload_optimizer.pin_memory) {
    w.push_back("zero_optimization.offload_optimizer.pin_memory=false is ignored: on a GPU the offload buffers "
                "are always pinned");
  }
  if (z.offload_optimizer.device == "cpu" && !on_gpu && z.offload_optimizer.pin_memory) {
    w.push_back("zero_optimization.offload_optimizer.pin_memory has no effect on the CPU: there is no device "
                "to copy to");
  }
  if (z.stage == 3 && z.offload_param.device != "none" && !on_gpu && z.offload_param.pin_memory) {
    w.push_back("zero_optimization.offload_param.pin_memory has no effect on the CPU: there is no device to copy to");
  }
  return w;
}

// The host memory the plan needs (with the model on the CPU its "device"
// buffers are host memory too), times the ranks on this node, against what
// the host has available: refused before anything is allocated, on every
// rank together (one rank short of memory fails them all), with the numbers
// and the fixes, instead of the kernel's OOM killer mid-run.
void check_host_memory(const MemoryPlan& plan, const config::Config& config, bool on_gpu, comm::Communicator& comm,
                       const c10::Device& device) {
  const std::int64_t per_rank = plan.peak(Tier::kHost) + (on_gpu ? 0 : plan.peak(Tier::kDevice));
  const int local = comm::launcher_local_size().value_or(1);
  const std::optional<std::int64_t> available = host_memory_available();
  const bool short_here = available && per_rank * local > *available;
  const int first_short = detail::first_rank(comm, device, short_here);
  if (first_short < 0) return;
  const bool says = comm.rank() == first_short;  // the others name it: one line for the job
  // The fixes that lower this need, as configured.
  const config::ZeroOptimizationConfig& z = config.zero_optimization;
  std::vector<std::string> fixes;
  if (local > 1) fixes.push_back("run fewer ranks per node");
  if (comm.world_size() > 1 && z.stage < 3) {
    fixes.push_back(z.stage == 2 ? "partition more (zero_optimization.stage 3)"
                                 : "partition more (zero_optimization.stage " + std::to_string(z.stage + 1) + " or 3)");
  }
  fixes.push_back(z.stage == 0 ? "spread the job over more nodes at a zero_optimization.stage of 1 or more"
                               : "spread the job over more nodes (each rank then holds a smaller partition)");
  if (z.stage >= 1 && z.offload_optimizer.device != "nvme" && !config.optimizer.is_muon()) {
    fixes.push_back("put the optimizer state on NVMe (offload_optimizer.device \"nvme\")");
  }
  if (z.offload_optimizer.delayed_param_update) fixes.push_back("turn off the delayed update (its second gradient buffer)");
  if (on_gpu && !config.bf16.enabled && !config.fp16.enabled) {
    fixes.push_back("train in bf16 (smaller host buffers on a GPU)");
  }
  ZERO_CHECK(!says, "host memory: the engine's buffers need ", memory::format_bytes(per_rank), " = ", per_rank,
             " bytes per rank (", local, " rank(s) on this node: ", memory::format_bytes(per_rank * local),
             ", before activations) but ", memory::format_bytes(*available), " is available (", host_memory_source(),
             "). To fit: ", detail::join_first(fixes, fixes.size(), "; "), ".");
  // The others: the job's one error line is that rank's (fail_job).
  throw comm::ForAnotherRank<Error>(
      detail::str_cat("host memory: rank ", first_short, " found its node's host memory too small for the engine's "
                      "buffers (its message says by how much); nothing was allocated"),
      first_short);
}

// ", offload cpu", with the device share when offload_optimizer.ratio < 1.
std::string offload_text(const MemoryPlan& plan) {
  const std::size_t part = plan.layout.partition_numel();
  if (plan[Buffer::kSwapBuffers].present) return ", offload nvme (optimizer state in a swap file)";
  if (plan.offload_split >= part) return ", offload cpu";
  char buf[160];
  std::snprintf(buf, sizeof buf, ", offload cpu (%.1f%% of the optimizer state; %zu elements per rank stepped on the device)",
                100.0 * static_cast<double>(plan.offload_split) / static_cast<double>(part), part - plan.offload_split);
  return buf;
}

// ", parameter partition in host memory" at stage 3 with offload_param.
std::string offload_param_text(const MemoryPlan& plan) {
  const PlannedBuffer& p = plan[Buffer::kParamPartition];
  if (p.present && p.tier == Tier::kNvme) return ", parameter partition in a swap file (offload_param nvme)";
  return p.present && p.tier == Tier::kHost ? ", parameter partition in host memory (offload_param)" : "";
}

// A LibTorch error's first line (the rest is its C++ stack).
std::string first_line(const char* what) {
  const std::string s(what);
  return s.substr(0, s.find('\n'));
}

}  // namespace

void Engine::Impl::run_optimizer(int buf, float grad_scale, const detail::StepRates& rates, std::int64_t step,
                                 const std::function<void(const Piece&)>& after_piece, Share share) {
  const bool main = share == Share::kMain;
  if (optimizer->pieces(share).empty()) return;
  if (main && offload && ctx.on_accelerator()) {
    // The CPU reads the gradients the copy stream brought down, and rewrites
    // the staging (or, in fp32, master) memory that the last upload read from.
    // (The device share's step is ordered on the device: the compute stream
    // waits for the last upload.)
    grads->wait_down(buf);
    if (!grads->update_in_grads()) params->wait_up();
  }
  auto grad_of = [&](const Piece& pc) { return grads->piece(*pc.bucket, pc.offset, pc.n, buf); };
  // Where the updated training-precision values go: the device share's
  // staging; over the gradients (GPU offload), the host staging buffer
  // (offload), or the rank's chunk of the flat parameters themselves.
  const std::size_t es = c10::elementSize(precision.dtype());
  auto half_of = [&](const Piece& pc, const at::Tensor& g) -> void* {
    if (!main) {
      return static_cast<char*>(optimizer->device_staging().data_ptr()) + (pc.at() - optimizer->split()) * es;
    }
    if (grads->update_in_grads()) return g.data_ptr();
    if (offload) return static_cast<char*>(optimizer->staging().data_ptr()) + pc.at() * es;
    return static_cast<char*>(params->rank_chunk(*pc.bucket).data_ptr()) + pc.offset * es;
  };
  if (!main) {
    detail::StepTimeline::on_stream(&timeline, ctx.current_stream(), "device step", "share", 0, [&] {
      optimizer->step(share, grad_of, half_of, grad_scale, rates, step, after_piece);
    });
    return;
  }
  Clock::time_point began = Clock::now();
  auto done = [&](const Impl::Piece& pc) {
    if (timeline.on()) {
      const Clock::time_point now = Clock::now();
      timeline.host_interval("cpu step", "piece " + std::to_string(pc.index), began, now, step - 1);
      began = now;
    }
    if (after_piece) after_piece(pc);
  };
  optimizer->step(share, grad_of, half_of, grad_scale, rates, step, done);
}

detail::ParamStore::UpdateSource Engine::Impl::update_source(int buf, Share share) const {
  const bool fp32 = precision.dtype() == at::kFloat;
  if (share == Share::kDevice) {
    return {fp32 ? optimizer->device_master() : optimizer->device_staging(), optimizer->split(), false};
  }
  at::Tensor values;
  if (grads->update_in_grads()) {
    values = grads->host(buf);
  } else if (fp32) {
    // (NVMe: the master weights are in the swap file; the step copies them.)
    values = optimizer->swapped() ? optimizer->staging() : optimizer->master();
  } else if (offload) {
    values = optimizer->staging();
  }
  return {values, 0, offload};
}

std::vector<at::Tensor> Engine::Impl::update_parts(int buf) const {
  if (precision.dtype() == at::kFloat) return {};
  const at::Tensor main = update_source(buf, Share::kMain).values;
  if (!main.defined()) return {};
  std::vector<at::Tensor> parts{main.narrow(0, 0, static_cast<std::int64_t>(optimizer->split()))};
  if (optimizer->has_device_share()) parts.push_back(optimizer->device_staging());
  return parts;
}

void Engine::Impl::publish_piece(const Piece& pc, int buf, const char* kind) {
  params->publish_piece(update_source(buf, pc.share), *pc.bucket, pc.offset, pc.n, kind, pc.index);
}

void Engine::Impl::apply_update(int buf, comm::Communicator& comm) {
  params->begin_publish(offload, ctx);
  for (const Piece& pc : optimizer->pieces(Share::kDevice)) publish_piece(pc, buf, "share");
  for (const Piece& pc : optimizer->pieces(Share::kMain)) publish_piece(pc, buf, "piece");
  params->end_publish(comm);
}

void Engine::Impl::publish_reduced_pieces() {
  const auto& pieces = optimizer->pieces(Share::kMain);
  const std::vector<Bucket>& buckets = optimizer->layout().buckets();  // (the pieces point into it)
  const std::size_t done = delayed->done();
  std::size_t k = published_early;
  while (k < pieces.size() && k < done &&
         bucket_reduced[static_cast<std::size_t>(pieces[k].bucket - buckets.data())] != 0) {
    ++k;
  }
  if (k == published_early) return;
  publish_after_current();  // after backward's last reads of these buckets
  for (std::size_t i = published_early; i < k; ++i) publish_piece(pieces[i], update_index, "piece");
  published_early = k;
}

void Engine::Impl::publish_after_current() {
  if (published_early > 0) {
    params->publish_after_current();
  } else {
    params->begin_publish(/*offloaded=*/true, ctx);
  }
}

void Engine::Impl::check_not_damaged(const char* what) const {
  ZERO_CHECK(damaged_by.empty(), "engine.", what, "() refused: the engine's state is partly overwritten by ", damaged_by,
             " (see its error); load a good checkpoint first");
}

double Engine::Impl::finish_delayed(comm::Communicator& comm) {
  const Clock::time_point began = Clock::now();
  // (A publish begun in backward, publish_in_backward, goes on from its
  // last piece, on the CPU too.)
  const bool early = delayed->pending() && offload && (ctx.copy_stream.has_value() || published_early > 0);
  if (early) {
    publish_after_current();  // (after the rest of backward)
    // The device share was stepped when the update was submitted.
    for (const Piece& pc : optimizer->pieces(Share::kDevice)) publish_piece(pc, update_index, "share");
    const auto& pieces = optimizer->pieces(Share::kMain);
    for (std::size_t i = published_early; i < pieces.size(); ++i) {
      if (!delayed->wait_for(pieces[i].index + 1)) break;  // the job failed: wait() says why
      publish_piece(pieces[i], update_index, "piece");
    }
  }
  published_early = 0;
  delayed->wait();  // rethrows the job's failure
  const Clock::time_point waited = Clock::now();
  if (delayed->enabled()) timeline.host_interval("host wait", "delayed update", began, waited);
  if (!delayed->pending()) return 0.0;
  if (early) {
    params->end_publish(comm);
  } else {
    apply_update(update_index, comm);
  }
  delayed->applied();
  return std::chrono::duration<double, std::milli>(waited - began).count();
}

Engine::Engine(std::shared_ptr<torch::nn::Module> module, config::Config config,
               comm::Communicator& comm, EngineOptions options)
    : config_(std::move(config)), comm_(comm), impl_(std::make_unique<Impl>(config_)) {
  Impl& m = *impl_;
  try {
    ZERO_CHECK(module != nullptr, "zero::Engine needs a module, got a null pointer");
    m.world = comm_.world_size();
    m.rank = comm_.rank();
    // The config's warnings (a misplaced key, a key ignored), as DeepSpeed
    // logs its own: a program that does not print them still shows them.
    // (A caller that printed them clears Config::warnings first.)
    if (m.rank == 0) {
      for (const std::string& w : config_.warnings) {
        detail::log_warning(log_topic::config, "config warning: %s", w.c_str());
      }
    }
    // The batch sizes must hold for the ranks there are (a config resolved
    // for another world size would report, and schedule on, a wrong global
    // batch); the config's own world_size then follows the communicator.
    ZERO_CHECK(config_.train_batch_size <= 0 ||
                   config_.train_batch_size == config_.train_micro_batch_size_per_gpu *
                                                   config_.gradient_accumulation_steps * m.world,
               "the config's batch sizes (", config_.batch_summary(), ") were resolved for ", config_.world_size,
               " rank(s) but the communicator has ", m.world,
               ": parse the config with the communicator's size, config::load_config(path, comm.world_size())");
    config_.world_size = m.world;
    // More CPU optimizer threads than this process may run on only contend
    // for its cores (and 10^5 of them exhaust its memory): at most that many.
    if (int& threads = config_.zero_optimization.offload_optimizer.cpu_threads, cores = usable_cores(); threads > cores) {
      if (m.rank == 0) {
        detail::log_warning(log_topic::config,
                            "config warning: offload_optimizer.cpu_threads %d is more than the %d cores this "
                            "process may run on (its CPU affinity): the CPU optimizer uses %d threads (0 chooses "
                            "for you: its share of them among the ranks on this node)", threads, cores, cores);
      }
      threads = cores;
    }
    // Failure handling (docs/reliability.md) applies to every op from here on,
    // the engine's own and the caller's on the same communicator.
    comm_.set_timeout(std::chrono::milliseconds(static_cast<std::int64_t>(config_.comm_timeout * 1000.0)));
    comm_.set_flight_recorder(static_cast<std::size_t>(config_.flight_recorder.entries), config_.flight_recorder.dir);
    const auto& z = config_.zero_optimization;
    m.stage = z.stage;
    ZERO_CHECK(m.stage >= 0 && m.stage <= 3, "zero_optimization.stage=", m.stage,
               " does not exist: ZeRO stages are 0, 1, 2 and 3");
    // (The JSON parser canonicalises the type; a config built in code gets
    // the spelling checked here.)
    const auto& opt = config_.optimizer;
    ZERO_CHECK(!opt.is_muon() || opt.ns_method == "gram" || opt.ns_method == "standard", "optimizer Muon: ns_method "
               "is \"", opt.ns_method, "\"; it is \"gram\" or \"standard\"");
    ZERO_CHECK(!opt.is_muon() || (opt.momentum >= 0.0f && opt.momentum < 1.0f), "optimizer Muon: momentum is ",
               opt.momentum, "; it is in [0, 1)");
    ZERO_CHECK(opt.is_adam() || opt.is_adagrad() || opt.is_lion() || opt.is_muon(), "optimizer.type=\"", opt.type,
               "\" is not an optimizer zerocpp has: set it to \"Adam\", \"AdamW\", \"Adagrad\", \"Lion\" or "
               "\"Muon\", spelt so (config::parse_config also takes other cases)");
    // "nvme" is an offload whose optimizer state lives in a swap file
    // (the CPU steps it all the same).
    const bool nvme = z.offload_optimizer.device == "nvme";
    m.offload = z.offload_optimizer.device == "cpu" || nvme;
    // "nvme" keeps the parameter partition in a swap file (ZeRO-Infinity).
    const bool param_nvme = m.stage == 3 && z.offload_param.device == "nvme";
    const bool offload_param = m.stage == 3 && (z.offload_param.device == "cpu" || param_nvme);
    ZERO_CHECK(!param_nvme || !z.offload_param.nvme_path.empty(), "offload_param.device=\"nvme\" needs "
               "offload_param.nvme_path: a folder on the NVMe drive for the parameters");
    ZERO_CHECK(!param_nvme || m.offload, "offload_param.device=\"nvme\" needs the optimizer on the CPU: set "
               "offload_optimizer.device to \"cpu\" or \"nvme\", or offload_param.device to \"cpu\"");
    ZERO_CHECK(!m.offload || m.stage >= 1, "offload_optimizer.device=\"", z.offload_optimizer.device,
               "\" needs zero_optimization.stage 1, 2 or 3 (ZeRO-Offload offloads the rank's optimizer partition)");
    ZERO_CHECK(!nvme || !z.offload_optimizer.nvme_path.empty(), "offload_optimizer.device=\"nvme\" needs "
               "offload_optimizer.nvme_path: a folder on the NVMe drive for the optimizer state");
    const bool dpu = m.offload && z.offload_optimizer.delayed_param_update;
    const c10::ScalarType dtype = m.precision.dtype();
    lr_ = config_.optimizer.lr;
    if (!config_.scheduler.type.empty()) m.schedule.emplace(config_.scheduler, config_.optimizer.lr);
    ledger_.set_device_limit(config_.device_memory_limit);

    m.params = std::make_unique<detail::ParamStore>(std::move(module), dtype, m.world, m.rank, options.device,
                                                    std::move(options.init));
    detail::ParamStore& P = *m.params;
    // Asked before anything is allocated: a rule's error leaves nothing to
    // undo (thrown below, once every rank has said whether its rules failed).
    detail::ParamHypers hypers;
    const std::string rule_error = detail::error_of([&] {
      ZERO_CHECK(!options.use_muon || opt.is_muon(), "EngineOptions::use_muon is given but the optimizer is ",
                 opt.type, ": it chooses Muon's matrices; set optimizer.type to \"Muon\", or leave use_muon out");
      hypers = detail::resolve_param_hypers(options.weight_decay, options.lr_scale,
                                            opt.is_muon() ? &options.use_muon : nullptr, P.names(), P.params(),
                                            config_.optimizer.weight_decay);
    });
    const c10::Device device = P.device();
    m.ctx.device = device;
    const std::string backend = comm_.backend_name();
    if (m.ctx.on_accelerator()) {
      // Refuse before allocating anything. Every collective runs on the flat
      // buffers, which live where the module is.
      ZERO_CHECK(device.is_cuda(), "the engine's device is ", device.str(),
                 " (EngineOptions::device, or where the module is): zero::Engine trains on the CPU or on a CUDA "
                 "GPU. Name one of them.");
      ZERO_CHECK(backend == "nccl" || (backend == "single" && m.world == 1), "the engine's device is ",
                 device.str(), " but the communicator is '", backend,
                 "', whose collectives work on host memory: give the engine an NCCL communicator "
                 "(zero::cuda::make_nccl_communicator(bootstrap, local_rank), as zero-train --device cuda "
                 "does), or for one process the single-process one.");
      if (m.offload) m.ctx.copy_stream = m.ctx.side_stream();
    } else {
      ZERO_CHECK(backend != "nccl", "the communicator is NCCL but the module is on the CPU: train it on its "
                 "GPU (zero::EngineOptions::device = torch::Device(torch::kCUDA, local_rank), or "
                 "module->to(that device) first), or use the MPI or single-process communicator "
                 "(zero::comm::make_communicator()).");
    }
    ZERO_CHECK(config_.gradient_accumulation_steps >= 1 &&
                   config_.gradient_accumulation_steps <= std::numeric_limits<std::int32_t>::max(),
               "gradient_accumulation_steps is ", config_.gradient_accumulation_steps,
               ": it must be between 1 and 2147483647");
    const int accumulation = static_cast<int>(config_.gradient_accumulation_steps);
    if (m.world > 1) {
      detail::agree_on_setup(comm_, m.ctx.device, config::to_json(config_), detail::parameter_lines(*P.module()));
      detail::agree_on_param_hypers(comm_, m.ctx.device, hypers, rule_error, P.numels());
    } else if (!rule_error.empty()) {
      throw Error(rule_error);
    }
    // Every buffer's size, tier and lifetime: the memory plan, which
    // zero-estimate sums too.
    ZERO_CHECK(z.reduce_bucket_size >= 0, "zero_optimization.reduce_bucket_size must be 0 or more, got ",
               z.reduce_bucket_size);
    PlanInput pi;
    pi.numels = P.numels();
    pi.bucket_numel = bucket_numel_from_config(z.reduce_bucket_size);
    pi.world = m.world;
    pi.rank = m.rank;
    pi.stage = m.stage;
    pi.offload = m.offload;
    pi.dpu = dpu;
    pi.offload_ratio = m.offload && !nvme ? z.offload_optimizer.ratio : 1.0;
    pi.nvme = nvme;
    pi.nvme_buffers = z.offload_optimizer.buffer_count;
    pi.sub_group_elements = static_cast<std::size_t>(std::max<std::int64_t>(z.sub_group_size, 1));
    pi.on_gpu = m.ctx.on_accelerator();
    pi.accumulation = accumulation;
    pi.element_bytes = static_cast<int>(c10::elementSize(dtype));
    pi.moments = config_.optimizer.moments();
    // Muon's matrices: whole on the compute device in its step.
    std::vector<detail::MuonStep::Matrix> muon_matrices;
    if (opt.is_muon()) {
      for (std::size_t i = 0; i < hypers.of_param.size(); ++i) {
        if (hypers.classes[static_cast<std::size_t>(hypers.of_param[i])].muon == 0) continue;
        muon_matrices.push_back({static_cast<int>(i), P.shape(i).vec()});
        pi.muon.push_back(muon_matrix(static_cast<int>(i), muon_matrices.back().shape));
      }
      pi.muon_window_bytes = detail::MuonStep::test_window_bytes();
      pi.muon_gram = opt.ns_method != "standard";
    }
    detail::UnitAssignment units;
    if (m.stage == 3) {
      units = detail::assign_units(*P.module(), P.params(), z.stage3_param_persistence_threshold);
      pi.groups = units.groups;
      // Frozen parameters of a unit are partitioned with it (a base model
      // under adapters); the rest stay whole on every rank.
      const std::vector<at::Tensor> frozen = P.frozen_candidates();
      P.select_frozen(frozen,
                      detail::assign_units(*P.module(), frozen, z.stage3_param_persistence_threshold).groups);
      pi.frozen_numels = P.frozen_numels();
      pi.frozen_groups = P.frozen_groups();
      pi.offload_param = offload_param;
      pi.param_nvme = param_nvme;
      pi.param_nvme_buffers = z.offload_param.buffer_count;
      pi.prefetch_elements = z.stage3_prefetch_bucket_size;
      pi.max_live_elements = z.stage3_max_live_parameters;
    }
    m.plan = plan_memory(pi);
    if (opt.is_muon()) {
      // Muon reads its momentum and writes its update outside the pieces
      // of the step (muon_step.h): in host or device memory, in one share.
      ZERO_CHECK(!nvme, "optimizer \"Muon\" with offload_optimizer.device \"nvme\" is not available: its momentum "
                 "is read outside the swap file's pieces; set offload_optimizer.device to \"cpu\" (or \"none\")");
      ZERO_CHECK(m.plan.offload_split >= m.plan.layout.partition_numel(), "optimizer \"Muon\" with "
                 "offload_optimizer.ratio ", z.offload_optimizer.ratio, " is not available: Muon steps the "
                 "partition in one place; set offload_optimizer.ratio to 1");
    }
    P.use_plan(m.plan);
    check_host_memory(m.plan, config_, m.ctx.on_accelerator(), comm_, m.ctx.device);
    const FlatLayout& L = P.layout();
    // bf16/fp16 offload on a GPU without accumulation: the CPU step writes the
    // updated parameters over the gradients they came from, and that buffer
    // goes up (one host buffer per step for both directions: 16 bytes per
    // parameter with DPU; no wait for the last upload before the next CPU
    // step, as the copy stream orders the upload before the next download).
    // The plan then has no staging buffer.
    const bool update_in_grads = m.offload && m.ctx.on_accelerator() && dtype != at::kFloat &&
                                 !m.plan[Buffer::kStaging].present;

    detail::OptimizerPartition::Options oo;
    oo.offload = m.offload;
    oo.nvme = nvme;
    oo.dtype = dtype;
    const bool rules = options.weight_decay || options.lr_scale;
    if (opt.is_muon()) {
      // Each half at its own rate where the schedule peaks (or, without
      // one, where lr is): its share of every step's rate.
      const float peak = m.schedule ? m.schedule->peak() : opt.lr;
      auto share = [&](const std::optional<float>& rate) {
        ZERO_CHECK(peak > 0.0f || rate.value_or(opt.lr) == 0.0f, "optimizer Muon: the ",
                   m.schedule ? "scheduler's peak rate" : "optimizer's lr", " is 0 while a half's rate (muon_lr, "
                   "adam_lr) is ", rate.value_or(opt.lr), ": each half takes its share of that rate; give it a "
                   "rate > 0");
        return peak > 0.0f ? rate.value_or(opt.lr) / peak : 1.0f;
      };
      oo.muon_lr_scale = share(opt.muon_lr);
      oo.adam_lr_scale = share(opt.adam_lr);
      if (m.rank == 0) {
        detail::log_info(log_topic::engine, "%s (EngineOptions::use_muon%s)",
                         detail::describe_muon_halves(hypers, P.numels(), oo.muon_lr_scale, oo.adam_lr_scale).c_str(),
                         options.use_muon ? "" : " not given: DeepSpeed's choice, zero::muon_by_default");
      }
    }
    if (rules && m.rank == 0) {
      detail::log_info(log_topic::engine, "%s (EngineOptions::%s)",
                       detail::describe_param_hypers(hypers, P.numels(), bool(options.weight_decay),
                                                     bool(options.lr_scale)).c_str(),
                       options.weight_decay && options.lr_scale ? "weight_decay, lr_scale"
                       : options.weight_decay                  ? "weight_decay"
                                                               : "lr_scale");
    }
    oo.hypers = std::move(hypers);
    m.optimizer = std::make_unique<detail::OptimizerPartition>(config_, m.plan, m.ctx, oo, ledger_);
    if (opt.is_muon()) {
      m.muon = std::make_unique<detail::MuonStep>(
          L, m.plan.shard_rank, std::move(muon_matrices), opt.momentum,
          opt.ns_method == "standard" ? detail::NsMethod::kStandard : detail::NsMethod::kGram, m.ctx.device,
          pi.muon_window_bytes);
      ZERO_INTERNAL_ASSERT(m.muon->work_elements() * 4 <= static_cast<std::size_t>(m.plan[Buffer::kMuonWork].bytes()));
    }

    at::NoGradGuard no_grad;
    if (nvme) {
      // One rank's drive can fail alone (missing, full, taken): every rank
      // leaves here together, before the collectives below.
      detail::agree(comm_, m.ctx.device, detail::error_of([&] { m.optimizer->open_swap(); }),
                    "opening the NVMe swap file");
    }
    if (param_nvme) {
      offload::SwapFile::Options io;
      io.io_threads = config_.aio.thread_count;
      io.block_bytes = static_cast<std::size_t>(config_.aio.block_size);
      io.setting = "offload_param.nvme_path";
      io.contents = "this rank's partition of the parameters";
      const std::filesystem::path file = std::filesystem::path(z.offload_param.nvme_path) /
                                         ("zerocpp-params-rank" + std::to_string(m.plan.shard_rank) + ".swap");
      detail::agree(comm_, m.ctx.device, detail::error_of([&] { P.open_swap(file, io, m.ctx, ledger_); }),
                    "opening the NVMe swap file of the parameters");
    }
    // The order of these allocations is the construction peak the ledger sees.
    if (m.stage == 3) {
      m.optimizer->allocate_master();
      P.adopt_partitioned(comm_, ledger_, m.guard,
                          [&](const Bucket& b, const at::Tensor& chunk32) { m.optimizer->seed_master_chunk(b, chunk32); },
                          m.ctx);
    } else {
      at::Tensor flat32 = P.initial_fp32(comm_, ledger_);
      m.optimizer->seed_master(flat32);
      P.adopt(std::move(flat32), comm_, ledger_, m.guard);
    }
    for (std::size_t i = 0; i < P.params().size(); ++i) {
      m.guard.install_hook(P.params()[i], std::make_unique<Impl::GradHook>(&m, static_cast<int>(i)));
    }
    m.optimizer->allocate_moments();  // after the temporary fp32 copy is gone

    detail::GradPath::Options go;
    go.stage = m.stage;
    go.offload = m.offload;
    go.dpu = dpu;
    go.accumulation = accumulation;
    go.overlap_comm = z.overlap_comm;
    go.shard_rank = P.shard_rank();
    go.update_in_grads = update_in_grads;
    m.grads = std::make_unique<detail::GradPath>(m.plan, m.ctx, go, comm_, ledger_, P.params().front());
    m.delayed = std::make_unique<detail::DelayedUpdate>(dpu, z.offload_optimizer.delayed_param_update_warmup_steps);
    m.grads->set_timeline(&m.timeline);
    P.set_timeline(&m.timeline);
    P.set_host_copy_pool(&m.optimizer->pool());
    // Off unless said: a model that reads a parameter outside its autograd
    // path during backward (a detached use, a hook) would read the update
    // (docs/config.md). Said false or left unset, nothing is warned.
    if (z.offload_optimizer.publish_in_backward.value_or(false)) {
      // Where the update may go in during backward: one rank (with several
      // it is all-gathered after backward, in the same order on every rank),
      // stages 1-2 (stage 3 gathers from the partition), the CPU Adam's own
      // buffers (not NVMe, not Muon's whole matrices), and the delayed update.
      std::string why;
      if (!dpu) why = "it needs offload_optimizer.delayed_param_update";
      else if (z.offload_optimizer.device != "cpu") why = "it needs offload_optimizer.device \"cpu\"";
      else if (m.stage == 3) why = "stage 3 publishes into the partition its gathers read";
      else if (P.layout().shard_world() > 1) why = "with several ranks the update is all-gathered after backward";
      else if (m.muon) why = "Muon steps whole matrices";
      if (why.empty()) {
        m.publish_in_backward = true;
        if (m.ctx.copy_stream) m.ctx.upload_stream = m.ctx.side_stream();
        m.bucket_reduced.assign(P.layout().buckets().size(), 0);
        m.grads->set_on_bucket_reduced([impl = &m](int b) {
          if (!impl->publishing_backward) return;
          impl->bucket_reduced[static_cast<std::size_t>(b)] = 1;
          impl->publish_reduced_pieces();
        });
      } else if (m.rank == 0) {
        detail::log_warning(log_topic::config,
                            "config warning: zero_optimization.offload_optimizer.publish_in_backward is "
                            "ignored: %s; the update goes in after backward", why.c_str());
      }
    }
    if (m.stage == 3) {
      detail::UnitSchedule::Options uo;
      uo.prefetch = z.stage3_prefetch_bucket_size > 0;
      uo.prefetch_elements = static_cast<std::size_t>(z.stage3_prefetch_bucket_size);
      uo.max_live_elements = static_cast<std::size_t>(z.stage3_max_live_parameters);
      m.units = std::make_unique<detail::UnitSchedule>(units, P, comm_, uo);
      // A unit's gradients go out when its backward is over, also those of
      // its parameters that got none on this rank (the same point on every
      // rank: the ranks' collectives stay in one order).
      m.units->on_backward_done([impl = impl_.get()](int unit) { impl->grads->close_unit(unit); });
    }

    // The transient gradient buckets (and at stage 3 the gathered units) are
    // budgeted here, at their bound, and not refused inside forward or
    // backward (where one rank could fail while the others wait in a
    // collective): every rank holds the same bytes, so every rank refuses alike.
    if (config_.device_memory_limit > 0) {
      const std::int64_t held = ledger_.snapshot().tier_current[static_cast<int>(Tier::kDevice)];
      auto planned = [&](Buffer id) { return m.plan[id].present ? m.plan[id].bytes() : std::int64_t{0}; };
      const std::int64_t buckets = planned(Buffer::kBuckets), live = planned(Buffer::kLiveParams);
      const std::int64_t muon = planned(Buffer::kMuonWork);
      auto both = [](std::int64_t b) { return memory::format_bytes(b) + " = " + std::to_string(b) + " bytes"; };
      ZERO_CHECK(held + muon <= config_.device_memory_limit, "device memory budget exceeded: Muon's step needs up "
                 "to ", both(muon), " for its whole matrices and Newton-Schulz products beside the ", both(held),
                 " the engine holds, past the device_memory_limit of ", both(config_.device_memory_limit),
                 " (it would need at least ", both(held + muon), "). Give the largest matrices to Adam "
                 "(EngineOptions::use_muon), raise device_memory_limit, or move state off the device (a higher "
                 "stage, or offload_optimizer.device=\"cpu\").");
      ZERO_CHECK(held + buckets + live <= config_.device_memory_limit, "device memory budget exceeded: the gradient "
                 "buckets need up to ", both(buckets), " during backward",
                 live > 0 ? " and the gathered units up to " + both(live) : std::string(), " beside the ", both(held),
                 " the engine holds, past the device_memory_limit of ", both(config_.device_memory_limit),
                 " (it would need at least ", both(held + buckets + live), "). Lower "
                 "zero_optimization.reduce_bucket_size", live > 0 ? " (stage 3: or stage3_prefetch_bucket_size, which "
                 "bounds the buckets and what is fetched ahead; mark smaller units, or turn prefetch off with "
                 "stage3_prefetch_bucket_size=0)" : "", ", raise device_memory_limit, or move state off the "
                 "device (a higher stage, or offload_optimizer.device=\"cpu\").");
    }
    if (m.rank == 0 && nvme) {
      // Each piece's state is rounded up to 4096 bytes in the file: small
      // pieces waste drive space. A piece is an eighth of a rank's chunk of
      // a bucket, at most sub_group_size: the advice names the one that
      // bounds them.
      const PlannedBuffer& master = m.plan[Buffer::kMaster];
      if (master.bytes() - master.valid_bytes() > master.valid_bytes() / 4) {
        bool sub_group_bounds = false, buckets_full = false;
        for (const Bucket& b : m.plan.layout.buckets()) {
          sub_group_bounds = sub_group_bounds || step_piece_elements(b, pi.sub_group_elements) <
                                                     step_piece_elements(b, std::numeric_limits<std::size_t>::max());
          buckets_full = buckets_full || b.numel >= static_cast<std::size_t>(z.reduce_bucket_size);
        }
        char why[256];
        if (sub_group_bounds) {
          std::snprintf(why, sizeof why, "zero_optimization.sub_group_size %lld is small): raise it for less drive space",
                        static_cast<long long>(z.sub_group_size));
        } else if (buckets_full) {
          std::snprintf(why, sizeof why, "a piece is an eighth of a rank's chunk of a bucket, and "
                        "zero_optimization.reduce_bucket_size %lld is small): raise reduce_bucket_size for less "
                        "drive space",
                        static_cast<long long>(z.reduce_bucket_size));
        } else {
          std::snprintf(why, sizeof why, "the model is small: a piece is an eighth of a rank's chunk of its "
                        "buckets): nothing to change; larger models round less");
        }
        detail::log_info(log_topic::engine,
                         "note: %s of the NVMe swap file's %s is rounding of the optimizer pieces to 4096 bytes (%s",
                         memory::format_bytes((master.bytes() - master.valid_bytes()) * (1 + pi.moments)).c_str(),
                         memory::format_bytes(master.bytes() * (1 + pi.moments)).c_str(), why);
      }
    }
    if (m.rank == 0 && m.units) {
      detail::log_info(log_topic::engine, "%s", m.units->describe(z.stage3_param_persistence_threshold, dtype).c_str());
    }
    if (m.rank == 0) {
      for (const std::string& w : ignored_settings(config_, m.ctx.on_accelerator())) {
        detail::log_warning(log_topic::config, "config warning: %s", w.c_str());
      }
    }

    // The communicator's counters are its owner's: the engine counts the
    // difference from here on.
    m.comm_at_step_start = comm_.stats();
    stats_.loss_scale = stats_.loss_scale_used = m.precision.loss_scale();
    stats_.lr = lr();
    stats_.publish_in_backward = m.publish_in_backward;
    if (m.rank == 0) {
      const std::size_t nb = L.buckets().size();
      // The optimizer's threads where its step runs on the host.
      const int threads = m.optimizer->pool().num_threads();
      const std::string cpu_threads = m.offload || !m.ctx.on_accelerator()
                                          ? ", " + std::to_string(threads) + " CPU optimizer thread" +
                                                (threads == 1 ? "" : "s")
                                          : "";
      detail::log_info(log_topic::engine,
                       "stage %d, %s on %s, %d rank%s, %zu parameters in %zu bucket%s (%zu frozen%s), "
                       "optimizer %s%s%s%s%s",
                       m.stage, c10::toString(dtype), device.str().c_str(), m.world, m.world == 1 ? "" : "s",
                       L.numel(), nb, nb == 1 ? "" : "s", static_cast<std::size_t>(P.frozen_count()),
                       P.frozen_bytes() > 0 ? (", " + memory::format_bytes(P.frozen_bytes()) + " on every rank").c_str()
                                            : "",
                       config_.optimizer.type.c_str(),
                       m.offload ? offload_text(m.plan).c_str() : "", offload_param_text(m.plan).c_str(),
                       dpu ? (", delayed update after " + std::to_string(m.delayed->warmup()) + " steps" +
                              (m.publish_in_backward ? " (published in backward)" : ""))
                                 .c_str()
                           : "",
                       cpu_threads.c_str());
    }
    if (m.rank == 0 && m.stage == 3 && P.frozen_partitioned() > 0) {
      detail::log_info(log_topic::engine,
                       "stage 3 partitions %zu frozen parameters (%s in %s) with their units: gathered and "
                       "released with them, never stepped%s",
                       P.frozen_partitioned(), memory::format_bytes(P.frozen_partitioned_bytes()).c_str(),
                       c10::toString(dtype),
                       P.frozen_bytes() > 0 ? "; the rest stay whole on every rank (no unit, shared by two units "
                                              "or with a module outside its unit, below "
                                              "stage3_param_persistence_threshold, or not in the training precision)"
                                            : "");
    }
    m.guard.commit();
    P.remember_storages();
  } catch (const std::exception& e) {
    detail::rethrow_if_out_of_memory(e, "building the engine", ledger_);
    throw;
  }
}

// The parts' destructors do the work: the guard restores the module, the
// delayed update finishes its job (and says what was dropped). At stage 3
// the module's parameters are gathered first (a collective, as the engine
// goes on every rank), so that it gets its values back; while unwinding
// from an error no collective is started and the released ones get zeros.
Engine::~Engine() {
  Impl& m = *impl_;
  if (m.saving) {
    // A save under way is finished (a collective, as the engine goes on
    // every rank); while unwinding it is dropped: the earlier checkpoints
    // stay, its .partial folder is removed by the next save of the tag.
    if (std::uncaught_exceptions() == 0) {
      try {
        finish_checkpoint(/*block=*/true);
      } catch (const std::exception& e) {
        detail::log_warning(log_topic::checkpoint, "the checkpoint save under way failed: %s", e.what());
      }
    } else {
      m.saving.reset();
    }
  }
  // The module gets fp32 tensors of its own back when the guard goes (in
  // Impl's destruction, first): the optimizer state and the gradients are
  // freed before that, so that the engine's end does not need the model's
  // fp32 size again on top of all it holds (a run's peak came at its exit).
  // (The delayed update's worker first finishes with them.)
  auto release_state = [&] {
    try {
      m.delayed->wait();
    } catch (const std::exception&) {
      return;  // (its destructor says what failed)
    }
    m.grads->release_buffers();
    m.optimizer->release_state();
  };
  if (!m.units) {
    release_state();
    return;
  }
  auto report_emptied = [&](std::size_t emptied) {
    if (emptied > 0) {
      detail::log_warning(log_topic::engine,
                          "rank %d: no memory to give %zu of the module's parameter buckets back: their "
                          "parameters are left empty (0 elements)", m.rank, emptied);
    }
  };
  try {
    at::NoGradGuard no_grad;
    if (std::uncaught_exceptions() == 0) {
      m.units->hold_all();
    } else {
      const std::size_t emptied = m.params->zero_fill_released();
      if (m.rank == 0) {
        detail::log_warning(log_topic::engine_teardown,
                            "stage 3 engine destroyed by an error: the module's partitioned parameters "
                            "are not gathered back (zeros)");
      }
      report_emptied(emptied);
    }
  } catch (const std::exception& e) {
    const std::size_t emptied = m.params->zero_fill_released();
    detail::log_warning(log_topic::engine, "could not gather the stage-3 parameters back into the module: %s", e.what());
    report_emptied(emptied);
  }
  release_state();
}

std::atomic<int>& Engine::Impl::backwards_running() {
  static std::atomic<int> n{0};
  return n;
}

c10::ScalarType Engine::dtype() const { return impl_->precision.dtype(); }
std::int64_t Engine::num_parameters() const { return static_cast<std::int64_t>(impl_->params->layout().numel()); }

bool Engine::is_accumulation_boundary() const {
  return (impl_->micro_step + 1) % config_.gradient_accumulation_steps == 0;
}

void Engine::backward(const at::Tensor& loss) {
  Impl& m = *impl_;
  m.check_not_damaged("backward");
  ZERO_CHECK(loss.defined() && loss.numel() == 1,
             "engine.backward() needs a scalar loss (the mean over the micro-batch)");
  ZERO_CHECK(loss.requires_grad(),
             "the loss does not require grad: was it computed from the engine's module under "
             "torch::NoGradGuard?");
  m.params->check_intact();
  ZERO_CHECK(!m.backward_done, "engine.backward() called twice without engine.step() in between: each micro-batch "
             "is one backward() and then one step() (step() counts the accumulation window and steps at its end); "
             "to combine two losses of one micro-batch, backward() their sum");
  if (!m.pending_lr_note.empty()) {
    zero::log(LogLevel::warning, log_topic::checkpoint, "warning: " + m.pending_lr_note);
    m.pending_lr_note.clear();
  }
  m.trace_compute("forward");
  // publish_in_backward: the backward that ends a window, while an update
  // is pending, takes each piece in as soon as it may (no save may still be
  // reading the parameters).
  m.publishing_backward = m.publish_in_backward && is_accumulation_boundary() && m.delayed->pending() && !m.saving;
  if (m.publishing_backward) std::fill(m.bucket_reduced.begin(), m.bucket_reduced.end(), 0);
  m.grads->begin_backward(is_accumulation_boundary());
  if (m.units) m.units->begin_backward();
  try {
    m.in_backward = true;
    {
      struct Running {
        Running() { ++Impl::backwards_running(); }
        ~Running() { --Impl::backwards_running(); }
      } running;
      m.precision.backward(loss, static_cast<int>(config_.gradient_accumulation_steps));
    }
    m.in_backward = false;
    at::NoGradGuard no_grad;
    m.grads->end_backward();
    if (!m.no_gradient_told && m.rank == 0) {
      if (const int missing = m.grads->first_without_gradient(); missing >= 0) {
        m.no_gradient_told = true;
        detail::log_info(log_topic::engine,
                         "parameter '%s' got no gradient in a backward (the loss did not use it, on rank 0): it "
                         "counts as a zero gradient, as in DeepSpeed, so Adam's momentum and weight decay still "
                         "move it, where torch.optim skips a parameter without one. If it should not train, freeze "
                         "it (requires_grad false) before the engine is built. (Said once.)",
                         m.params->names()[static_cast<std::size_t>(missing)].c_str());
      }
    }
    m.publishing_backward = false;
    if (m.units) m.units->end_backward();
    m.params->confirm_collectives();
    m.trace_compute("backward");
    m.backward_done = true;
  } catch (...) {
    // Part of this micro-batch's gradients may be in the buffers: the whole
    // accumulation window is dropped and the next backward starts a new one.
    m.in_backward = false;
    m.publishing_backward = false;
    at::NoGradGuard no_grad;
    m.grads->abort();
    // Some of the pending update went in during this backward: the rest
    // follows now, so that the retried micro-batch sees one set of weights
    // (the updated ones), never a mix. (On one rank: no collective.)
    if (m.published_early > 0) {
      try {
        m.finish_delayed(comm_);
      } catch (const std::exception& e) {
        m.damaged_by = std::string("a delayed update that failed while backward had taken part of it in (") +
                       e.what() + ")";
      }
    }
    if (m.units) m.units->abort();
    m.params->confirm_collectives(/*quiet=*/true);
    for (const auto& p : m.params->params()) p.mutable_grad().reset();
    m.micro_step -= m.micro_step % config_.gradient_accumulation_steps;
    try {
      throw;
    } catch (const std::exception& e) {
      detail::rethrow_if_out_of_memory(e, "running backward", ledger_);
      if (m.units && (dynamic_cast<const Error*>(&e) == nullptr ||
                      dynamic_cast<const Impl::LateUnitGradient*>(&e) != nullptr)) {
        // Autograd's error about shapes, the reducer's (a gradient with no
        // element), or a gradient that came after its unit's backward, when
        // a unit's parameter was used while released: name it if so.
        const std::vector<std::size_t> numels = m.params->numels();
        std::vector<int> hollow;
        try {
          hollow = detail::params_used_while_released(loss, m.params->params(), numels);
        } catch (const std::exception&) {
          // (A graph the walk cannot read: the original error stands.)
        }
        if (!hollow.empty()) {
          const auto i = static_cast<std::size_t>(hollow.front());
          std::string also;
          for (std::size_t k = 1; k < hollow.size(); ++k) {
            also += (k == 1 ? "; so were " : ", ") + std::string("'") +
                    m.params->names()[static_cast<std::size_t>(hollow[k])] + "'";
          }
          throw Error(detail::released_use_message(m.params->names()[i], static_cast<std::int64_t>(numels[i])) +
                      also + ". (Autograd said: " + first_line(e.what()) + ")");
        }
      }
      throw;
    }
  }
}

bool Engine::step() {
  Impl& m = *impl_;
  m.check_not_damaged("step");
  ZERO_CHECK(m.backward_done, "engine.step() without an engine.backward() since the last step() (or the last "
             "backward() failed, dropping its window): each micro-batch is one backward(loss) and then one step() "
             "(a step() alone would count a micro-batch that has no gradient)");
  const bool boundary = is_accumulation_boundary();
  // An asynchronous save is committed at the first step after every rank
  // has written its file: before this call counts, so that a failed save's
  // error leaves the window as it was (a caller that catches it and calls
  // step() again loses nothing).
  if (boundary && m.saving) {
    at::NoGradGuard no_grad;
    finish_checkpoint(/*block=*/false);
  }
  ++m.micro_step;
  m.backward_done = false;
  if (!boundary) return false;
  try {
    return step_at_boundary();
  } catch (const std::exception& e) {
    detail::rethrow_if_out_of_memory(e, "running the optimizer step", ledger_);
    throw;
  }
}

bool Engine::step_at_boundary() {
  Impl& m = *impl_;
  at::NoGradGuard no_grad;
  struct TraceStep {  // the step's interval on the compute stream, however it returns
    Impl& m;
    ~TraceStep() { m.trace_compute("step"); }
  } trace_step{m};
  m.timeline.set_step(stats_.step);
  // A save still writing the partition in place: the rest is copied now.
  last_checkpoint_.stall_s += m.fence_save(ledger_);
  // Before the step uses what this window's collectives produced: did every
  // rank issue the same ones?
  if (config_.comm_sequence_check) comm_.check_sequence();
  const auto called = std::chrono::steady_clock::now();
  const double since_last_ms =
      m.last_step_call ? std::chrono::duration<double, std::milli>(called - *m.last_step_call).count() : 0.0;
  m.last_step_call = called;
  const bool was_pending = m.delayed->pending();
  // The note below is decided once, on the third delayed step (the first
  // ones warm caches and allocators).
  const bool deciding = was_pending && m.delayed_steps_timed < 3 && ++m.delayed_steps_timed == 3;
  // For it, the wait measured from the end of backward on the device, not
  // from the host's step() call, which may run ahead of it.
  if (deciding && m.ctx.on_accelerator()) m.ctx.current_stream().synchronize();
  stats_.published_in_backward = was_pending ? static_cast<std::int64_t>(m.published_early) : 0;
  stats_.published_pieces =
      was_pending && m.optimizer ? static_cast<std::int64_t>(m.optimizer->pieces(Impl::Share::kMain).size()) : 0;
  stats_.delayed_wait_ms = m.finish_delayed(comm_);
  stats_.delayed_cpu_ms = was_pending ? m.delayed->last_job_ms() : 0.0;
  if (deciding) {
    // On a GPU a CPU step that outlasts forward and backward is said, with
    // the offload_optimizer.ratio that would hide it. (On the CPU the device
    // share runs on the same cores: nothing to gain.)
    const detail::DpuTiming t{since_last_ms, stats_.delayed_wait_ms, stats_.delayed_cpu_ms,
                              static_cast<double>(config_.zero_optimization.offload_optimizer.ratio)};
    // (Only where a device share exists: CPU offload, not NVMe; not Muon,
    // which steps its matrices whole; not Adagrad, which has no device kernel.)
    const bool share_possible = config_.zero_optimization.offload_optimizer.device == "cpu" && !m.muon &&
                                !config_.optimizer.is_adagrad();
    if (const auto note = detail::dpu_bound_note(t); note && share_possible && m.rank == 0 && m.ctx.on_accelerator()) {
      detail::log_info(log_topic::step, "%s", note->c_str());
    }
  }
  const int buf = m.grads->current();
  m.grads->window_done(buf);
  // The one host read of the step: the global squared norm (overflow check
  // and clip coefficient both come from it).
  const at::Tensor local_sq = m.grads->local_sq_norm(buf);
  double sq = 0.0;
  if (m.params->layout().shard_world() <= 1) {
    sq = local_sq.item<double>();
  } else {
    // Each rank sums its buckets' squares in double; the cross-rank sum is
    // fp32 (the communicator has no fp64). Its 2^-24 relative rounding moves
    // the clip coefficient by far less than the 1e-6 of clip_grad_norm_'s
    // rule. A finite squared norm past fp32's range (a global norm above
    // ~1.8e19, i.e. a still-scaled fp16 gradient far beyond overflow or a
    // diverged bf16/fp32 run) becomes inf and the step is skipped as an
    // overflow, logged and counted like any other.
    at::Tensor v = local_sq.to(at::TensorOptions().dtype(at::kFloat).device(m.ctx.device));
    comm_.all_reduce(v.data_ptr(), 1, DType::kFloat32)->wait();
    sq = v.item<float>();
  }
  stats_.loss_scale_used = m.precision.loss_scale();
  const detail::StepDecision d = m.precision.decide(sq, static_cast<double>(m.world) / m.grads->predivided());
  auto finish_step_stats = [&] {
    const comm::CommStats now = comm_.stats();
    for (std::size_t i = 0; i < now.bytes_sent.size(); ++i) {
      last_step_comm_.bytes_sent[i] = now.bytes_sent[i] - m.comm_at_step_start.bytes_sent[i];
      last_step_comm_.calls[i] = now.calls[i] - m.comm_at_step_start.calls[i];
    }
    m.comm_at_step_start = now;
    last_step_offload_bytes_ = m.grads->take_copied_bytes() + m.params->take_copied_bytes();
    if (m.units) {
      const detail::UnitSchedule::PrefetchCounts c = m.units->take_prefetched();
      stats_.units_prefetched = c.used;
      stats_.units_prefetched_unused = c.unused;
    }
    if (const detail::ParamSwap::Counters sw = m.params->take_swap_counters(); m.params->swap()) {
      stats_.param_chunks_read = static_cast<std::int64_t>(sw.reads);
      stats_.param_chunks_read_ahead = static_cast<std::int64_t>(sw.read_ahead);
      stats_.param_read_waits = static_cast<std::int64_t>(sw.waited);
    }
  };
  stats_.grad_norm = static_cast<float>(d.norm);
  // The rate of this step (a skipped one reports the rate it would have had).
  const float lr = this->lr();
  stats_.lr = lr;
  if (d.skip) {
    // Nothing was clipped: the skipped step's own (non-finite) norm, not
    // the step before's.
    stats_.clipped_grad_norm = stats_.grad_norm;
    stats_.skipped = m.precision.skipped_steps();
    ++stats_.consecutive_skipped;
    stats_.last_step_skipped = true;
    stats_.loss_scale = m.precision.loss_scale();
    m.grads->zero(buf);
    finish_step_stats();
    report_skipped_step();
    return false;
  }
  const auto [beta1, beta2] = betas();
  if (beta1 >= 1.0f && !config_.optimizer.is_adagrad()) {
    ZERO_CHECK(!m.scheduled_betas(), "OneCycle's momentum cycle gives beta1 ", beta1, " for optimizer step ", m.optimizer_step + 1,
               ": Adam and Lion need beta1 < 1 (decay_mom_rate ", config_.scheduler.one_cycle.decay_mom_rate,
               " raises it past cycle_max_mom after the cycle); lower scheduler.params.decay_mom_rate or set "
               "cycle_momentum false");
    ZERO_CHECK(false, "optimizer beta1 is ", beta1, ": ", config_.optimizer.type, " needs beta1 < 1 (a Config built "
               "in code; parsed betas are checked to be in [0, 1))");
  }
  const detail::StepRates rates{lr, beta1, beta2};
  stats_.consecutive_skipped = 0;
  // From here the master weights, the moments and the parameters change: a
  // failure part-way (out of memory in the optimizer, a failed publish)
  // leaves them partly updated, and the engine refuses to train on until a
  // checkpoint is loaded.
  struct DamagedOnThrow {
    Impl& m;
    int uncaught = std::uncaught_exceptions();
    ~DamagedOnThrow() {
      if (std::uncaught_exceptions() > uncaught) m.damaged_by = "an optimizer step that failed part-way";
    }
  } damaged_on_throw{m};
  stats_.clipped_grad_norm = static_cast<float>(d.clipped_norm);
  const float grad_scale = d.grad_scale;
  const std::int64_t opt_step = ++m.optimizer_step;
  m.update_index = buf;
  if (m.muon) {
    // Muon's matrices: momentum and orthogonalized update, whole (all-gathers).
    if (m.offload && m.ctx.on_accelerator()) m.grads->wait_down(buf);
    // Its work counted at its bound while it runs (checked against
    // device_memory_limit at construction, so never refused here).
    const auto work = ledger_.add(memory::Tier::kDevice, memory::Kind::kWorkspace,
                                  m.plan[Buffer::kMuonWork].present ? m.plan[Buffer::kMuonWork].bytes() : 0,
                                  "Muon's work", /*check_budget=*/false);
    m.muon->prepare([&](const Bucket& b) { return m.grads->piece(b, 0, b.chunk, buf); }, m.optimizer->exp_avg(),
                    m.optimizer->exp_avg_sq(), grad_scale, comm_);
  }
  // The device share (offload_optimizer.ratio < 1) first, on the main
  // thread: on a GPU its kernels are queued on the compute stream before the
  // next backward's, and their update waits in its staging for the publish.
  m.run_optimizer(buf, grad_scale, rates, opt_step, {}, Impl::Share::kDevice);
  if (m.delayed->should_delay(stats_.step)) {
    m.delayed->submit([impl = impl_.get(), buf, grad_scale, rates, opt_step] {
      impl->run_optimizer(buf, grad_scale, rates, opt_step, [impl](const Impl::Piece&) { impl->delayed->advance(); });
    }, stats_.step + 1);
    m.grads->flip();  // the next step's gradients go to the other buffer
    m.grads->zero(m.grads->current());
  } else {
    if (m.offload && m.ctx.copy_stream) {
      // Each piece goes up as soon as the CPU step has written it (after
      // the device share's, which the copy stream waits for on the device).
      m.params->begin_publish(/*offloaded=*/true, m.ctx);
      for (const Impl::Piece& pc : m.optimizer->pieces(Impl::Share::kDevice)) m.publish_piece(pc, buf, "share");
      m.run_optimizer(buf, grad_scale, rates, opt_step,
                      [&](const Impl::Piece& pc) { m.publish_piece(pc, buf, "piece"); });
      m.params->end_publish(comm_);
    } else {
      m.run_optimizer(buf, grad_scale, rates, opt_step);
      m.apply_update(buf, comm_);
    }
    m.grads->zero(buf);
  }
  ++stats_.step;
  stats_.last_step_skipped = false;
  stats_.loss_scale = m.precision.loss_scale();
  finish_step_stats();
  return true;
}

float Engine::lr() const {
  const Impl& m = *impl_;
  return m.schedule ? m.schedule->applied(m.optimizer_step) : lr_;
}

std::pair<float, float> Engine::betas() const {
  const Impl& m = *impl_;
  const LrSchedule::Betas b =
      m.scheduled_betas().value_or(LrSchedule::Betas{config_.optimizer.beta1, config_.optimizer.beta2});
  return {b.beta1, b.beta2};
}

void Engine::set_lr(float lr) {
  Impl& m = *impl_;
  // As the config's optimizer.params.lr is checked: a NaN would make every
  // master weight NaN at the next step, a negative rate climb the loss.
  ZERO_CHECK(std::isfinite(lr) && lr >= 0.0f, "set_lr(", lr,
             "): the learning rate must be a finite number >= 0 (the rate is unchanged)");
  if (m.schedule && m.rank == 0) {
    detail::log_info(log_topic::engine,
                     "set_lr() sets the learning rate from now on; the config's scheduler (%s) is "
                     "off%s", config_.scheduler.type.c_str(),
                     m.scheduled_betas() ? " (its betas stay where it left them)" : "");
  }
  // As in DeepSpeed, where OneCycle wrote the betas into the optimizer.
  m.held_betas = m.scheduled_betas();
  m.schedule.reset();
  m.pending_lr_note.clear();  // the caller chose the rate
  lr_ = lr;
}

void Engine::report_skipped_step() const {
  const Impl& m = *impl_;
  const auto& policy = config_.nonfinite;
  // The window's number, counting skipped ones (as DeepSpeed's global_steps
  // does): three skips in a row are steps 1, 2, 3, not step 1 three times.
  const long long step = static_cast<long long>(stats_.step + stats_.skipped);
  const bool stop = policy.policy == "stop" && stats_.consecutive_skipped >= policy.stop_after;
  if (m.rank == 0 && !stop) {
    const bool fp16 = m.precision.dtype() == at::kHalf;
    detail::log_warning(log_topic::step,
                        "step %lld skipped: the gradient norm is not finite (%s); %lld step(s) skipped so "
                        "far, %lld in a row%s",
                        step, fp16 ? "fp16 overflow, or a NaN/inf loss" : "a NaN/inf loss or gradient",
                        static_cast<long long>(stats_.skipped), static_cast<long long>(stats_.consecutive_skipped),
                        fp16 ? (", loss scale now " + std::to_string(m.precision.loss_scale())).c_str() : "");
  }
  // Every rank decides alike (the norm is global), so every rank throws.
  ZERO_CHECK(!stop, "step ", step, ": the gradient norm was not finite (NaN or inf) in ", stats_.consecutive_skipped,
             " consecutive step(s), ", stats_.skipped,
             " skipped in all, and the config's nonfinite policy is \"stop\" after ", policy.stop_after,
             ". The model diverged or the data holds what it cannot fit: lower the learning rate, keep "
             "gradient_clipping on, with fp16 prefer bf16 (wider range) or a lower initial_scale_power, and "
             "resume from the last checkpoint; or set nonfinite.policy to \"skip\" (or raise stop_after) to "
             "train on past such steps");
}

void Engine::flush() {
  at::NoGradGuard no_grad;
  // Only a pending update changes what a save in flight may still be
  // writing in place (the parameters): without one there is nothing to copy.
  if (impl_->delayed->pending()) last_checkpoint_.stall_s += impl_->fence_save(ledger_);
  impl_->finish_delayed(comm_);
}

void Engine::trace(bool on) {
  Impl& m = *impl_;
  m.timeline.set(on);
  m.last_mark = m.timeline.mark_current();
}

std::vector<TimelineInterval> Engine::take_timeline() { return impl_->timeline.take(); }

std::vector<at::Tensor> Engine::gather_master_params() {
  Impl& m = *impl_;
  at::NoGradGuard no_grad;
  m.delayed->wait();
  // (NVMe: read from the swap file, which can fail on one rank alone.)
  at::Tensor master;
  detail::agree_if(m.optimizer->swapped(), comm_, m.ctx.device,
                   detail::error_of([&] { master = m.optimizer->full_master(); }),
                   "reading the master weights from NVMe");
  return m.params->gather(master, comm_);
}

GatheredParameters Engine::gather_parameters() {
  Impl& m = *impl_;
  m.check_not_damaged("gather_parameters");
  if (!m.units) return GatheredParameters(nullptr, {});
  at::NoGradGuard no_grad;
  try {
    m.units->hold_all();
  } catch (const std::exception& e) {
    detail::rethrow_if_out_of_memory(e, "gathering every stage-3 unit's parameters (gather_parameters())", ledger_);
    throw;
  }
  return GatheredParameters(this, alive_);
}

void Engine::release_gathered() noexcept {
  if (!impl_ || !impl_->units) return;
  try {
    at::NoGradGuard no_grad;
    impl_->units->release_all();
  } catch (const std::exception& e) {
    detail::log_warning(log_topic::engine,
                        "rank %d: releasing the parameters of gather_parameters(): %s", impl_->rank, e.what());
  }
}

GatheredParameters::GatheredParameters(GatheredParameters&& other) noexcept
    : engine_(other.engine_), alive_(std::move(other.alive_)) {
  other.engine_ = nullptr;
}

GatheredParameters::~GatheredParameters() {
  if (engine_ != nullptr && !alive_.expired()) engine_->release_gathered();
}

std::string Engine::summary() const {
  const Impl& m = *impl_;
  const memory::LedgerSnapshot s = ledger_.snapshot();
  std::ostringstream os;
  os << "zerocpp summary (rank " << m.rank << " of " << m.world << ", stage " << m.stage
     << (m.offload ? offload_text(m.plan) : std::string()) << offload_param_text(m.plan)
     << (m.delayed->enabled() ? ", DPU" : "") << ", "
     << c10::toString(m.precision.dtype()) << " on " << m.ctx.device.str() << ", " << num_parameters()
     << " parameters)\n";
  for (int t = 0; t < memory::kNumTiers; ++t) {
    if (s.tier_peak[t] == 0) continue;
    os << "  " << memory::tier_name(static_cast<Tier>(t)) << ": " << memory::format_bytes(s.tier_current[t])
       << " now, " << memory::format_bytes(s.tier_peak[t]) << " peak;";
    for (int k = 0; k < memory::kNumKinds; ++k) {
      if (s.peak[t][k] == 0) continue;
      os << " " << memory::kind_name(static_cast<Kind>(k)) << " " << memory::format_bytes(s.current[t][k])
         << " (peak " << memory::format_bytes(s.peak[t][k]) << ")";
    }
    os << "\n";
  }
  os << "  last step sent " << memory::format_bytes(static_cast<std::int64_t>(last_step_comm_.total_bytes()))
     << " (";
  const char* names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"};
  bool first = true;
  for (std::size_t i = 0; i < 5; ++i) {
    if (last_step_comm_.calls[i] == 0) continue;
    os << (first ? "" : ", ") << names[i] << " "
       << memory::format_bytes(static_cast<std::int64_t>(last_step_comm_.bytes_sent[i]));
    first = false;
  }
  os << ")";
  if (m.offload) {
    os << ", offload copies " << memory::format_bytes(static_cast<std::int64_t>(last_step_offload_bytes_));
  }
  if (m.params->swap()) {
    os << "\n  parameters on nvme: last step read " << stats_.param_chunks_read << " chunks ("
       << stats_.param_chunks_read_ahead << " ahead of their gather), " << stats_.param_read_waits
       << " gathers waited for a read";
  }
  os << "\n  optimizer steps " << stats_.step << ", skipped " << stats_.skipped << ", loss scale " << stats_.loss_scale
     << "\n";
  return os.str();
}

}  // namespace zero
