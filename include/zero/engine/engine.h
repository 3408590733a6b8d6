// zero::Engine: trains any torch::nn::Module with ZeRO stage 0/1/2/3, mixed
// precision, gradient accumulation and clipping, CPU offload of the optimizer
// (and at stage 3 of the parameters) and the one-step delayed parameter
// update (DPU) of ZeRO-Offload.
//
//   zero::Engine engine(model, config, *comm);
//   for (each micro-batch) {
//     auto loss = loss_fn(model->forward(x.to(engine.dtype())), y);  // the module's own forward
//     engine.backward(loss);
//     engine.step();             // steps only on the accumulation boundary
//   }
//   engine.flush();              // DPU: apply the last, still pending update
//
// What the engine does to the module (docs/design.md "One training step"):
//  - Trainable parameters become views into one flat buffer in the training
//    precision (bf16 / fp16 / fp32), laid out as zero/zero/flat_layout.h says.
//    Rank 0's initial values are broadcast so that all ranks start equal.
//    In bf16/fp16, floating-point buffers and frozen floating-point
//    parameters (requires_grad false) are cast to the training precision as
//    well, so a frozen layer accepts the bf16/fp16 activations; inputs must
//    be given in it too (integer inputs such as token ids are unaffected).
//    In fp32 they keep their own dtype (a float64 buffer stays float64).
//  - Frozen parameters are not trained (their values only change precision,
//    and not at all in fp32 training). A parameter that
//    appears twice (tied weights) is trained once. A parameter that gets no
//    gradient in a step is treated as having a zero gradient, as DeepSpeed's
//    ZeRO does: momentum and weight decay still move it.
//  - The fp32 master weights and optimizer moments exist only for the rank's
//    partition (stage >= 1), on the host when offload_optimizer.device="cpu".
//  - Stage 3: each rank holds only its partition of the training-precision
//    parameters; the model's units (zero/zero/unit.h: zero::mark_unit at
//    construction, zero::unit where they are called) are gathered while they
//    run in forward and backward, and released after. Parameters of no unit
//    stay gathered. Every rank must run the same units in the same order.
//    Outside its unit a unit's parameter is hollow (shape [0], as in
//    DeepSpeed): gather_parameters() gives the module all of them for a
//    while (to read, save or evaluate). docs/engine.md "Stage 3".
//  - The module is on the CPU or on one CUDA GPU (cuda:<local rank>); every
//    trainable parameter on the same device. Or EngineOptions names the
//    device, and the module is built elsewhere (on the CPU, or on the meta
//    device with an init function). On a GPU the flat buffers and
//    (without offload) the optimizer partition are there, the optimizer step
//    is zero_cuda's fused device Adam or Lion (link zero_cuda; Adagrad only
//    with whole offload), and the communicator must be NCCL
//    (zero::cuda::make_nccl_communicator) or, for one process, the
//    single-process one. Offloaded host buffers are then pinned. docs/gpu.md.
//  - Gradients are released as soon as autograd hands them over
//    (grad_reducer.h); p.grad() is undefined outside backward.
//  - When the engine is destroyed (or its constructor fails) the module is a
//    plain LibTorch module again: the engine's gradient hooks are removed,
//    every trainable parameter is an fp32 tensor of its own holding the value
//    the module computed with (in bf16/fp16 training the training-precision
//    value, widened: gather_master_params() first for the fp32 masters), and
//    frozen parameters and buffers have their own dtype back. After a failed
//    constructor they are the very tensors they were. Another Engine can then
//    be built on the module (while one lives, a second is refused).
//
// Loss scaling: backward() multiplies the loss by the current scale (fp16)
// over the accumulation steps, as DeepSpeed does (a window's summed
// gradients are the size of one micro-batch's, and fp16's range holds them
// at any accumulation); the optimizer step divides by the scale and by the
// world size. Give backward() the mean loss of the micro-batch, as with DDP.
//
// Delayed parameter update (offload_optimizer.delayed_param_update): after
// delayed_param_update_warmup_steps ordinary steps, the CPU optimizer step of
// step t runs on a worker thread while the forward and backward of step t+1
// run on the parameters produced by step t-1 (ZeRO-Offload, section 5.2). The
// update of step t reaches the model at the next step() (or flush()), after
// step t+1's backward. Exactness: the master weights follow
// m_t = Adam(m_{t-1}, g(m_{t-2}, batch_t)) exactly; overflow checks, the
// gradient norm and clipping are computed on the main thread from step t's
// own gradients before the worker starts, so a skipped step never reaches the
// worker; gradient accumulation is unaffected (the delay is per optimizer
// step). Gradients are double-buffered on the host while the worker runs.
// A skipped step (overflow) submits nothing, so after it nothing is pending:
// the next step's forward and backward run on the newest parameters, those of
// the last update, which the skip left unchanged. In the formula above a
// skipped step t is the identity, m_t = m_{t-1}, and the formula still holds.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include "zero/ckpt/checkpoint_error.h"
#include "zero/comm/communicator.h"
#include "zero/config/config.h"
#include "zero/engine/loss_scaler.h"
#include "zero/engine/timeline.h"
#include "zero/engine/param_rules.h"
#include "zero/memory/memory_ledger.h"

namespace zero {

struct StepStats {
  std::int64_t step = 0;          // optimizer steps taken (skipped ones excluded)
  std::int64_t skipped = 0;       // steps skipped for non-finite gradients
  std::int64_t consecutive_skipped = 0;  // skipped steps since the last step taken
  // fp16: the scale the next backward() multiplies the loss by (after the
  // last step's update: halved after an overflow, doubled after a window);
  // loss_scale_used: the one the last step's gradients were scaled by
  // (DeepSpeed's "Attempted loss scale"). 1 without fp16.
  float loss_scale = 1.0f;
  float loss_scale_used = 1.0f;
  float grad_norm = 0.0f;         // global norm of the averaged gradient, before clipping
  float clipped_grad_norm = 0.0f; // after clipping
  bool last_step_skipped = false;
  float lr = 0.0f;
  // Stage 3, over the last step's forward and backward passes: units whose
  // all-gather started ahead of their use (prefetch) and that were then
  // used, and those fetched ahead in vain (the order of the units changed).
  std::int64_t units_prefetched = 0;
  std::int64_t units_prefetched_unused = 0;
  // Stage 3 with the parameters on NVMe (offload_param.device "nvme"), since
  // the last step: this rank's chunks read from its swap file, of which read
  // ahead of their gather (in the order of the last step's gathers), and the
  // gathers that waited for a read (not ahead, or ahead and not done yet).
  std::int64_t param_chunks_read = 0;
  std::int64_t param_chunks_read_ahead = 0;
  std::int64_t param_read_waits = 0;
  // With the delayed update (offload_optimizer.delayed_param_update), in the
  // last step(): how long the host waited for the step before's CPU
  // optimizer step (and its upload), and how long that CPU step ran on its
  // worker, in milliseconds (0 when no delayed step was pending). On a GPU
  // the host may reach step() before backward ends on the device, so the
  // wait holds that time too. A CPU step longer than forward and backward
  // is the bound; on a GPU the engine says so once (on the third delayed
  // step, timed from the end of backward on the device), with the
  // offload_optimizer.ratio that would hide it.
  double delayed_wait_ms = 0;
  double delayed_cpu_ms = 0;
  // Whether offload_optimizer.publish_in_backward applies to this engine
  // (set from construction: said true, with the delayed update on one rank
  // at stages 1-2 with the CPU Adam). Then, in the last step(): how many
  // pieces of the step before's update went into the model during the
  // backward that ended the window, out of all its pieces (the rest went in
  // at step()).
  bool publish_in_backward = false;
  std::int64_t published_in_backward = 0;
  std::int64_t published_pieces = 0;
};

// Where the engine trains, and how it fills a module built without memory
// (docs/engine.md, "A model larger than one device").
struct EngineOptions {
  // The device to train on: the CPU or cuda:<local rank>. Default: where the
  // module's parameters are (then all those not on meta must be on one
  // device; a module all on meta needs it named). Given, the
  // module may be elsewhere (built on the CPU for a GPU, or on the meta
  // device): the engine copies each parameter to it bucket by bucket, so at
  // stage 3 the device never holds more than this rank's partition, one
  // bucket in fp32 (beside its copy in the training precision) and the
  // gathered units. Afterwards the module lives there.
  std::optional<c10::Device> device;
  // For parameters and buffers on the meta device (zero/zero/deferred_init.h:
  // zero::to_meta): init(name, value) fills `value` in place (normal_,
  // uniform_, zero_, copy_) — a tensor of the parameter's shape and dtype on
  // the engine's device; `name` as named_parameters()/named_buffers() give
  // it. Called on every rank (rank 0's values win, as for any module) in the
  // engine's order, bucket by bucket, which need not be the module's: random
  // values should come from a generator of the parameter's own, as
  // zero::models::Gpt::init_parameter draws them. A value left unfilled is
  // an error. Required when the module has meta tensors, refused otherwise.
  std::function<void(const std::string& name, const at::Tensor& value)> init;
  // Per-parameter optimizer settings (zero/engine/param_rules.h), as
  // PyTorch's param groups give them: rule(name, parameter) returns the
  // parameter's value, or std::nullopt for the default.
  // weight_decay: its decay (default: the config's); zero::no_decay_below_2d()
  // leaves biases and norm gains undecayed, as GPT training does.
  WeightDecayRule weight_decay;
  // lr_scale: its rate as a multiple of lr() (default 1), kept through the
  // schedule (a head at 10x, layer-wise lr decay).
  LrScaleRule lr_scale;
  // use_muon (optimizer.type "Muon"): true where the parameter steps with
  // Muon, false with Muon's Adam half (default: zero::muon_by_default,
  // DeepSpeed's choice: matrices whose names hold neither "embed" nor
  // "lm_head"). Refused with another optimizer.
  MuonRule use_muon;
};

class Engine;

// What Engine::gather_parameters() returns: while it lives, every stage-3
// unit's parameters are gathered in the module (their values and shapes).
// Ending it releases them again; it does nothing once the engine is gone.
// Move-only.
class GatheredParameters {
 public:
  GatheredParameters(GatheredParameters&& other) noexcept;
  GatheredParameters& operator=(GatheredParameters&&) = delete;
  GatheredParameters(const GatheredParameters&) = delete;
  ~GatheredParameters();

 private:
  friend class Engine;
  GatheredParameters(Engine* engine, std::weak_ptr<const void> alive)
      : engine_(engine), alive_(std::move(alive)) {}
  Engine* engine_ = nullptr;  // null: nothing held (stages 0-2, moved from)
  std::weak_ptr<const void> alive_;
};

class Engine {
 public:
  // Collective. Rank 0 prints the config's warnings (Config::warnings, the
  // parser's: a misplaced or ignored key) and its own notes on the settings;
  // a program that printed the warnings itself clears the list first.
  Engine(std::shared_ptr<torch::nn::Module> module, config::Config config,
         comm::Communicator& comm, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Backward of one micro-batch's (mean) loss. If it throws (an error in the
  // model's backward, a refused allocation), the gradients of the current
  // accumulation window are dropped and the engine stays usable: the next
  // backward starts a new window. On several ranks every rank must fail at
  // the same point (collectives already started are waited for).
  void backward(const at::Tensor& loss);
  // Counts the micro-batch; on the accumulation boundary reduces what is left,
  // checks for overflow, clips and steps. Returns true when an optimizer step
  // was taken (false off the boundary and for a skipped step). On the
  // boundary it also commits an asynchronous save every rank has written;
  // a failed one throws before the call counts (call step() again to go on).
  bool step();
  // Delayed update: waits for the pending CPU step and applies it to the model.
  void flush();

  bool is_accumulation_boundary() const;
  const StepStats& stats() const { return stats_; }
  // The learning rate of the next optimizer step. With a "scheduler" in the
  // config the engine steps it as DeepSpeed does: after each step taken, not
  // after a skipped one (LrSchedule::applied). set_lr() sets the rate
  // itself, and from then on the config's scheduler is off (the caller
  // schedules; a note says so once). A rate that is not finite or is below
  // 0 is refused (zero::Error), as in the config, and the rate is unchanged.
  float lr() const;
  void set_lr(float lr);
  // Adam's and Lion's (beta1, beta2) for the next optimizer step: the
  // config's, or a OneCycle scheduler's momentum cycle (beta2 0.99, as
  // DeepSpeed's); after set_lr(), where that cycle left them.
  std::pair<float, float> betas() const;
  c10::ScalarType dtype() const;
  const config::Config& config() const { return config_; }
  comm::Communicator& communicator() { return comm_; }

  std::int64_t num_parameters() const;  // Psi: trainable elements
  const memory::MemoryLedger& ledger() const { return ledger_; }
  // Bytes this rank sent in the last optimizer step (all its micro-batches
  // and the parameter all-gather), by collective; see comm/communicator.h.
  const comm::CommStats& last_step_comm() const { return last_step_comm_; }
  std::uint64_t last_step_offload_bytes() const { return last_step_offload_bytes_; }

  // Checkpoints (docs/checkpoints.md). Collective: every rank calls them,
  // between steps (after the step() that ends an accumulation window).
  //
  // save_checkpoint writes <dir>/<tag>/: each rank its file (its partition
  // of the fp32 master weights, the moments, the training-precision
  // parameters, a pending delayed update, its RNG state), rank 0 the module's
  // frozen parameters and buffers and the manifest; then <dir>/latest names
  // the tag. Files go to <dir>/<tag>.partial and are fsync'd before the
  // rename, so a crash at any moment leaves the earlier checkpoints
  // loadable. async: returns once what the next forward and backward may
  // change is copied to host memory; the files are written while training
  // goes on (the partition's host state in place: the next step() copies
  // what is not written yet; with the state on NVMe, streamed from the swap
  // file, which the next step() waits for instead), and the checkpoint is committed at a later
  // step() once every rank has written its file (or by wait_checkpoint()).
  // Where a node's host memory cannot hold a copy of everything, the save is
  // synchronous (with a message; last_checkpoint().async says); where the
  // next step's copy finds no room, that save is abandoned and its commit
  // fails, naming the rank (docs/checkpoints.md).
  // A save that fails (a folder not writable, a rank's file not written,
  // the commit) throws zero::ckpt::CheckpointSaveError on every rank: from
  // save_checkpoint, or, for an async save, from the step() that commits it
  // (before that call counts: call step() again and training goes on as if
  // no save had been asked for) or wait_checkpoint(). Nothing of it is
  // committed; the training state is intact.
  // client_state: the caller's JSON (data position, schedule), saved in the
  // manifest and returned by load_checkpoint.
  // exclude_frozen_parameters (DeepSpeed's argument of the same name): the
  // frozen parameters are not saved (a base model under adapters: the
  // checkpoint holds what training changes, and at stage 3 no rank gathers
  // the base for it); buffers are. A load of such a checkpoint keeps the
  // loading module's own frozen parameters: build it on the same base.
  void save_checkpoint(const std::string& dir, const std::string& tag,
                       const nlohmann::json& client_state = nlohmann::json::object(), bool async = false,
                       bool exclude_frozen_parameters = false);
  // Finishes an asynchronous save (waits for every rank's file, commits).
  // Returns the tag committed, "" when no save was under way.
  std::string wait_checkpoint();
  bool checkpoint_in_flight() const;
  // Loads <dir>/<tag> ("latest": the tag <dir>/latest names), saved by any
  // world size and stage, with or without offload: each rank reads the
  // parts of the saved partitions that make up its own. Returns the client
  // state. The manifest (the model's parameter names and shapes, the
  // optimizer) and every file's size are checked before anything changes:
  // on such an error the engine is as it was. The files are then read into
  // the engine's own host buffers (no second copy of the state in memory),
  // checksums verified on the way: a file damaged inside fails the load
  // with the engine's state partly overwritten, and the engine refuses to
  // train or save until a load succeeds. Like a save, a load in the middle
  // of an accumulation window, or after a backward() whose step() has not
  // come, is refused (those gradients would carry over into the loaded
  // state). The module's frozen parameters and buffers must match the
  // checkpoint's both ways (DeepSpeed's load_module_strict); with
  // load_module_strict false, those the checkpoint lacks keep the module's
  // values and those the module lacks are skipped, each named in one line.
  nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag = "latest",
                                 bool load_module_strict = true);
  struct CheckpointTiming {
    std::string tag;
    // How long the save held training: save_checkpoint itself and, for an
    // asynchronous save not written by the next optimizer step, the copy
    // that step made of the rest of the state (NVMe: its wait for the
    // streamed state).
    double stall_s = 0.0;
    double write_s = 0.0;   // this rank's file: write and fsync
    double commit_s = 0.0;  // the commit (waits for the slowest rank's file)
    std::uint64_t bytes = 0;  // this rank's file
    bool async = false;
  };
  // The last save committed (or, while one is under way, its stall so far).
  const CheckpointTiming& last_checkpoint() const { return last_checkpoint_; }

  // The full fp32 master weights, one tensor per trainable parameter in the
  // module's order (all ranks must call it: it all-gathers the partitions).
  std::vector<at::Tensor> gather_master_params();
  // One trainable parameter's state, gathered from every rank's partition
  // (DeepSpeed's safe_get_full_fp32_param, safe_get_full_grad and
  // safe_get_full_optimizer_state): an fp32 tensor of the parameter's shape
  // on the CPU, a copy. `name` as named_parameters() gives it (either name
  // of a tied weight). Collective: every rank calls them with the same name.
  // The fp32 master weights (with the delayed update: the newest, whose
  // update reaches the model at the next step() or flush()).
  at::Tensor full_master(const std::string& name);
  // The gradient the coming step() takes: the mean over the global batch
  // (every rank's micro-batches of the window), the loss scale divided out,
  // before clipping (StepStats::grad_norm is the norm of all of them). Only
  // after the backward() that ends an accumulation window and before its
  // step(): elsewhere the window's sum is not complete (refused).
  at::Tensor full_grad(const std::string& name);
  // An optimizer state by PyTorch's key (optimizer_state_keys(name) lists
  // the parameter's): "exp_avg" and "exp_avg_sq" (Adam, AdamW, Muon's Adam
  // half), "exp_avg" (Lion), "sum" (Adagrad), "momentum_buffer" (Muon's
  // matrices).
  at::Tensor full_optimizer_state(const std::string& name, const std::string& key);
  std::vector<std::string> optimizer_state_keys(const std::string& name) const;
  // The setters (safe_set_full_fp32_param, safe_set_full_optimizer_state):
  // `value` of the parameter's shape, any floating dtype; rank 0's is taken
  // (broadcast) and each rank keeps its part. Between steps only (not in an
  // accumulation window). set_full_master sets the module's parameter too,
  // in the training precision: it first applies a pending delayed update
  // (as flush() does), then all-gathers the parameters as a step does.
  void set_full_master(const std::string& name, const at::Tensor& value);
  void set_full_optimizer_state(const std::string& name, const std::string& key, const at::Tensor& value);

  // Stage 3: every unit's parameters gathered into the module, in the
  // training precision, until the returned scope ends: read them (a norm, a
  // comparison, torch::save), evaluate, or train on inside it (units are
  // then not released in between). Collective: every rank calls it (ending
  // it is not collective). Values written into the parameters are not kept
  // (the next step's update overwrites them, as at every stage). At stages
  // 0-2 (and for parameters that stay gathered) it holds nothing: the
  // module always has them. Out of memory: the error names it, nothing held.
  [[nodiscard]] GatheredParameters gather_parameters();

  // A human-readable summary: memory per tier and kind, communication, steps.
  std::string summary() const;

  // Tracing (zero/engine/timeline.h): trace(true) starts a timeline of the
  // engine's work (and drops what was recorded), trace(false) stops it;
  // take_timeline() returns what was recorded since, and clears it.
  void trace(bool on);
  std::vector<TimelineInterval> take_timeline();

 private:
  // step() at an accumulation boundary: the optimizer step itself.
  bool step_at_boundary();
  // Logs a skipped step; throws when the nonfinite policy says stop.
  void report_skipped_step() const;
  friend class GatheredParameters;
  void release_gathered() noexcept;
  // Expires with the engine: a GatheredParameters that outlives it does nothing.
  std::shared_ptr<const void> alive_ = std::make_shared<char>(0);
  config::Config config_;
  comm::Communicator& comm_;
  memory::MemoryLedger ledger_;
  StepStats stats_;
  float lr_ = 0.0f;
  comm::CommStats last_step_comm_;
  std::uint64_t last_step_offload_bytes_ = 0;
  CheckpointTiming last_checkpoint_;
  // The collective end of a save: every rank's file record to rank 0, which
  // writes the manifest and renames. block=false: only once every rank has
  // written its file (one small all-reduce to find out).
  void finish_checkpoint(bool block);
  // Last, so destroyed first: its buffers unregister from a ledger that is
  // still alive (also when the constructor throws).
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero
