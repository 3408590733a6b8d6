// Engine behaviour beyond parity: the memory and communication formulas of
// docs/design.md, the exact delayed parameter update, overflow handling, and the
// awkward modules (no parameters, frozen, tied, unused).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <map>
#include <cstdio>
#include <fstream>
#include <regex>
#include <stdexcept>
#include <string_view>
#include <thread>

#include <ATen/ops/arange.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include "../support/cpu_allocation_peak.h"
#include "../support/resident_peak.h"
#include "shared_temp_dir.h"
#include "train_loop.h"
#include "zero/comm/comm_errors.h"
#include "zero/comm/communicator.h"
#include "zero/comm/launcher_env.h"
#include "zero/config/config.h"
#include "zero/core/cpu_cores.h"
#include "zero/core/error.h"
#include "zero/core/log.h"
#include "zero/zero/flat_layout.h"
#include "zero/zero/memory_estimate.h"
#include "zero/zero/memory_plan.h"
#include "zero/zero/muon_plan.h"

namespace zero::test {
namespace {

using memory::Kind;
using memory::Tier;

std::int64_t sum_over_ranks(comm::Communicator& comm, std::int64_t v) {
  double d = static_cast<double>(v);  // exact below 2^53
  float parts[2] = {static_cast<float>(std::floor(d / 65536.0)), static_cast<float>(std::fmod(d, 65536.0))};
  comm.all_reduce(parts, 2, DType::kFloat32)->wait();
  return static_cast<std::int64_t>(parts[0]) * 65536 + static_cast<std::int64_t>(parts[1]);
}

// ---- Formula: per-rank model-state bytes and bytes sent per step --------

struct FormulaCase {
  int stage;
  bool offload;
  bool bf16 = true;
  bool dpu = false;
};
class Formula : public testing::TestWithParam<FormulaCase> {};

TEST_P(Formula, BytesMatchDesignTable) {
  const auto [stage, offload, bf16, dpu] = GetParam();
  comm::Communicator& comm = world_comm();
  const std::int64_t N = comm.world_size();
  auto model = make_model(ModelKind::kMlp);
  config::Config cfg = make_config(stage, offload, bf16, static_cast<int>(N), 2, 1);
  // DPU's warm-up outlasts the one step taken, so that the step is ordinary
  // (its all-gather falls in it) while the second host gradient buffer exists.
  cfg.zero_optimization.offload_optimizer.delayed_param_update = dpu;
  cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = 5;
  Engine engine(model, cfg, comm);
  const std::int64_t psi = engine.num_parameters();
  ASSERT_EQ(psi, 16 * 48 + 48 + 48 * 40 + 40 + 40 * 4 + 4);
  const std::int64_t es = bf16 ? 2 : 4;  // element size of params, grads and buckets
  ASSERT_EQ(static_cast<std::int64_t>(c10::elementSize(engine.dtype())), es);

  // The MLP's forward by hand, to look at the ledger in the middle of
  // backward: l1's output gradient arrives after l2's and l3's parameter
  // gradients, so their buckets have been filled and (stage 2, offload) the
  // last one launched is still held: nothing polls it before l1's gradients.
  GlobalBatch gb = global_batch(ModelKind::kMlp, 0);
  auto& mlp = static_cast<Mlp&>(*model);
  at::Tensor a1 = mlp.l1->forward(gb.x.narrow(0, comm.rank() * 2, 2).to(engine.dtype()));
  memory::LedgerSnapshot mid;
  a1.register_hook([&](const at::Tensor&) { mid = engine.ledger().snapshot(); });
  at::Tensor out = mlp.l3->forward(at::gelu(mlp.l2->forward(at::gelu(a1))));
  engine.backward(at::mse_loss(out.to(at::kFloat), gb.y.narrow(0, comm.rank() * 2, 2)));
  ASSERT_TRUE(engine.step());

  const memory::LedgerSnapshot s = engine.ledger().snapshot();
  const std::int64_t dev = s.model_state_bytes(Tier::kDevice), host = s.model_state_bytes(Tier::kHost);
  // Replicated state is exactly es bytes per parameter per copy; partitioned
  // state summed over the ranks is exactly its bytes per parameter (the
  // partitions tile the model), and each rank holds its 1/N share up to the
  // padding of the last chunk of each bucket.
  EXPECT_EQ(s.bytes(Tier::kDevice, Kind::kHalfParams), es * psi);
  if (offload) {
    // ZeRO-Offload: the device keeps the params; the host holds the rank's
    // fp32 gradient partition (two with DPU: double-buffered), fp32 master and
    // two moments.
    const std::int64_t grads_per_param = dpu ? 8 : 4;
    EXPECT_EQ(dev, es * psi);
    EXPECT_EQ(sum_over_ranks(comm, s.bytes(Tier::kHost, Kind::kGrads)), grads_per_param * psi);
    EXPECT_EQ(sum_over_ranks(comm, host), (grads_per_param + 4 + 8) * psi);
    EXPECT_NEAR(static_cast<double>(host), double(grads_per_param + 12) * psi / N,
                double(grads_per_param + 12) * 32 * N * 3);
    // The staging copy (half params on the host) is not model state.
    EXPECT_EQ(s.bytes(Tier::kHost, Kind::kStaging) > 0, bf16);
  } else {
    EXPECT_EQ(host, 0);
    // Stage 0 and 1 replicate params and grads; stage 2 only params.
    const std::int64_t replicated = stage == 2 ? es * psi : 2 * es * psi;
    const std::int64_t partitioned_per_param = stage == 0 ? 0 : stage == 1 ? 12 : 12 + es;
    if (stage == 0) {
      EXPECT_EQ(dev, (2 * es + 12) * psi);  // DDP: (4 + K) Psi in bf16
    } else {
      EXPECT_EQ(sum_over_ranks(comm, dev - replicated), partitioned_per_param * psi);
      const double formula = static_cast<double>(replicated) + partitioned_per_param * double(psi) / N;
      EXPECT_NEAR(static_cast<double>(dev), formula, partitioned_per_param * 32.0 * N * 3);
    }
  }
  EXPECT_GT(s.bytes(Tier::kDevice, Kind::kPadding), 0);  // reported apart
  EXPECT_EQ(s.bytes(Tier::kDevice, Kind::kStaging), 0);  // the construction copy is gone

  // Buckets: reported apart and never model state. The full-gradient stages
  // (0, 1 without offload) reduce in place in the gradient buffer; stage 2
  // and offload use transient buckets, at most three at a time (ZeRO-R's
  // constant-size buffers: two being reduced, one being filled). A bucket holds at most reduce_bucket_size
  // elements unless one parameter is larger (l2.weight: 1920 > 1000), and is
  // padded to N * 32.
  std::vector<std::size_t> numels;
  for (const auto& p : model->parameters()) numels.push_back(static_cast<std::size_t>(p.numel()));
  const FlatLayout layout(numels, static_cast<std::size_t>(cfg.zero_optimization.reduce_bucket_size),
                          static_cast<int>(N), stage == 0 ? 1 : static_cast<int>(N), kPlanAlignElements);
  const std::size_t largest = *std::max_element(numels.begin(), numels.end());
  const std::size_t align = static_cast<std::size_t>(N) * kPlanAlignElements;
  const std::size_t cap = std::max<std::size_t>(cfg.zero_optimization.reduce_bucket_size, largest);
  const std::int64_t bucket_bound = kPlanLiveBuckets * static_cast<std::int64_t>((cap + align - 1) / align * align) * es;
  const std::int64_t bucket_peak = s.peak[int(Tier::kDevice)][int(Kind::kBuckets)];
  EXPECT_EQ(s.bytes(Tier::kDevice, Kind::kBuckets), 0);  // all freed after backward
  if (stage == 2 || offload) {
    EXPECT_GT(bucket_peak, 0);
    EXPECT_LE(bucket_peak, bucket_bound);
    EXPECT_GT(mid.bytes(Tier::kDevice, Kind::kBuckets), 0);
  } else {
    EXPECT_EQ(bucket_peak, 0);
  }
  // Mid-backward the buckets were held, yet model-state bytes were those of
  // after the step: buckets, padding and staging are counted apart.
  EXPECT_EQ(mid.model_state_bytes(Tier::kDevice), dev);
  EXPECT_EQ(mid.tier_current[int(Tier::kDevice)],
            dev + mid.bytes(Tier::kDevice, Kind::kBuckets) + mid.bytes(Tier::kDevice, Kind::kPadding) +
                mid.bytes(Tier::kDevice, Kind::kStaging));

  // Communication: 2 * (N-1)/N * Psi elements of es bytes, where Psi is the
  // padded flat size of the documented layout (zero/flat_layout.h: the
  // buckets of reduce_bucket_size, each padded to N * 32 elements), plus, from
  // stage 1 on, one fp32 all-reduce of the squared gradient norm.
  const comm::CommStats& c = engine.last_step_comm();
  const std::int64_t padded = static_cast<std::int64_t>(layout.padded_numel());
  // Padding, as measured from the allocated buffers (the engine registers
  // each tensor's nbytes()): a replicated buffer holds padded - Psi elements
  // of it on every rank, a partitioned one padded - Psi over all ranks
  // together. A buffer allocated at another size than its share (a full-size
  // master or moment on every rank: ZeRO saving nothing) shows here even
  // where the model-state bytes, counted from the layout, look right.
  {
    const std::int64_t pad = padded - psi;
    const std::int64_t opt_bytes = 12;  // fp32 master + two moments
    std::int64_t want_dev = 0, want_host = 0;
    if (offload) {
      want_dev = N * pad * es;
      want_host = pad * ((dpu ? 8 : 4) + opt_bytes);
    } else if (stage == 0) {
      want_dev = N * pad * (2 * es + opt_bytes);
    } else if (stage == 1) {
      want_dev = N * pad * 2 * es + pad * opt_bytes;
    } else {
      want_dev = N * pad * es + pad * (es + opt_bytes);
    }
    EXPECT_EQ(sum_over_ranks(comm, s.bytes(Tier::kDevice, Kind::kPadding)), want_dev);
    EXPECT_EQ(sum_over_ranks(comm, s.bytes(Tier::kHost, Kind::kPadding)), want_host);
  }
  const std::uint64_t grads_and_params = static_cast<std::uint64_t>(2 * (N - 1) * padded / N * es);
  const std::uint64_t norm_bytes = stage == 0 ? 0 : static_cast<std::uint64_t>(2 * (N - 1) * 4);
  // The first step only: the ranks agree on the buckets' launch order, one
  // broadcast of 4 bytes per bucket (zero/zero/grad_reducer.h).
  const std::uint64_t order_bytes =
      comm::ring_bytes_sent(comm::CollectiveKind::kBroadcast, layout.buckets().size(), 4, static_cast<int>(N));
  EXPECT_EQ(c.bytes_sent[int(comm::CollectiveKind::kBroadcast)], order_bytes);
  EXPECT_EQ(c.total_bytes(), grads_and_params + norm_bytes + order_bytes);
  if (stage == 2 || offload) {
    EXPECT_EQ(c.bytes_sent[int(comm::CollectiveKind::kReduceScatter)], grads_and_params / 2);
    EXPECT_EQ(c.bytes_sent[int(comm::CollectiveKind::kAllGather)], grads_and_params / 2);
  }
  if (offload) {
    // es * Psi / N bytes each way: grads down and params up, in the training
    // precision (the host widens the grads to fp32 itself).
    EXPECT_EQ(engine.last_step_offload_bytes(), static_cast<std::uint64_t>(2 * es * padded / N));
  }
  // The summary prints every kind's peak.
  const std::string summary = engine.summary();
  EXPECT_NE(summary.find("params"), std::string::npos) << summary;
  EXPECT_NE(summary.find("(peak "), std::string::npos) << summary;
  if (stage == 2 || offload) {
    EXPECT_NE(summary.find("buckets 0 B (peak " + memory::format_bytes(bucket_peak) + ")"), std::string::npos)
        << summary;
  }
}

std::string formula_name(const testing::TestParamInfo<FormulaCase>& info) {
  const FormulaCase& f = info.param;
  return "stage" + std::to_string(f.stage) + (f.offload ? "_offload" : "") + (f.bf16 ? "_bf16" : "_fp32") +
         (f.dpu ? "_dpu" : "");
}

INSTANTIATE_TEST_SUITE_P(Stages, Formula,
                         testing::Values(FormulaCase{0, false}, FormulaCase{1, false},
                                         FormulaCase{2, false}, FormulaCase{1, true},
                                         FormulaCase{2, true}, FormulaCase{0, false, false},
                                         FormulaCase{1, false, false}, FormulaCase{2, false, false},
                                         FormulaCase{2, true, false}, FormulaCase{1, true, true, true},
                                         FormulaCase{2, true, false, true}),
                         formula_name);

TEST(Ledger, ModelStateBytesExcludeBucketsPaddingAndStaging) {
  memory::MemoryLedger ledger;
  auto a = ledger.add(Tier::kDevice, Kind::kHalfParams, 100, "params");
  auto b = ledger.add(Tier::kDevice, Kind::kGrads, 20, "grads");
  auto c = ledger.add(Tier::kDevice, Kind::kFp32Master, 3, "master");
  auto d = ledger.add(Tier::kDevice, Kind::kMoments, 4000, "moments");
  auto e = ledger.add(Tier::kDevice, Kind::kBuckets, 50000, "bucket");
  auto f = ledger.add(Tier::kDevice, Kind::kPadding, 600000, "padding");
  auto g = ledger.add(Tier::kDevice, Kind::kStaging, 7000000, "staging");
  const memory::LedgerSnapshot s = ledger.snapshot();
  EXPECT_EQ(s.model_state_bytes(Tier::kDevice), 4123);
  EXPECT_EQ(s.tier_current[int(Tier::kDevice)], 7654123);
}

// ---- DPU: equals a serial reference that applies each update a step late --

struct SerialResult {
  std::vector<float> losses;      // NaN for a skipped step
  std::vector<at::Tensor> master;
};

// Plain LibTorch AdamW on the fp32 MLP over the same global batches. With
// `warmup` >= 0 it is the delayed update's reference: the model used for
// forward/backward gets master_{t-1} after step t once `warmup` steps have
// been taken, master_t before. `skip_step`: a step whose gradient overflowed,
// which is the identity (no optimizer step, the model gets the newest
// master; with catch_up false it keeps the parameters it ran on, which is
// what the engine must not do).
SerialResult serial_reference(const config::Config& cfg, int steps, int warmup, int skip_step = -1,
                              bool catch_up = true) {
  auto model = make_model(ModelKind::kMlp);
  std::vector<at::Tensor> master;
  for (const auto& p : model->parameters()) master.push_back(p.detach().clone().set_requires_grad(true));
  torch::optim::AdamW opt(master, torch::optim::AdamWOptions(cfg.optimizer.lr)
                                      .betas({cfg.optimizer.beta1, cfg.optimizer.beta2})
                                      .eps(cfg.optimizer.eps)
                                      .weight_decay(cfg.optimizer.weight_decay));
  const int accum = static_cast<int>(cfg.gradient_accumulation_steps);
  SerialResult r;
  int taken = 0;
  for (int t = 0; t < steps; ++t) {
    auto params = model->parameters();
    if (t == skip_step) {
      r.losses.push_back(std::numeric_limits<float>::quiet_NaN());
      torch::NoGradGuard ng;
      if (catch_up) {
        for (std::size_t i = 0; i < master.size(); ++i) params[i].copy_(master[i].detach());
      }
      continue;
    }
    GlobalBatch gb = global_batch(ModelKind::kMlp, t);
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    r.losses.push_back(accumulate_reference_grads(ModelKind::kMlp, *model, gb, accum));
    std::vector<at::Tensor> before;
    for (std::size_t i = 0; i < master.size(); ++i) {
      before.push_back(master[i].detach().clone());
      master[i].mutable_grad() = params[i].grad().clone();
    }
    torch::nn::utils::clip_grad_norm_(master, cfg.gradient_clipping);
    opt.step();
    const bool delayed = warmup >= 0 && taken >= warmup;
    ++taken;
    torch::NoGradGuard ng;
    for (std::size_t i = 0; i < master.size(); ++i) params[i].copy_(delayed ? before[i] : master[i].detach());
  }
  for (const auto& m : master) r.master.push_back(m.detach());
  return r;
}

void expect_matches(const RunResult& got, const SerialResult& ref, double loss_rtol, double param_rtol,
                    double param_atol, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (std::size_t t = 0; t < ref.losses.size(); ++t) {
    if (std::isnan(ref.losses[t])) continue;
    EXPECT_NEAR(got.losses[t], ref.losses[t], loss_rtol * std::abs(ref.losses[t])) << what << " step " << t;
  }
  ASSERT_EQ(got.params.size(), ref.master.size());
  for (std::size_t i = 0; i < ref.master.size(); ++i) {
    const at::Tensor diff = (got.params[i] - ref.master[i]).abs();
    EXPECT_TRUE((diff <= ref.master[i].abs() * param_rtol + param_atol).all().item<bool>())
        << what << " parameter " << i << " max diff " << diff.max().item<double>();
  }
}

TEST(DelayedUpdate, EqualsSerialOneStepLateReference) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  constexpr int kSteps = 8, kWarmup = 3, kAccum = 2;
  // Stage 1 and 2; at stage 2 also with 40% of the optimizer state stepped
  // where the model is (offload_optimizer.ratio 0.6), whose update must wait
  // for the CPU share's.
  for (auto [stage, ratio] : {std::pair{1, 1.0f}, std::pair{2, 1.0f}, std::pair{2, 0.6f}}) {
    config::Config cfg = make_config(stage, true, false, world, kGlobalBatch / kAccum / world, kAccum);
    cfg.zero_optimization.offload_optimizer.delayed_param_update = true;
    cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = kWarmup;
    cfg.zero_optimization.offload_optimizer.ratio = ratio;
    RunResult got = train(ModelKind::kMlp, cfg, comm, kSteps);
    expect_matches(got, serial_reference(cfg, kSteps, kWarmup), 1e-5, 1e-5, 1e-6,
                   "stage " + std::to_string(stage) + " ratio " + std::to_string(ratio));

    // And the delay is real: up to and including the first delayed step the
    // two runs are the same computation, bit for bit; the step after it runs
    // on older parameters, so its loss differs.
    cfg.zero_optimization.offload_optimizer.delayed_param_update = false;
    RunResult plain = train(ModelKind::kMlp, cfg, comm, kSteps);
    for (int k = 0; k <= kWarmup; ++k) EXPECT_EQ(plain.losses[k], got.losses[k]) << "stage " << stage << " step " << k;
    EXPECT_GT(std::abs(plain.losses[kWarmup + 1] - got.losses[kWarmup + 1]), 1e-6);
  }
}

// offload_optimizer.publish_in_backward: on one rank each piece of the
// pending update goes into the model during the backward that ends the
// window, once the worker has stepped it and backward is done with its
// bucket. Training is bit for bit the publish after backward (a piece that
// went in before backward was done with its bucket would change that
// bucket's gradient). Left unset it is off. The hook gives the worker time to finish its pieces
// before the window's micro-batches, so that they do go in early. (A
// transformer: its backward reads earlier layers' weights after later
// buckets are reduced, which a two-layer MLP's does not.) With
// several ranks the key is ignored (the update is all-gathered after
// backward) and nothing goes in early.
TEST(DelayedUpdate, PublishInBackwardIsBitwiseThePublishAfterIt) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  constexpr int kSteps = 7, kWarmup = 2;
  struct Case {
    int stage;
    float ratio;
    bool bf16;
    int accum;
  };
  for (const Case c : {Case{1, 1.0f, false, 1}, Case{2, 1.0f, false, 2}, Case{2, 0.6f, false, 1},
                       Case{2, 1.0f, true, 2}}) {
    const std::string what = "stage " + std::to_string(c.stage) + " ratio " + std::to_string(c.ratio) +
                             (c.bf16 ? " bf16" : " fp32") + " accumulation " + std::to_string(c.accum);
    config::Config cfg = make_config(c.stage, true, c.bf16, world, kGlobalBatch / c.accum / world, c.accum);
    cfg.zero_optimization.offload_optimizer.delayed_param_update = true;
    cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = kWarmup;
    cfg.zero_optimization.offload_optimizer.ratio = c.ratio;
    cfg.zero_optimization.reduce_bucket_size = 1000;  // several buckets, each its own moment in backward
    cfg.zero_optimization.offload_optimizer.publish_in_backward = false;
    const RunResult after = train(ModelKind::kTransformer, cfg, comm, kSteps);
    auto let_the_worker_finish = [](int, Engine&) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); };
    cfg.zero_optimization.offload_optimizer.publish_in_backward.reset();
    const RunResult unset = train(ModelKind::kTransformer, cfg, comm, kSteps, let_the_worker_finish);
    cfg.zero_optimization.offload_optimizer.publish_in_backward = true;
    const RunResult in = train(ModelKind::kTransformer, cfg, comm, kSteps, let_the_worker_finish);
    ASSERT_EQ(unset.losses, in.losses) << what << ": unset is not the same training as true";
    for (const StepStats& s : unset.stats) {
      EXPECT_FALSE(s.publish_in_backward) << what << ": unset is off";
      EXPECT_EQ(s.published_in_backward, 0) << what << ": unset, pieces went in during backward";
    }
    for (const StepStats& s : after.stats) EXPECT_FALSE(s.publish_in_backward) << what << ": false is off";
    for (const StepStats& s : in.stats) EXPECT_EQ(s.publish_in_backward, world == 1) << what << ": true applies where it can";
    ASSERT_EQ(in.losses.size(), after.losses.size());
    for (std::size_t k = 0; k < after.losses.size(); ++k) EXPECT_EQ(in.losses[k], after.losses[k]) << what << " step " << k;
    ASSERT_EQ(in.params.size(), after.params.size());
    for (std::size_t i = 0; i < after.params.size(); ++i) {
      EXPECT_TRUE(at::equal(in.params[i], after.params[i])) << what << " parameter " << i;
    }
    std::int64_t early = 0;
    for (std::size_t k = 0; k < in.stats.size(); ++k) {
      const StepStats& s = in.stats[k];
      EXPECT_LE(s.published_in_backward, s.published_pieces) << what << " step " << k;
      if (k <= static_cast<std::size_t>(kWarmup)) {
        EXPECT_EQ(s.published_pieces, 0) << what << " step " << k;
      }
      early += s.published_in_backward;
      EXPECT_EQ(after.stats[k].published_in_backward, 0) << what << " step " << k;
    }
    if (world == 1) {
      EXPECT_GT(early, 0) << what << ": nothing went in during backward";
    } else {
      EXPECT_EQ(early, 0) << what << ": with " << world << " ranks the update goes in after backward";
    }
  }
}

// One micro-batch of the MLP through the engine: backward, then step().
bool mlp_step(Engine& engine, torch::nn::Module& model, comm::Communicator& comm, int step) {
  const int micro = kGlobalBatch / comm.world_size();
  GlobalBatch gb = global_batch(ModelKind::kMlp, step);
  engine.backward(micro_loss(ModelKind::kMlp, model, gb.x.narrow(0, comm.rank() * micro, micro),
                             gb.y.narrow(0, comm.rank() * micro, micro), engine.dtype()));
  return engine.step();
}

// publish_in_backward where it does not apply (stage 3 here): said true, the
// engine warns that it is ignored and why; left unset (the default, on
// where it applies) it says nothing.
TEST(DelayedUpdate, PublishInBackwardWarnsOnlyWhenSaidWhereItDoesNotApply) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  config::Config cfg = make_config(3, true, false, world, kGlobalBatch / world, 1);
  cfg.zero_optimization.offload_optimizer.delayed_param_update = true;
  for (const bool said : {false, true}) {
    if (said) cfg.zero_optimization.offload_optimizer.publish_in_backward = true;
    auto model = make_model(ModelKind::kMlp);
    testing::internal::CaptureStderr();
    {
      Engine engine(model, cfg, comm);
      EXPECT_TRUE(mlp_step(engine, *model, comm, 0));
      EXPECT_FALSE(engine.stats().publish_in_backward);
    }
    const std::string err = testing::internal::GetCapturedStderr();
    if (comm.rank() != 0) continue;
    const bool warned = err.find("publish_in_backward is ignored: stage 3") != std::string::npos;
    EXPECT_EQ(warned, said) << err;
  }
}

// publish_in_backward, a backward that fails after part of the pending
// update went in: the rest goes in before the error reaches the caller, so
// the model holds the updated weights whole, as flush() would leave them on
// a run that never failed, and training goes on.
TEST(DelayedUpdate, ABackwardThatFailsAfterPartOfTheUpdateWentInTakesTheRest) {
  comm::Communicator& comm = world_comm();
  if (comm.world_size() != 1) GTEST_SKIP() << "publish_in_backward applies on one rank";
  constexpr int kFailAt = 3;
  config::Config cfg = make_config(2, true, false, 1, kGlobalBatch, 1);
  cfg.zero_optimization.offload_optimizer.delayed_param_update = true;
  cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = 1;
  cfg.zero_optimization.reduce_bucket_size = 1000;
  auto weights_at_failure = [&](bool publish) {
    cfg.zero_optimization.offload_optimizer.publish_in_backward = publish;
    auto model = make_model(ModelKind::kTransformer);
    Engine engine(model, cfg, comm);
    const GlobalBatch gb = global_batch(ModelKind::kTransformer, 0);
    auto loss_of = [&] { return micro_loss(ModelKind::kTransformer, *model, gb.x, gb.y, engine.dtype()); };
    for (int t = 0; t < kFailAt; ++t) {
      engine.backward(loss_of());
      engine.step();
    }
    std::vector<at::Tensor> w;
    if (publish) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the worker's pieces are done
      // "pos" is used first in forward: its gradient comes last, after the
      // other buckets are reduced and their pieces have gone in.
      at::Tensor pos = model->named_parameters()["pos"];
      const unsigned hook = pos.register_hook([](const at::Tensor& g) -> at::Tensor {
        throw std::runtime_error("planted failure in backward");
      });
      try {
        engine.backward(loss_of());
        ADD_FAILURE() << "the planted failure did not reach the caller";
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("planted failure in backward"), std::string::npos) << e.what();
      }
      pos.remove_hook(hook);
    } else {
      engine.flush();  // the pending update, whole
    }
    for (const auto& p : model->parameters()) w.push_back(p.detach().clone());
    // Training goes on from there.
    engine.backward(loss_of());
    engine.step();
    engine.flush();
    EXPECT_TRUE(std::isfinite(loss_of().item<float>()));
    return w;
  };
  const std::vector<at::Tensor> failed = weights_at_failure(true), whole = weights_at_failure(false);
  ASSERT_EQ(failed.size(), whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i) {
    EXPECT_TRUE(at::equal(failed[i], whole[i])) << "parameter " << i << ": part of the update is missing";
  }
}

// StepStats' timing of the delayed update: nothing until a delayed step is
// pending at a step(), then how long its CPU step ran (more than nothing)
// and how long the host waited for it (never longer than the step before
// took to run plus the wait: the wait is inside the step() call).
TEST(DelayedUpdate, StepStatsTimeTheCpuStepAndTheWait) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  constexpr int kSteps = 6, kWarmup = 2;
  config::Config cfg = make_config(2, true, false, world, kGlobalBatch / world, 1);
  cfg.zero_optimization.offload_optimizer.delayed_param_update = true;
  cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = kWarmup;
  const RunResult got = train(ModelKind::kMlp, cfg, comm, kSteps);
  ASSERT_EQ(got.stats.size(), static_cast<std::size_t>(kSteps));
  for (int k = 0; k < kSteps; ++k) {
    const StepStats& s = got.stats[static_cast<std::size_t>(k)];
    // step() k finds the step before's CPU step pending from k = warmup + 1 on.
    if (k <= kWarmup) {
      EXPECT_EQ(s.delayed_cpu_ms, 0.0) << "step " << k;
      EXPECT_EQ(s.delayed_wait_ms, 0.0) << "step " << k;
    } else {
      EXPECT_GT(s.delayed_cpu_ms, 0.0) << "step " << k;
      EXPECT_GE(s.delayed_wait_ms, 0.0) << "step " << k;
      EXPECT_LT(s.delayed_wait_ms, 60000.0) << "step " << k;
    }
  }
  cfg.zero_optimization.offload_optimizer.delayed_param_update = false;
  for (const StepStats& s : train(ModelKind::kMlp, cfg, comm, 3).stats) {
    EXPECT_EQ(s.delayed_cpu_ms, 0.0);
    EXPECT_EQ(s.delayed_wait_ms, 0.0);
  }
}

TEST(DelayedUpdate, SkippedStepIsTheIdentityUnderTheDelay) {
  // engine.h: a skipped step submits nothing, nothing is pending after it,
  // and the next step runs on the newest parameters; in the serial reference
  // the skipped step is the identity. The inf comes after warm-up, on the
  // last rank only, in the second micro-batch of the step.
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size(), rank = comm.rank();
  constexpr int kSteps = 8, kWarmup = 2, kAccum = 2, kSkip = 4;
  for (int stage : {1, 2}) {
    config::Config cfg = make_config(stage, true, false, world, kGlobalBatch / kAccum / world, kAccum);
    cfg.zero_optimization.offload_optimizer.delayed_param_update = true;
    cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = kWarmup;
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
    const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
    RunResult got;
    for (int t = 0; t < kSteps; ++t) {
      GlobalBatch gb = global_batch(ModelKind::kMlp, t);
      float loss_sum = 0.0f;
      bool stepped = false;
      for (int j = 0; j < kAccum; ++j) {
        const int begin = j * (kGlobalBatch / kAccum) + rank * micro;
        at::Tensor loss = micro_loss(ModelKind::kMlp, *model, gb.x.narrow(0, begin, micro),
                                     gb.y.narrow(0, begin, micro), engine.dtype());
        if (t == kSkip && j == 1 && rank == world - 1) loss = loss * std::numeric_limits<float>::infinity();
        engine.backward(loss);
        stepped = engine.step();
        loss_sum += loss.item<float>();
      }
      EXPECT_EQ(stepped, t != kSkip) << "stage " << stage << " step " << t;
      EXPECT_EQ(engine.stats().last_step_skipped, t == kSkip);
      comm.all_reduce(&loss_sum, 1, DType::kFloat32)->wait();
      got.losses.push_back(loss_sum / static_cast<float>(world * kAccum));
    }
    engine.flush();
    got.params = engine.gather_master_params();
    EXPECT_EQ(engine.stats().skipped, 1);
    EXPECT_EQ(engine.stats().step, kSteps - 1);
    const std::string what = "stage " + std::to_string(stage);
    expect_matches(got, serial_reference(cfg, kSteps, kWarmup, kSkip), 1e-5, 1e-5, 1e-6, what);
    // The check can tell: had the step after the skip still run on the
    // parameters the skipped step ran on, its loss would differ.
    const SerialResult stale = serial_reference(cfg, kSteps, kWarmup, kSkip, /*catch_up=*/false);
    EXPECT_GT(std::abs(got.losses[kSkip + 1] - stale.losses[kSkip + 1]), 1e-4 * stale.losses[kSkip + 1]) << what;
  }
}

TEST(DelayedUpdate, Bf16FollowsTheDelayedReference) {
  // bf16 with DPU against the same fp32 serial reference, within parity's
  // bf16 tolerance (engine_parity_test.cpp explains it), and bit for bit
  // equal to the undelayed bf16 run up to the first delayed step.
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  constexpr int kSteps = 8, kWarmup = 3, kAccum = 2;
  config::Config cfg = make_config(2, true, /*bf16=*/true, world, kGlobalBatch / kAccum / world, kAccum);
  cfg.zero_optimization.offload_optimizer.delayed_param_update = true;
  cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = kWarmup;
  RunResult got = train(ModelKind::kMlp, cfg, comm, kSteps);
  const SerialResult delayed = serial_reference(cfg, kSteps, kWarmup);
  expect_matches(got, delayed, 2e-2, 0.0, kBf16ParamBound, "bf16 DPU");
  double max_diff = 0.0;
  for (std::size_t i = 0; i < got.params.size(); ++i) {
    max_diff = std::max(max_diff, (got.params[i] - delayed.master[i]).abs().max().item<double>());
  }
  std::printf("[ measured ] bf16 DPU: max |param - fp32 reference| = %.3g\n", max_diff);
  cfg.zero_optimization.offload_optimizer.delayed_param_update = false;
  RunResult plain = train(ModelKind::kMlp, cfg, comm, kSteps);
  for (int k = 0; k <= kWarmup; ++k) EXPECT_EQ(plain.losses[k], got.losses[k]) << "step " << k;
  // The delay shows through bf16 noise: the loss after the first delayed
  // step is closer to the delayed reference than to the undelayed one.
  const SerialResult undelayed = serial_reference(cfg, kSteps, -1);
  const int k = kWarmup + 1;
  EXPECT_LT(std::abs(got.losses[k] - delayed.losses[k]), std::abs(got.losses[k] - undelayed.losses[k]));
}

// ---- Tied weights against a plain LibTorch loop -------------------------

TEST(Modules, TiedWeightsMatchPlainLibTorch) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  constexpr int kSteps = 6, kAccum = 2;
  {
    auto probe = make_model(ModelKind::kTiedMlp);
    ASSERT_EQ(probe->parameters().size(), 7u);  // l2.weight is listed twice
  }
  // The reference: torch::optim::AdamW over the unique parameters, gradient
  // clipping by the global norm, the same global batches.
  auto model = make_model(ModelKind::kTiedMlp);
  std::vector<at::Tensor> params;
  for (const auto& p : model->parameters()) {
    if (std::none_of(params.begin(), params.end(), [&](const at::Tensor& q) { return q.is_same(p); })) {
      params.push_back(p);
    }
  }
  ASSERT_EQ(params.size(), 6u);
  // Clip below this model's gradient norms (0.39 falling to 0.32 over the
  // run), so that it fires.
  config::Config cfg = make_config(0, false, false, world, kGlobalBatch / kAccum / world, kAccum, 0.25f);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(cfg.optimizer.lr)
                                      .betas({cfg.optimizer.beta1, cfg.optimizer.beta2})
                                      .eps(cfg.optimizer.eps)
                                      .weight_decay(cfg.optimizer.weight_decay));
  std::vector<float> ref_losses, ref_norms;
  for (int t = 0; t < kSteps; ++t) {
    GlobalBatch gb = global_batch(ModelKind::kTiedMlp, t);
    opt.zero_grad();
    ref_losses.push_back(accumulate_reference_grads(ModelKind::kTiedMlp, *model, gb, kAccum));
    ref_norms.push_back(static_cast<float>(torch::nn::utils::clip_grad_norm_(params, cfg.gradient_clipping)));
    opt.step();
  }
  EXPECT_GT(*std::max_element(ref_norms.begin(), ref_norms.end()), cfg.gradient_clipping)
      << "clipping never fired";

  for (int stage : {0, 2}) {
    cfg.zero_optimization.stage = stage;
    RunResult got = train(ModelKind::kTiedMlp, cfg, comm, kSteps);
    ASSERT_EQ(got.params.size(), params.size());
    for (int t = 0; t < kSteps; ++t) {
      EXPECT_NEAR(got.losses[t], ref_losses[t], 1e-5 * std::abs(ref_losses[t])) << "stage " << stage << " step " << t;
      EXPECT_NEAR(got.stats[t].grad_norm, ref_norms[t], 1e-5 * ref_norms[t]) << "stage " << stage << " step " << t;
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      const at::Tensor ref = params[i].detach();
      const at::Tensor diff = (got.params[i] - ref).abs();
      EXPECT_TRUE((diff <= ref.abs() * 1e-5 + 1e-6).all().item<bool>())
          << "stage " << stage << " parameter " << i << " max diff " << diff.max().item<double>();
    }
  }
}

// ---- Overflow: an injected inf skips the step on every rank --------------

TEST(Overflow, InjectedInfSkipsStepOnEveryRank) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  for (int stage : {0, 2}) {
    config::Config cfg = make_config(stage, false, false, world, kGlobalBatch / world, 1);
    cfg.fp16.enabled = false;
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
    std::vector<at::Tensor> before;
    int skipped = 0;
    for (int step = 0; step < 4; ++step) {
      GlobalBatch gb = global_batch(ModelKind::kMlp, step);
      const int micro = kGlobalBatch / world;
      at::Tensor loss = micro_loss(ModelKind::kMlp, *model, gb.x.narrow(0, comm.rank() * micro, micro),
                                   gb.y.narrow(0, comm.rank() * micro, micro), engine.dtype());
      // Only the last rank sees the inf: the skip must still happen everywhere.
      const bool inject = step == 2 && comm.rank() == world - 1;
      if (inject) loss = loss * std::numeric_limits<float>::infinity();
      if (step == 2) before = engine.gather_master_params();
      engine.backward(loss);
      const bool stepped = engine.step();
      EXPECT_EQ(stepped, step != 2) << "stage " << stage << " step " << step;
      skipped += stepped ? 0 : 1;
      if (step == 2) {
        auto after = engine.gather_master_params();
        for (std::size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(after[i].equal(before[i]));
        for (const auto& p : model->parameters()) EXPECT_TRUE(at::isfinite(p).all().item<bool>());
      }
    }
    EXPECT_EQ(engine.stats().skipped, 1);
    EXPECT_EQ(engine.stats().step, 3);
  }
}

// Stage 2 with DeepSpeed's linear WarmupLR from 0 to 1e-2 over `steps`.
config::Config linear_warmup_config(int world, int steps) {
  config::Config cfg = make_config(2, false, false, world, kGlobalBatch / world, 1);
  cfg.scheduler.type = "WarmupLR";
  cfg.scheduler.warmup_type = "linear";
  cfg.scheduler.warmup_num_steps = steps;
  cfg.scheduler.warmup_min_lr = 0.0f;
  cfg.scheduler.warmup_max_lr = 1e-2f;
  return cfg;
}

// A "scheduler" in the config is the engine's, stepped as DeepSpeed steps it:
// after each optimizer step taken and not after a skipped one, so the step
// after n taken runs at lr(n - 1) (the first at warmup_min_lr). The rates
// are DeepSpeed's linear warm-up, k / 4 * 1e-2, written out. set_lr() then
// takes over.
TEST(Schedule, TheConfigsSchedulerIsSteppedAfterEachStepTaken) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const config::Config cfg = linear_warmup_config(world, 4);
  auto model = make_model(ModelKind::kMlp);
  Engine engine(model, cfg, comm);
  const std::vector<float> want = {0.0f, 0.0f, 0.0f, 2.5e-3f, 5e-3f, 7.5e-3f, 1e-2f, 1e-2f};
  for (int step = 0; step < static_cast<int>(want.size()); ++step) {
    EXPECT_FLOAT_EQ(engine.lr(), want[static_cast<std::size_t>(step)]) << "step " << step;
    GlobalBatch gb = global_batch(ModelKind::kMlp, step);
    const int micro = kGlobalBatch / world;
    at::Tensor loss = micro_loss(ModelKind::kMlp, *model, gb.x.narrow(0, comm.rank() * micro, micro),
                                 gb.y.narrow(0, comm.rank() * micro, micro), engine.dtype());
    if (step == 1) loss = loss * std::numeric_limits<float>::infinity();  // skipped: the schedule waits
    engine.backward(loss);
    EXPECT_EQ(engine.step(), step != 1);
    EXPECT_FLOAT_EQ(engine.stats().lr, want[static_cast<std::size_t>(step)]) << "step " << step;
  }
  engine.set_lr(3e-3f);
  EXPECT_FLOAT_EQ(engine.lr(), 3e-3f);
  GlobalBatch gb = global_batch(ModelKind::kMlp, 0);
  const int micro = kGlobalBatch / world;
  engine.backward(micro_loss(ModelKind::kMlp, *model, gb.x.narrow(0, comm.rank() * micro, micro),
                             gb.y.narrow(0, comm.rank() * micro, micro), engine.dtype()));
  engine.step();
  EXPECT_FLOAT_EQ(engine.stats().lr, 3e-3f);
  EXPECT_FLOAT_EQ(engine.lr(), 3e-3f);
}

// A OneCycle scheduler's betas: (cycle_min_mom, 0.99) before the first step
// (DeepSpeed sets them at construction), kept where the cycle left them
// once set_lr() takes the rate over (DeepSpeed's param groups keep them),
// and a momentum decay that would take beta1 to 1 or past it stops the run
// at that step with the fix named, before anything is stepped.
TEST(Schedule, OneCycleBetasAreHeldAfterSetLrAndKeptBelowOne) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  config::Config cfg = make_config(2, false, false, world, kGlobalBatch / world, 1);
  cfg.scheduler.type = "OneCycle";
  config::OneCycleConfig& c = cfg.scheduler.one_cycle;
  c.cycle_min_lr = 1e-3f;
  c.cycle_max_lr = 1e-2f;
  c.cycle_first_step_size = c.cycle_second_step_size = 2;
  c.cycle_min_mom = 0.9f;
  c.cycle_max_mom = 0.95f;
  c.decay_step_size = 1;
  c.decay_mom_rate = 0.03f;  // beta1 0.95 * (1 + 0.03 k) after the cycle: past 1 at k = 2
  {
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
    EXPECT_FLOAT_EQ(engine.betas().first, 0.9f);
    EXPECT_FLOAT_EQ(engine.betas().second, 0.99f);
    EXPECT_FLOAT_EQ(engine.lr(), 1e-3f);
    ASSERT_TRUE(mlp_step(engine, *model, comm, 0));
    ASSERT_TRUE(mlp_step(engine, *model, comm, 1));
    const std::pair<float, float> left = engine.betas();
    EXPECT_FLOAT_EQ(left.first, 0.9f);  // the peak of the rate: beta1 at cycle_min_mom
    EXPECT_NE(engine.lr(), 2e-3f);
    engine.set_lr(2e-3f);
    EXPECT_EQ(engine.betas(), left);
    ASSERT_TRUE(mlp_step(engine, *model, comm, 2));
    EXPECT_EQ(engine.betas(), left);
    EXPECT_FLOAT_EQ(engine.lr(), 2e-3f);
  }
  auto model = make_model(ModelKind::kMlp);
  Engine engine(model, cfg, comm);
  for (int step = 0; step < 5; ++step) ASSERT_TRUE(mlp_step(engine, *model, comm, step)) << step;
  EXPECT_NEAR(engine.betas().first, 0.95 * 1.03, 1e-6);
  ASSERT_TRUE(mlp_step(engine, *model, comm, 5));
  const std::vector<at::Tensor> before = engine.gather_master_params();
  try {
    mlp_step(engine, *model, comm, 6);
    FAIL() << "beta1 " << engine.betas().first << " was stepped";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("OneCycle's momentum cycle gives beta1 1.007 for optimizer step 7: Adam "
                                         "and Lion need beta1 < 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lower scheduler.params.decay_mom_rate"), std::string::npos) << e.what();
  }
  const std::vector<at::Tensor> after = engine.gather_master_params();
  for (std::size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(after[i].equal(before[i])) << "parameter " << i;
  // Its checkpoint (the next step's beta1 past 1 in it) loads, into a run
  // with the decay fixed, which steps on.
  const std::filesystem::path dir = shared_temp_dir(comm, "zero_past_one_", "ckpt");
  engine.save_checkpoint(dir.string(), "past");
  cfg.scheduler.one_cycle.decay_mom_rate = 0.0f;
  auto fixed_model = make_model(ModelKind::kMlp);
  Engine fixed(fixed_model, cfg, comm);
  fixed.load_checkpoint(dir.string(), "past");
  EXPECT_FLOAT_EQ(fixed.betas().first, 0.95f);
  EXPECT_TRUE(mlp_step(fixed, *fixed_model, comm, 6));
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

// Skipped steps are numbered as windows (DeepSpeed's global_steps): a step
// taken, then two skipped in a row, are steps 1, 2, 3 in the messages (not
// "step 2 skipped" twice), and the summary counts the optimizer steps apart.
TEST(Schedule, SkippedStepsAreNumberedByWindow) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  auto model = make_model(ModelKind::kMlp);
  Engine engine(model, make_config(2, false, false, world, kGlobalBatch / world, 1), comm);
  testing::internal::CaptureStderr();
  for (int step = 0; step < 3; ++step) {
    GlobalBatch gb = global_batch(ModelKind::kMlp, step);
    const int micro = kGlobalBatch / world;
    at::Tensor loss = micro_loss(ModelKind::kMlp, *model, gb.x.narrow(0, comm.rank() * micro, micro),
                                 gb.y.narrow(0, comm.rank() * micro, micro), engine.dtype());
    if (step > 0) loss = loss * std::numeric_limits<float>::quiet_NaN();
    engine.backward(loss);
    EXPECT_EQ(engine.step(), step == 0);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  if (comm.rank() != 0) return;
  EXPECT_NE(err.find("step 2 skipped: the gradient norm is not finite"), std::string::npos) << err;
  EXPECT_NE(err.find("step 3 skipped: the gradient norm is not finite (a NaN/inf loss or gradient); 2 step(s) "
                     "skipped so far, 2 in a row"), std::string::npos) << err;
  EXPECT_NE(engine.summary().find("optimizer steps 1, skipped 2"), std::string::npos) << engine.summary();
}

// optimizer.params.bias_correction reaches the step: Adam's first step from
// zero moments moves each weight by lr * (1-b1) g / (sqrt(1-b2) |g| + eps),
// about 3.16 lr, without the corrections, and by about lr with them.
// set_lr() takes what the config's optimizer.params.lr takes: a NaN would
// make every master weight NaN, a negative rate climb the loss.
TEST(Optimizer, SetLrRefusesWhatTheConfigWould) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  auto model = make_model(ModelKind::kMlp);
  Engine engine(model, make_config(2, true, false, world, kGlobalBatch / world, 1), comm);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -1.0f}) {
    try {
      engine.set_lr(bad);
      ADD_FAILURE() << "set_lr(" << bad << ") was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the learning rate must be a finite number >= 0"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(engine.lr(), engine.config().optimizer.lr) << "set_lr(" << bad << ") changed the rate";
  }
  engine.set_lr(0.0f);
  EXPECT_EQ(engine.lr(), 0.0f);
}

TEST(Optimizer, BiasCorrectionOffStepsWithTheRawMoments) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  for (bool correct : {true, false}) {
    config::Config cfg = make_config(2, false, false, world, kGlobalBatch / world, 1, /*clipping=*/0.0f);
    cfg.optimizer.weight_decay = 0.0f;
    cfg.optimizer.eps = 1e-12f;
    cfg.optimizer.bias_correction = correct;
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
    const std::vector<at::Tensor> before = engine.gather_master_params();
    GlobalBatch gb = global_batch(ModelKind::kMlp, 0);
    const int micro = kGlobalBatch / world;
    engine.backward(micro_loss(ModelKind::kMlp, *model, gb.x.narrow(0, comm.rank() * micro, micro),
                               gb.y.narrow(0, comm.rank() * micro, micro), engine.dtype()));
    ASSERT_TRUE(engine.step());
    const std::vector<at::Tensor> after = engine.gather_master_params();
    const double want = cfg.optimizer.lr * (correct ? 1.0 : (1.0 - 0.9) / std::sqrt(1.0 - 0.999));
    for (std::size_t i = 0; i < after.size(); ++i) {
      const double moved = (after[i] - before[i]).abs().max().item<double>();
      EXPECT_NEAR(moved, want, 1e-2 * want) << "parameter " << i << " bias_correction " << correct;
    }
  }
}

// What Muon refuses, before anything is allocated, naming the fix: its
// state outside host or device memory (NVMe) or in two shares (a device
// share), a use_muon rule with another optimizer, Muon for a parameter of
// fewer than two dimensions.
TEST(Optimizer, MuonRefusesWhatItCannotStep) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  auto muon = [&](int stage, bool offload) {
    config::Config cfg = make_config(stage, offload, false, world, kGlobalBatch / world, 1);
    cfg.optimizer.type = "Muon";
    return cfg;
  };
  config::Config nvme = muon(2, true);
  nvme.zero_optimization.offload_optimizer.device = "nvme";
  nvme.zero_optimization.offload_optimizer.nvme_path = "/tmp";
  expect_engine_error(ModelKind::kMlp, nvme, comm, "optimizer \"Muon\" with offload_optimizer.device \"nvme\" is "
                                                   "not available");
  config::Config share = muon(2, true);
  share.zero_optimization.offload_optimizer.ratio = 0.5f;
  expect_engine_error(ModelKind::kMlp, share, comm, "optimizer \"Muon\" with offload_optimizer.ratio 0.5 is not "
                                                    "available");
  auto refused = [&](const config::Config& cfg, EngineOptions options, const std::string& needle) {
    auto model = make_model(ModelKind::kMlp);
    try {
      Engine engine(model, cfg, comm, std::move(options));
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  EngineOptions rule;
  rule.use_muon = [](const std::string&, const at::Tensor&) { return std::optional<bool>(true); };
  refused(make_config(2, false, false, world, kGlobalBatch / world, 1), rule,
          "EngineOptions::use_muon is given but the optimizer is AdamW");
  refused(muon(2, false), rule, "EngineOptions::use_muon gave Muon to parameter 'l1.bias' of 1 dimension(s)");
  // And what it takes: every stage, offload and the delayed update (the
  // reference tests hold the numbers).
  for (int stage : {0, 1, 2, 3}) {
    config::Config cfg = muon(stage, stage > 0);
    cfg.zero_optimization.offload_optimizer.delayed_param_update = stage > 0;
    cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = 0;
    const RunResult r = train(ModelKind::kMlp, cfg, comm, 3);
    EXPECT_LT(r.losses.back(), r.losses.front()) << "stage " << stage;
  }
}

// Muon's halves each peak at their own rate: a share of the scheduler's peak
// (warmup_max_lr), not of optimizer.params.lr (ReferenceMuon checks that the
// shares are applied).
TEST(Optimizer, MuonHalvesShareTheSchedulersPeak) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const config::Config parsed = config::parse_config(R"({"train_batch_size": 16,
      "optimizer": {"type": "Muon", "params": {"lr": 1e-3, "muon_lr": 0.02, "adam_lr": 3e-4}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 2}}})", world);
  config::Config cfg = make_config(2, false, false, world, kGlobalBatch / world, 1);
  cfg.optimizer = parsed.optimizer;
  cfg.scheduler = parsed.scheduler;
  auto model = make_model(ModelKind::kMlp);
  testing::internal::CaptureStderr();
  Engine engine(model, cfg, comm);
  const std::string said = testing::internal::GetCapturedStderr();
  if (comm.rank() == 0) {
    EXPECT_NE(said.find("zerocpp: Muon on 3 matrices (2.8K elements) at lr x 2, Adam on 3 parameters (92 elements) at "
                        "lr x 0.03 (EngineOptions::use_muon not given: DeepSpeed's choice, zero::muon_by_default)"),
              std::string::npos)
        << said;
  }
}

// Matrices of three aspects (tall, square, wide), many small ones in one
// bucket: most lie inside a rank's chunk, a few across its ends.
struct MuonShapes : torch::nn::Module {
  MuonShapes() {
    tall = register_module("tall", torch::nn::Linear(16, 32));
    for (int i = 0; i < 10; ++i) squares.push_back(register_module("s" + std::to_string(i), torch::nn::Linear(32, 32)));
    wide = register_module("wide", torch::nn::Linear(32, 4));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::relu(tall->forward(x));
    for (auto& l : squares) h = at::relu(l->forward(h));
    return wide->forward(h);
  }
  torch::nn::Linear tall{nullptr}, wide{nullptr};
  std::vector<torch::nn::Linear> squares;
};

// Muon all-gathers only the ends of the chunks where its matrices lie
// across ranks (zero/zero/muon_plan.h), not whole buckets: its step sends
// exactly those windows more than AdamW's. And what its step allocates on
// the compute device (here the CPU, measured by c10's allocator) stays
// within the work the memory plan counts for it, which the ledger holds
// while it runs.
TEST(Optimizer, MuonGathersOnlyTheEndsOfChunksAndStaysInItsPlannedWork) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  struct Run {
    comm::CommStats comm;
    std::int64_t step_peak = 0, workspace_peak = 0, workspace_after = 0;
  };
  auto run = [&](const std::string& type) {
    config::Config cfg = make_config(2, false, false, world, kGlobalBatch / world, 1);
    cfg.optimizer.type = type;
    cfg.zero_optimization.reduce_bucket_size = 100000;
    torch::manual_seed(5);
    auto model = std::make_shared<MuonShapes>();
    Engine engine(model, cfg, comm);
    Run r;
    for (int step = 0; step < 2; ++step) {
      const int micro = kGlobalBatch / world;
      torch::manual_seed(100 + step);
      const at::Tensor x = at::randn({kGlobalBatch, 16}).narrow(0, comm.rank() * micro, micro);
      engine.backward(model->forward(x).square().mean());
      auto probe = std::make_shared<CpuAllocationPeak>();
      {
        c10::DebugInfoGuard on(c10::DebugInfoKind::PROFILER_STATE, probe);
        EXPECT_TRUE(engine.step());
      }
      r.step_peak = std::max(r.step_peak, probe->bytes());
    }
    r.comm = engine.last_step_comm();
    const auto s = engine.ledger().snapshot();
    r.workspace_peak = s.peak[int(Tier::kDevice)][int(Kind::kWorkspace)];
    r.workspace_after = s.bytes(Tier::kDevice, Kind::kWorkspace);
    return r;
  };
  const Run muon = run("Muon"), adam = run("AdamW");

  // What the plan says: the model's four weights, laid out as the engine lays them.
  auto model = std::make_shared<MuonShapes>();
  std::vector<std::size_t> numels;
  std::vector<MuonMatrix> matrices;
  for (const at::Tensor& p : model->parameters()) {
    if (p.dim() == 2) matrices.push_back(muon_matrix(static_cast<int>(numels.size()), p.sizes().vec()));
    numels.push_back(static_cast<std::size_t>(p.numel()));
  }
  const FlatLayout layout(numels, 100000, world, world, kPlanAlignElements);
  const auto plan = plan_muon(layout, comm.rank(), matrices);
  std::uint64_t calls = 0, bytes = 0, whole_buckets = 0;
  std::size_t shared = 0, local = 0;
  for (const MuonBucketPlan& b : plan) {
    const std::size_t chunk = layout.buckets()[static_cast<std::size_t>(b.bucket)].chunk;
    shared += b.shared.size();
    local += b.local.size();
    if (!b.gathers()) continue;
    whole_buckets += comm::ring_bytes_sent(comm::CollectiveKind::kAllGather, chunk, 4, world);
    const std::size_t window = muon_window_elements(b, chunk, world, kMuonGatherWindowBytes);
    for (const auto& [begin, end] : b.gather_ranges(chunk)) {
      for (std::size_t off = begin; off < end; off += window) {
        ++calls;
        bytes += comm::ring_bytes_sent(comm::CollectiveKind::kAllGather, std::min(window, end - off), 4, world);
      }
    }
  }
  const auto gather = comm::CollectiveKind::kAllGather;
  EXPECT_EQ(muon.comm.calls_of(gather) - adam.comm.calls_of(gather), calls);
  EXPECT_EQ(muon.comm.bytes_of(gather) - adam.comm.bytes_of(gather), bytes);
  if (world > 1) {
    // The layout has both kinds of matrix, and the ends are less than the buckets.
    EXPECT_GT(sum_over_ranks(comm, static_cast<std::int64_t>(shared)), 0);
    EXPECT_GT(sum_over_ranks(comm, static_cast<std::int64_t>(local)), 0);
    EXPECT_LT(bytes, whole_buckets);
  } else {
    EXPECT_EQ(calls, 0u);
  }

  // This rank's work, and the most any rank's: what every rank budgets (so
  // that a device_memory_limit refuses on every rank alike).
  auto work = [&](int rank) {
    return static_cast<std::int64_t>(muon_work_elements(layout, plan_muon(layout, rank, matrices), matrices,
                                                        kMuonGatherWindowBytes, /*gram=*/true)) * 4;
  };
  const std::int64_t planned = work(comm.rank());
  std::int64_t most = 0;
  for (int r = 0; r < world; ++r) most = std::max(most, work(r));
  EXPECT_EQ(muon.workspace_peak, most);     // counted while it runs...
  EXPECT_EQ(muon.workspace_after, 0);       // ... and not after
  EXPECT_EQ(adam.workspace_peak, 0);
  // Measured: Muon's step allocates no more than AdamW's and its planned
  // work; and the plan is not a gross overestimate.
  std::fprintf(stderr, "rank %d: Muon step peak %lld, AdamW %lld, planned work %lld\n", comm.rank(),
               static_cast<long long>(muon.step_peak), static_cast<long long>(adam.step_peak),
               static_cast<long long>(planned));
  EXPECT_LE(muon.step_peak, adam.step_peak + planned);
  EXPECT_GE(muon.step_peak, planned / 2);
}

// A checkpoint keeps the rate of the next step, the scheduler's: an engine
// without a scheduler resumes at it, one with the scheduler from the saved
// step count (before, the base lr was saved).
TEST(Schedule, ACheckpointKeepsTheScheduledRate) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const std::filesystem::path dir = shared_temp_dir(comm, "zero_sched_", "ckpt");
  const config::Config cfg = linear_warmup_config(world, 8);
  float saved = 0.0f;
  {
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
    for (int step = 0; step < 4; ++step) {
      GlobalBatch gb = global_batch(ModelKind::kMlp, step);
      const int micro = kGlobalBatch / world;
      engine.backward(micro_loss(ModelKind::kMlp, *model, gb.x.narrow(0, comm.rank() * micro, micro),
                                 gb.y.narrow(0, comm.rank() * micro, micro), engine.dtype()));
      engine.step();
    }
    saved = engine.lr();
    EXPECT_FLOAT_EQ(saved, 3e-2f / 8);  // lr(3) after four steps
    engine.save_checkpoint(dir.string(), "s");
  }
  for (bool scheduled : {false, true}) {
    config::Config c = cfg;
    if (!scheduled) c.scheduler.type = "";
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, c, comm);
    engine.load_checkpoint(dir.string(), "s");
    EXPECT_FLOAT_EQ(engine.lr(), saved) << (scheduled ? "with" : "without") << " the scheduler";
  }
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

// OneCycle's betas travel with a checkpoint as its rate does: an engine
// with the scheduler takes them from the restored step, one without it
// resumes with the saved pair (and says that the config's are not used),
// and betas a set_lr() held are saved too.
TEST(Schedule, ACheckpointKeepsTheCyclesBetas) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const std::filesystem::path dir = shared_temp_dir(comm, "zero_cycle_", "ckpt");
  config::Config cfg = make_config(2, false, false, world, kGlobalBatch / world, 1);
  cfg.scheduler.type = "OneCycle";
  cfg.scheduler.one_cycle.cycle_min_lr = 1e-3f;
  cfg.scheduler.one_cycle.cycle_max_lr = 1e-2f;
  cfg.scheduler.one_cycle.cycle_first_step_size = cfg.scheduler.one_cycle.cycle_second_step_size = 4;
  std::pair<float, float> saved, held;
  {
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
    for (int step = 0; step < 3; ++step) ASSERT_TRUE(mlp_step(engine, *model, comm, step));
    saved = engine.betas();
    EXPECT_LT(saved.first, 0.9f - 1e-3f);  // moving down from cycle_max_mom: not the config's 0.9
    engine.save_checkpoint(dir.string(), "cycle");
    engine.set_lr(5e-3f);
    ASSERT_TRUE(mlp_step(engine, *model, comm, 3));
    held = engine.betas();
    engine.save_checkpoint(dir.string(), "held");
  }
  EXPECT_EQ(held, saved);
  for (bool scheduled : {false, true}) {
    config::Config c = cfg;
    if (!scheduled) c.scheduler = config::SchedulerConfig{};
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, c, comm);
    testing::internal::CaptureStderr();
    engine.load_checkpoint(dir.string(), "cycle");
    const std::string said = testing::internal::GetCapturedStderr();
    EXPECT_EQ(engine.betas(), saved) << (scheduled ? "with" : "without") << " the scheduler";
    // Without the scheduler the saved pair overrules the config's: said.
    if (comm.rank() == 0) {
      EXPECT_EQ(said.find("where its scheduler's momentum cycle left them, stay in force") != std::string::npos,
                !scheduled)
          << said;
    }
    engine.load_checkpoint(dir.string(), "held");
    if (scheduled) {
      // The scheduler's after 4 steps taken: the cycle's peak, cycle_min_mom.
      EXPECT_NE(engine.betas(), held);
      EXPECT_FLOAT_EQ(engine.betas().first, 0.8f);
    } else {
      EXPECT_EQ(engine.betas(), held);
    }
  }
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

// An fp16 overflow with the scale at min_loss_scale (and no hysteresis
// left) ends the run on every rank, as DeepSpeed's ZeRO optimizers do,
// whatever the nonfinite policy.
TEST(Overflow, Fp16OverflowAtTheMinimumScaleEndsTheRun) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  config::Config cfg = make_config(2, false, false, world, kGlobalBatch / world, 1);
  cfg.fp16.enabled = true;
  cfg.fp16.initial_scale_power = 0;  // 1 = min_loss_scale
  cfg.fp16.hysteresis = 1;
  auto model = make_model(ModelKind::kMlp);
  Engine engine(model, cfg, comm);
  GlobalBatch gb = global_batch(ModelKind::kMlp, 0);
  const int micro = kGlobalBatch / world;
  at::Tensor loss = micro_loss(ModelKind::kMlp, *model, gb.x.narrow(0, comm.rank() * micro, micro),
                               gb.y.narrow(0, comm.rank() * micro, micro), engine.dtype());
  if (comm.rank() == world - 1) loss = loss * std::numeric_limits<float>::infinity();
  engine.backward(loss);
  try {
    engine.step();
    ADD_FAILURE() << "no error for an overflow at the minimum scale";
  } catch (const ::zero::Error& e) {
    EXPECT_NE(std::string(e.what()).find("loss scale already at its minimum (fp16.min_loss_scale 1)"),
              std::string::npos) << e.what();
  }
}

TEST(Overflow, Fp16DynamicScaleFollowsHysteresisAcrossRanks) {
  // fp16 maths runs on the CPU in LibTorch 2.x, so the whole fp16 path is
  // exercised here: scaled backward, unscale in the optimizer, skip, rescale.
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  for (int stage : {1, 2}) {
    config::Config cfg = make_config(stage, stage == 2, false, world, kGlobalBatch / world, 1);
    cfg.fp16.enabled = true;
    cfg.fp16.initial_scale_power = 4;
    cfg.fp16.hysteresis = 2;
    cfg.fp16.loss_scale_window = 1000;
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
    ASSERT_EQ(engine.dtype(), at::kHalf);
    std::vector<float> scales, used;
    for (int step = 0; step < 6; ++step) {
      GlobalBatch gb = global_batch(ModelKind::kMlp, step);
      const int micro = kGlobalBatch / world;
      at::Tensor loss = micro_loss(ModelKind::kMlp, *model, gb.x.narrow(0, comm.rank() * micro, micro),
                                   gb.y.narrow(0, comm.rank() * micro, micro), engine.dtype());
      if ((step == 2 || step == 3) && comm.rank() == world - 1) loss = loss * std::numeric_limits<float>::quiet_NaN();
      engine.backward(loss);
      EXPECT_EQ(engine.step(), step != 2 && step != 3) << "stage " << stage << " step " << step;
      // A skipped step clipped nothing: its norms are its own (not the step before's).
      EXPECT_EQ(std::isfinite(engine.stats().clipped_grad_norm), step != 2 && step != 3) << "step " << step;
      EXPECT_EQ(std::isfinite(engine.stats().grad_norm), step != 2 && step != 3) << "step " << step;
      scales.push_back(engine.stats().loss_scale);
      used.push_back(engine.stats().loss_scale_used);
    }
    // First overflow spends the hysteresis, the second halves 16 -> 8:
    // after the step (the next backward's scale), and the one each step
    // was scaled by (one step later).
    EXPECT_EQ(scales, (std::vector<float>{16, 16, 16, 8, 8, 8})) << "stage " << stage;
    EXPECT_EQ(used, (std::vector<float>{16, 16, 16, 16, 8, 8})) << "stage " << stage;
    EXPECT_EQ(engine.stats().skipped, 2);
    EXPECT_EQ(engine.stats().step, 4);
    for (const auto& p : engine.gather_master_params()) EXPECT_TRUE(at::isfinite(p).all().item<bool>());
  }
}

// fp16 with accumulation: backward() scales the loss by 1/accumulation, as
// DeepSpeed's engine does, so a window of 4 micro-batches stands the same
// loss scale as one. Before, the window's gradients summed to 4x one
// micro-batch's and overflowed where DeepSpeed's do not (every fp16 config
// with accumulation skipped its first steps).
TEST(Overflow, Fp16AccumulationStandsTheLossScaleOfOneMicroBatch) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const int micro = kGlobalBatch / world;
  for (int stage : {0, 2}) {
    // Whether the window's step was taken: `accumulation` micro-batches of
    // the same rows at a static loss scale.
    auto stepped = [&](int accumulation, float scale) {
      config::Config cfg = make_config(stage, false, false, world, micro, accumulation);
      cfg.fp16.enabled = true;
      cfg.fp16.loss_scale = scale;
      auto model = make_model(ModelKind::kMlp);
      Engine engine(model, cfg, comm);
      const GlobalBatch gb = global_batch(ModelKind::kMlp, 0);
      bool took = false;
      for (int m = 0; m < accumulation; ++m) {
        engine.backward(micro_loss(ModelKind::kMlp, *model, gb.x.narrow(0, comm.rank() * micro, micro),
                                   gb.y.narrow(0, comm.rank() * micro, micro), engine.dtype()));
        took = engine.step();
      }
      return took;
    };
    // The largest power-of-two scale one micro-batch's fp16 gradients stand.
    float scale = 0.0f;
    for (int k = 30; k >= 0 && scale == 0.0f; --k) {
      if (stepped(1, std::ldexp(1.0f, k))) scale = std::ldexp(1.0f, k);
    }
    ASSERT_GT(scale, 1.0f) << "stage " << stage;
    ASSERT_LT(scale, std::ldexp(1.0f, 30)) << "stage " << stage << ": no scale overflows; the test needs one";
    EXPECT_TRUE(stepped(4, scale)) << "stage " << stage << ": 4 micro-batches at loss scale " << scale;
  }
}

// fp16 over N ranks: the reduction carries the ranks' mean, as DeepSpeed's
// ZeRO does (it divides by the ranks before reducing), so ranks whose
// gradients fit fp16 never overflow their sum. Every rank takes the same
// rows here, so each rank's gradient is the mean: the largest loss scale a
// plain LibTorch fp16 backward of those rows stands is the largest the
// engine stands on any number of ranks, at every stage. Before, the fp16
// sum of N ranks overflowed at half that scale or less (an outside probe:
// scale 180000, 2 ranks, every step skipped).
TEST(Overflow, Fp16RanksReduceTheirMeanNotTheirSum) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const int micro = kGlobalBatch / world;
  const GlobalBatch gb = global_batch(ModelKind::kMlp, 0);
  const at::Tensor x = gb.x.narrow(0, 0, micro), y = gb.y.narrow(0, 0, micro);
  // The reference: a plain fp16 copy of the model, its backward at `scale`
  // (its gradients, unscaled, in `grads`).
  std::map<std::string, at::Tensor> grads;
  auto plain_stands = [&](float scale) {
    auto model = make_model(ModelKind::kMlp);
    model->to(at::kHalf);
    (micro_loss(ModelKind::kMlp, *model, x, y, at::kHalf) * scale).backward();
    for (const auto& p : model->named_parameters()) {
      if (!at::isfinite(p.value().grad()).all().item<bool>()) return false;
      grads[p.key()] = p.value().grad().to(at::kFloat) / scale;
    }
    return true;
  };
  float largest = 0.0f;
  for (int k = 30; k >= 0 && largest == 0.0f; --k) {
    if (plain_stands(std::ldexp(1.0f, k))) largest = std::ldexp(1.0f, k);
  }
  ASSERT_GT(largest, 1.0f);
  ASSERT_LT(largest, std::ldexp(1.0f, 30)) << "no scale overflows; the test needs one";
  ASSERT_TRUE(plain_stands(largest));  // (its gradients, for full_grad below)
  for (int stage : {0, 1, 2, 3}) {
    auto stepped = [&](float scale) {
      config::Config cfg = make_config(stage, false, false, world, micro, 1);
      cfg.fp16.enabled = true;
      cfg.fp16.loss_scale = scale;
      auto model = make_model(ModelKind::kMlp);
      Engine engine(model, cfg, comm);
      engine.backward(micro_loss(ModelKind::kMlp, *model, x, y, engine.dtype()));
      if (scale == largest) {
        // The mean gradient, read back: the reduction's 1/N and the scale
        // divided out once each (fp16's rounding of the division aside).
        for (const auto& [name, want] : grads) {
          const at::Tensor got = engine.full_grad(name);
          EXPECT_TRUE(at::allclose(got, want, 2e-3, 1e-6)) << name << " at stage " << stage << ": "
                                                           << (got - want).abs().max().item<float>();
        }
      }
      return engine.step();
    };
    EXPECT_TRUE(stepped(largest)) << "stage " << stage << ", " << world << " rank(s), loss scale " << largest;
    EXPECT_FALSE(stepped(2.0f * largest)) << "stage " << stage << ": the overflow the reference has";
  }
}

// A dynamic scaler's options (fp16.loss_scale 0).
LossScalerOptions dynamic_scaling(int power, int window, int hysteresis, float min_scale = 1.0f,
                                  bool consecutive = false) {
  LossScalerOptions o;
  o.dynamic = true;
  o.initial_scale_power = power;
  o.loss_scale_window = window;
  o.hysteresis = hysteresis;
  o.min_loss_scale = min_scale;
  o.consecutive_hysteresis = consecutive;
  return o;
}

TEST(LossScaler, DeepSpeedDynamicSemantics) {
  LossScaler s(dynamic_scaling(8, 3, 2, 64.0f));
  EXPECT_EQ(s.scale(), 256.0f);
  EXPECT_TRUE(s.update(true));   // first overflow spends hysteresis
  EXPECT_EQ(s.scale(), 256.0f);
  EXPECT_TRUE(s.update(true));   // second halves
  EXPECT_EQ(s.scale(), 128.0f);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 64.0f);  // min_loss_scale
  // Another overflow there: nothing left to lower, the run ends (DeepSpeed's
  // "Current loss scale already at minimum"), the scaler unchanged.
  EXPECT_THROW(s.update(true), ::zero::Error);
  EXPECT_EQ(s.scale(), 64.0f);
  EXPECT_EQ(s.skipped_steps(), 3);
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 64.0f);    // a window of 3 clean steps after the overflow...
  EXPECT_FALSE(s.update(false));  // ... doubles at the next one (DeepSpeed 0.18 on)
  EXPECT_EQ(s.scale(), 128.0f);
  EXPECT_EQ(s.hysteresis_left(), 2);
}

// The scale after each step against DeepSpeed 0.19.8's own DynamicLossScaler
// (deepspeed/runtime/fp16/loss_scaler.py run on the same overflow sequence;
// an outside probe's reference): the window counts the clean steps since the
// last overflow before this one ("stable_interval"), with and without
// consecutive_hysteresis.
TEST(LossScaler, FollowsDeepSpeed0198StepByStep) {
  struct Case {
    int power, window, hysteresis;
    bool consecutive;
    const char* overflows;
    std::vector<float> deepspeed;
  };
  const std::vector<Case> cases = {
      {4, 2, 1, false, "0000000", {16, 16, 32, 32, 64, 64, 128}},
      {10, 3, 3, false, "0111100011000000",
       {1024, 1024, 1024, 512, 256, 256, 256, 256, 128, 64, 64, 64, 64, 128, 128, 128}},
      {8, 2, 2, true, "1010110000010000",
       {256, 256, 256, 256, 256, 128, 128, 128, 256, 256, 512, 512, 512, 512, 1024, 1024}},
  };
  for (const Case& c : cases) {
    LossScaler s(dynamic_scaling(c.power, c.window, c.hysteresis, 1.0f, c.consecutive));
    for (std::size_t i = 0; c.overflows[i] != '\0'; ++i) {
      const bool overflow = c.overflows[i] == '1';
      EXPECT_EQ(s.update(overflow), overflow);
      EXPECT_EQ(s.scale(), c.deepspeed[i]) << "step " << i << " of " << c.overflows << " (window " << c.window
                                           << ", hysteresis " << c.hysteresis << ")";
    }
  }
}

// The scale stops doubling at 2^127, the largest power of two a float
// holds: past it, inf, and every later step would overflow and be skipped
// without end. A floor of 0 set in code (the config's 0 is the smallest
// normal float) is refused: it would never be reached.
TEST(LossScaler, TheScaleStaysFiniteAndTheFloorPositive) {
  LossScaler s(dynamic_scaling(126, 1, 2));
  for (int i = 0; i < 6; ++i) EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), std::ldexp(1.0f, 127));
  EXPECT_THROW(LossScaler(dynamic_scaling(8, 1, 2, 0.0f)), ::zero::Error);
}

// A floor above the start, as DeepSpeed 0.19.8 takes it (its
// DynamicLossScaler run on the same steps: 16, 16, 1024, 1024, then
// "Current loss scale already at minimum"): the first halving raises the
// scale to the floor, max(scale / 2, min), and an overflow at the floor
// with the hysteresis spent ends the run. (Before, the first overflow ended
// it, saying the scale was at its minimum when it was at 16.)
TEST(LossScaler, AFloorAboveTheStartIsWhereTheFirstHalvingGoes) {
  LossScaler s(dynamic_scaling(4, 1000, 2, 1024.0f));
  std::vector<float> scales;
  for (bool overflow : {false, true, true, false}) {
    s.update(overflow);
    scales.push_back(s.scale());
  }
  EXPECT_EQ(scales, (std::vector<float>{16, 16, 1024, 1024}));
  EXPECT_THROW(s.update(true), ::zero::Error);
}

// fp16.consecutive_hysteresis (DeepSpeed's): every step without overflow
// refills the hysteresis, so overflows apart never halve the scale; only
// `hysteresis` of them in a row do.
TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryGoodStep) {
  for (bool consecutive : {false, true}) {
    LossScaler s(dynamic_scaling(8, 100, 2, 1.0f, consecutive));
    s.update(true);   // hysteresis 2 -> 1
    s.update(false);  // consecutive: back to 2
    s.update(true);   // plain: halves; consecutive: 2 -> 1
    EXPECT_EQ(s.scale(), consecutive ? 256.0f : 128.0f) << consecutive;
    s.update(true);   // two in a row halve either way
    EXPECT_EQ(s.scale(), consecutive ? 128.0f : 64.0f) << consecutive;
  }
}

// ---- Awkward modules ------------------------------------------------------

struct NoParams : torch::nn::Module {};

TEST(Modules, NoTrainableParametersIsAClearError) {
  config::Config cfg = make_config(1, false, false, world_comm().world_size(), 1, 1);
  try {
    Engine engine(std::make_shared<NoParams>(), cfg, world_comm());
    FAIL() << "expected an error";
  } catch (const ::zero::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no trainable parameters"), std::string::npos) << e.what();
  }
}

struct WithUnused : Mlp {
  WithUnused() { spare = register_module("spare", torch::nn::Linear(16, 16)); }
  torch::nn::Linear spare{nullptr};
};

TEST(Modules, FrozenStaysAndUnusedParametersTrainAsZeroGradient) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  for (bool bf16 : {false, true}) {
    for (int stage : {0, 1, 2}) {
      const std::string what = std::string(bf16 ? "bf16" : "fp32") + " stage " + std::to_string(stage);
      torch::manual_seed(7);
      auto model = std::make_shared<WithUnused>();
      model->l1->weight.set_requires_grad(false);
      const at::Tensor frozen = model->l1->weight.clone();
      const at::Tensor spare_before = model->spare->weight.clone();
      config::Config cfg = make_config(stage, stage == 2, bf16, world, kGlobalBatch / world, 1);
      Engine engine(model, cfg, comm);
      EXPECT_EQ(engine.num_parameters(), 48 + 48 * 40 + 40 + 40 * 4 + 4 + 16 * 16 + 16);
      // engine.h: the frozen parameter takes the training precision, so the
      // frozen Linear accepts the bf16 inputs.
      EXPECT_EQ(model->l1->weight.scalar_type(), engine.dtype()) << what;
      EXPECT_FALSE(model->l1->weight.requires_grad());
      for (int step = 0; step < 3; ++step) {
        GlobalBatch gb = global_batch(ModelKind::kMlp, step);
        const int micro = kGlobalBatch / world;
        at::Tensor out = model->forward(gb.x.narrow(0, comm.rank() * micro, micro).to(engine.dtype()));
        engine.backward(at::mse_loss(out.to(at::kFloat), gb.y.narrow(0, comm.rank() * micro, micro)));
        EXPECT_TRUE(engine.step()) << what;
      }
      EXPECT_TRUE(model->l1->weight.equal(frozen.to(engine.dtype()))) << what;
      // No gradient: only AdamW's decoupled weight decay moves it: w * (1 - lr*wd)^3.
      const double decay = std::pow(1.0 - 1e-2 * 0.01, 3);
      // Trainable parameters in the module's order: l1.bias, l2.*, l3.*, spare.weight, spare.bias.
      const std::vector<at::Tensor> master = engine.gather_master_params();
      ASSERT_EQ(master.size(), 7u);
      EXPECT_TRUE(at::allclose(master[5], spare_before * decay, 1e-6, 1e-7)) << what;
      if (!bf16) {
        EXPECT_TRUE(at::allclose(model->spare->weight, spare_before * decay, 1e-6, 1e-7)) << what;
      }
    }
  }
}

// Six layers and a spare registered last that the forward never uses (a
// pooler left out of the loss): the spare's buckets are the first of the
// layout's back-to-front order. Launched in layout order, they would never
// complete and would hold back every bucket after them until the end of
// backward: the whole gradient alive at once, not ZeRO-R's three buckets.
struct DeepWithSpare : torch::nn::Module {
  DeepWithSpare() {
    for (int i = 0; i < 6; ++i) layers.push_back(register_module("l" + std::to_string(i), torch::nn::Linear(32, 32)));
    spare = register_module("spare", torch::nn::Linear(32, 32));
  }
  // use_spare: the spare's output added last (its gradient is the first
  // backward computes).
  at::Tensor forward(at::Tensor h, bool use_spare = false) {
    for (auto& l : layers) h = at::gelu(l->forward(h));
    return use_spare ? h + spare->forward(h) : h;
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear spare{nullptr};
};

// From the second step on (the ranks agree on the launch order at the end of
// the first backward: its buckets as they completed, unused ones last), the
// buckets alive at any point of backward stay within the three the memory
// plan budgets, at stage 2 and with offload (transient buckets), and the
// spare still trains as a zero gradient.
TEST(Buckets, AnUnusedParameterRegisteredLastHoldsBackNoBucketAfterTheFirstStep) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  for (bool offload : {false, true}) {
    torch::manual_seed(11);
    auto model = std::make_shared<DeepWithSpare>();
    config::Config cfg = make_config(2, offload, /*bf16=*/false, world, 2, 1);
    cfg.zero_optimization.reduce_bucket_size = 1000;
    Engine engine(model, cfg, comm);
    std::vector<std::size_t> numels;
    for (const auto& p : model->parameters()) numels.push_back(static_cast<std::size_t>(p.numel()));
    const FlatLayout layout(numels, 1000, world, world, kPlanAlignElements);
    ASSERT_GT(layout.buckets().size(), static_cast<std::size_t>(kPlanLiveBuckets) + 3);
    std::size_t largest = 0;
    for (const Bucket& b : layout.buckets()) largest = std::max(largest, b.padded);
    const std::int64_t bound = kPlanLiveBuckets * static_cast<std::int64_t>(largest) * 4;
    // The bucket bytes alive whenever a gradient arrives (a tensor hook runs
    // before the engine takes that gradient).
    std::int64_t live = 0;
    for (auto& l : model->layers) {
      for (at::Tensor& p : l->parameters()) {
        p.register_hook([&](const at::Tensor& g) {
          live = std::max(live, engine.ledger().snapshot().bytes(Tier::kDevice, Kind::kBuckets));
          return g;
        });
      }
    }
    const at::Tensor spare_before = model->spare->weight.clone();
    for (int step = 0; step < 3; ++step) {
      live = 0;
      engine.backward(at::mse_loss(model->forward(at::randn({2, 32})), at::zeros({2, 32})));
      EXPECT_TRUE(engine.step());
      if (step > 0) {
        EXPECT_LE(live, bound) << "step " << step << (offload ? ", offload" : "") << ": " << live
                               << " bytes of buckets alive at once, " << layout.buckets().size() << " buckets of at most "
                               << largest << " elements";
      }
      EXPECT_GT(live, 0);
    }
    // No gradient: only AdamW's decoupled weight decay moves it.
    const std::vector<at::Tensor> master = engine.gather_master_params();
    EXPECT_TRUE(at::allclose(master[12], spare_before * std::pow(1.0 - 1e-2 * 0.01, 3), 1e-6, 1e-7));
  }
}

// Ranks whose forwards use different parameters (the spare only on odd
// ranks: there its buckets complete first, on rank 0 never) complete their
// buckets in different orders; they take rank 0's launch order, so their
// reductions pair up, and the training is that of the mean gradient: a
// plain LibTorch AdamW over the ranks' gradients averaged by hand.
TEST(Buckets, RanksThatUseDifferentParametersTakeRankZerosOrder) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size(), rank = comm.rank();
  if (world == 1) GTEST_SKIP() << "one rank has one order";
  torch::manual_seed(12);
  auto model = std::make_shared<DeepWithSpare>();
  torch::manual_seed(12);
  auto plain = std::make_shared<DeepWithSpare>();
  config::Config cfg = make_config(2, /*offload=*/false, /*bf16=*/false, world, 2, 1);
  cfg.zero_optimization.reduce_bucket_size = 1000;
  Engine engine(model, cfg, comm);
  const auto& o = cfg.optimizer;
  torch::optim::AdamW adamw(plain->parameters(), torch::optim::AdamWOptions(o.lr)
                                                     .betas({o.beta1, o.beta2})
                                                     .eps(o.eps)
                                                     .weight_decay(o.weight_decay));
  const bool use_spare = rank % 2 == 1;
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(300 + step);
    const at::Tensor x = at::randn({2 * world, 32}).narrow(0, 2 * rank, 2);
    engine.backward(at::mse_loss(model->forward(x, use_spare), at::zeros({2, 32})));
    EXPECT_TRUE(engine.step());
    adamw.zero_grad();
    at::mse_loss(plain->forward(x, use_spare), at::zeros({2, 32})).backward();
    for (at::Tensor& p : plain->parameters()) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      at::Tensor g = p.grad().contiguous();
      comm.all_reduce(g.data_ptr(), static_cast<std::size_t>(g.numel()), DType::kFloat32)->wait();
      p.mutable_grad() = g / world;
    }
    torch::nn::utils::clip_grad_norm_(plain->parameters(), cfg.gradient_clipping);
    adamw.step();
  }
  const std::vector<at::Tensor> master = engine.gather_master_params();
  const std::vector<at::Tensor> want = plain->parameters();
  ASSERT_EQ(master.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(at::allclose(master[i], want[i], 1e-5, 1e-6))
        << "parameter " << i << ": max difference " << (master[i] - want[i]).abs().max().item<double>();
  }
}

// The trainable set is fixed when the engine is built: a requires_grad
// changed afterwards, either way, fails the next backward naming the
// parameter, before any gradient is taken (the window stays as it was), and
// changed back, training goes on. Stage 3 too (its parameters are hollow).
TEST(Modules, RequiresGradChangedAfterConstructionIsRefused) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  for (int stage : {0, 2, 3}) {
    torch::manual_seed(7);
    auto model = std::make_shared<WithUnused>();
    model->l1->weight.set_requires_grad(false);
    Engine engine(model, make_config(stage, false, false, world, kGlobalBatch / world, 1), comm);
    const int micro = kGlobalBatch / world;
    auto try_step = [&](const std::string& expect) {
      GlobalBatch gb = global_batch(ModelKind::kMlp, 0);
      at::Tensor out = model->forward(gb.x.narrow(0, comm.rank() * micro, micro));
      const at::Tensor loss = at::mse_loss(out, gb.y.narrow(0, comm.rank() * micro, micro));
      if (expect.empty()) {
        engine.backward(loss);
        EXPECT_TRUE(engine.step()) << "stage " << stage;
        return;
      }
      try {
        engine.backward(loss);
        ADD_FAILURE() << "stage " << stage << ": expected an error with " << expect;
      } catch (const ::zero::Error& e) {
        EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << "stage " << stage << ": " << e.what();
      }
    };
    model->l1->weight.set_requires_grad(true);
    try_step("parameter 'l1.weight' was frozen when the engine was built and now requires a gradient");
    EXPECT_FALSE(model->l1->weight.grad().defined()) << "stage " << stage;
    model->l1->weight.set_requires_grad(false);
    model->l2->bias.set_requires_grad(false);
    try_step("parameter 'l2.bias' no longer requires a gradient");
    model->l2->bias.set_requires_grad(true);
    try_step("");
    EXPECT_EQ(engine.stats().step, 1) << "stage " << stage;
  }
}

// A parameter the module gains after the engine is built (registered, or its
// submodule replaced) would never be trained, and the replaced one would be
// stepped with zero gradients: refused at backward, naming it.
TEST(Modules, ParametersAddedAfterConstructionAreRefused) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const int micro = kGlobalBatch / world;
  for (int stage : {0, 2, 3}) {
    for (const std::string how : {"registered", "replaced"}) {
      torch::manual_seed(7);
      auto model = std::make_shared<WithUnused>();
      Engine engine(model, make_config(stage, false, false, world, micro, 1), comm);
      std::string expect;
      if (how == "registered") {
        model->l2->register_parameter("extra", torch::zeros({40}));
        expect = "parameter 'l2.extra' is not one the module had when the engine was built";
      } else {
        model->l2 = model->replace_module("l2", torch::nn::Linear(48, 40));
        zero::mark_unit(*model->l2);
        expect = "parameter 'l2.weight' is not one the module had when the engine was built";
      }
      GlobalBatch gb = global_batch(ModelKind::kMlp, 0);
      at::Tensor out = model->forward(gb.x.narrow(0, comm.rank() * micro, micro));
      const at::Tensor loss = at::mse_loss(out, gb.y.narrow(0, comm.rank() * micro, micro));
      try {
        engine.backward(loss);
        ADD_FAILURE() << "stage " << stage << ", " << how << ": expected an error";
      } catch (const ::zero::Error& e) {
        EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << "stage " << stage << ": " << e.what();
      }
    }
  }
}

// Construction and one step; returns the device tier's peak.
std::int64_t construct_and_step(const config::Config& cfg, comm::Communicator& comm, memory::LedgerSnapshot* out) {
  auto model = make_model(ModelKind::kMlp);
  Engine engine(model, cfg, comm);
  GlobalBatch gb = global_batch(ModelKind::kMlp, 0);
  engine.backward(micro_loss(ModelKind::kMlp, *model, gb.x.narrow(0, 0, 2), gb.y.narrow(0, 0, 2), engine.dtype()));
  EXPECT_TRUE(engine.step());
  if (out != nullptr) *out = engine.ledger().snapshot();
  return engine.ledger().snapshot().tier_peak[int(Tier::kDevice)];
}

TEST(Modules, DeviceMemoryLimitRefusesWithTheRightNumbers) {
  // One process per rank's own ledger: with the single-process communicator
  // a refusal on one rank cannot leave another waiting in a collective.
  auto single = comm::make_single_process_communicator();
  for (bool bf16 : {false, true}) {
    for (int stage : {0, 2}) {
      const std::string what = std::string(bf16 ? "bf16" : "fp32") + " stage " + std::to_string(stage);
      config::Config cfg = make_config(stage, false, bf16, 1, 2, 1);
      memory::LedgerSnapshot s;
      const std::int64_t peak = construct_and_step(cfg, *single, &s);
      // The temporary fp32 copy of the parameters is counted while it lives.
      const std::vector<std::size_t> numels = [] {
        std::vector<std::size_t> n;
        for (const auto& p : make_model(ModelKind::kMlp)->parameters()) n.push_back(static_cast<std::size_t>(p.numel()));
        return n;
      }();
      const FlatLayout layout(numels, static_cast<std::size_t>(cfg.zero_optimization.reduce_bucket_size), 1, 1, kPlanAlignElements);
      EXPECT_EQ(s.peak[int(Tier::kDevice)][int(Kind::kStaging)],
                bf16 ? static_cast<std::int64_t>(layout.padded_numel() * 4) : 0)
          << what;

      // Stage 2's transient buckets are budgeted at construction at their
      // bound (the 3 largest buckets), not refused inside backward, where a
      // refusal could hit one rank only: the limit needed is the larger of
      // the peak and what the engine holds plus that bound.
      std::int64_t bound = 0;
      if (stage == 2) {
        std::vector<std::size_t> sizes;
        for (const Bucket& b : layout.buckets()) sizes.push_back(b.padded);
        std::sort(sizes.begin(), sizes.end(), std::greater<>());
        for (std::size_t i = 0; i < sizes.size() && i < static_cast<std::size_t>(kPlanLiveBuckets); ++i) bound += static_cast<std::int64_t>(sizes[i] * (bf16 ? 2 : 4));
      }
      const std::int64_t held = s.tier_current[int(Tier::kDevice)];
      const std::int64_t need_buckets = held + bound;
      const std::int64_t need = std::max(peak, need_buckets);
      // That limit fits...
      cfg.device_memory_limit = need;
      EXPECT_EQ(construct_and_step(cfg, *single, nullptr), peak) << what;
      // ...one byte less does not, and the message gives the exact numbers:
      // the buckets' bound, or the allocation that first reached the peak.
      cfg.device_memory_limit = need - 1;
      try {
        construct_and_step(cfg, *single, nullptr);
        ADD_FAILURE() << what << ": expected an error";
      } catch (const ::zero::Error& e) {
        const std::string msg = e.what();
        if (bound > 0 && need_buckets >= peak) {
          std::smatch m;
          const std::regex re("the gradient buckets need up to [^=]+= ([0-9]+) bytes during backward beside the "
                              "[^=]+= ([0-9]+) bytes the engine holds, past the device_memory_limit of [^=]+= "
                              "([0-9]+) bytes \\(it would need at least [^=]+= ([0-9]+) bytes\\)");
          ASSERT_TRUE(std::regex_search(msg, m, re)) << msg;
          EXPECT_EQ(std::stoll(m[1]), bound) << msg;
          EXPECT_EQ(std::stoll(m[2]), held) << msg;
          EXPECT_EQ(std::stoll(m[3]), need - 1) << msg;
          EXPECT_EQ(std::stoll(m[4]), need) << msg;
          EXPECT_NE(msg.find("reduce_bucket_size"), std::string::npos) << msg;
          continue;
        }
        EXPECT_NE(msg.find("offload_optimizer"), std::string::npos) << msg;
        std::smatch m;
        const std::regex re(
            "needs [^=]+= ([0-9]+) bytes but [^=]+= ([0-9]+) bytes of the [^=]+= ([0-9]+) bytes "
            "device_memory_limit are already held \\(it would need a limit of at least [^=]+= ([0-9]+) bytes\\)");
        ASSERT_TRUE(std::regex_search(msg, m, re)) << msg;
        const std::int64_t asked = std::stoll(m[1]), held = std::stoll(m[2]), limit = std::stoll(m[3]),
                           need = std::stoll(m[4]);
        EXPECT_EQ(limit, peak - 1) << msg;
        EXPECT_EQ(need, peak) << msg;
        EXPECT_EQ(held + asked, need) << msg;
        EXPECT_GT(asked, 0) << msg;
        EXPECT_LE(held, limit) << msg;
        EXPECT_NE(msg.find(memory::format_bytes(asked) + " = "), std::string::npos) << msg;
      }
    }
  }
}

TEST(Modules, ModuleOnAnUnsupportedDeviceIsRefusedAtConstruction) {
  // The engine trains on the CPU or on CUDA. Named as the device to train
  // on, another (XPU) is refused before anything is allocated there, so
  // this runs without one.
  auto model = std::make_shared<Mlp>();
  config::Config cfg = make_config(0, false, false, world_comm().world_size(), 1, 1);
  EngineOptions o;
  o.device = c10::Device(c10::kXPU);
  try {
    Engine engine(model, cfg, world_comm(), o);
    FAIL() << "expected an error";
  } catch (const ::zero::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the engine's device is xpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("on the CPU or on a CUDA GPU"), std::string::npos) << msg;
  }
  EXPECT_TRUE(model->l1->weight.is_cpu()) << "the failed constructor left the module as it was";
}

struct OnTwoDevices : torch::nn::Module {
  OnTwoDevices() {
    a = register_parameter("a", at::zeros({4}));
    b = register_parameter("b", at::empty({4}, at::TensorOptions().device(at::kMeta)));
  }
  at::Tensor a, b;
};

// Without EngineOptions::device, a module partly on meta goes where the rest
// of it is, its meta part filled there. (Two real devices without a device
// named are refused: engine_cuda_test's ModuleOnTwoDevicesIsRefused, where
// a second device exists.)
TEST(Modules, ModulePartlyOnMetaTrainsWhereTheRestIs) {
  auto model = std::make_shared<OnTwoDevices>();
  config::Config cfg = make_config(0, false, false, world_comm().world_size(), 1, 1);
  EngineOptions o;
  o.init = [](const std::string&, const at::Tensor& v) { v.fill_(0.5); };
  {
    Engine engine(model, cfg, world_comm(), o);
    EXPECT_TRUE(model->b.is_cpu());
    EXPECT_TRUE(at::equal(model->b, at::full({4}, 0.5f)));
  }
  EXPECT_TRUE(model->a.is_cpu() && model->b.is_cpu());
}

}  // namespace
}  // namespace zero::test

// ---- Lifetime: the module after the engine ---------------------------------

namespace zero::test {
namespace {

// One micro-batch of the MLP on this rank, through the engine's dtype.
// This rank's micro-batch of the fixed global batch (accumulation 1).
at::Tensor rank_loss(ModelKind kind, torch::nn::Module& model, comm::Communicator& comm, c10::ScalarType dtype) {
  const GlobalBatch gb = global_batch(kind, 0);
  const int micro = kGlobalBatch / comm.world_size();
  return micro_loss(kind, model, gb.x.narrow(0, comm.rank() * micro, micro),
                    gb.y.narrow(0, comm.rank() * micro, micro), dtype);
}

at::Tensor mlp_loss(torch::nn::Module& model, comm::Communicator& comm, c10::ScalarType dtype) {
  return rank_loss(ModelKind::kMlp, model, comm, dtype);
}

TEST(Lifetime, BackwardAfterTheEngineIsGoneIsPlainLibTorch) {
  comm::Communicator& comm = world_comm();
  for (bool bf16 : {false, true}) {
    auto model = make_model(ModelKind::kMlp);
    {
      Engine engine(model, make_config(1, false, bf16, comm.world_size(), kGlobalBatch / comm.world_size(), 1),
                    comm);
      engine.backward(mlp_loss(*model, comm, engine.dtype()));
      ASSERT_TRUE(engine.step());
    }
    // No hook calls into the freed engine (ASan: heap-use-after-free before
    // the fix), the parameters are fp32 again and collect gradients as usual.
    for (const auto& p : model->parameters()) {
      EXPECT_EQ(p.scalar_type(), at::kFloat) << "bf16 " << bf16;
      EXPECT_FALSE(p.grad().defined());
    }
    mlp_loss(*model, comm, at::kFloat).backward();
    for (const auto& p : model->parameters()) {
      ASSERT_TRUE(p.grad().defined()) << "a hook still takes the gradient away (bf16 " << bf16 << ")";
      EXPECT_TRUE(at::isfinite(p.grad()).all().item<bool>());
    }
  }
}

// Each micro-batch is one backward() and then one step(): a step() with no
// backward would count a micro-batch without gradients (and step on zeros),
// a second backward() would add to the first in ways that differ by stage,
// and loss.backward() called directly (not engine.backward) added its
// gradients into the window before an internal error. All are refused, and
// training goes on as if they had not been called.
TEST(Lifetime, BackwardAndStepAlternate) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const int micro = kGlobalBatch / world;
  for (int stage : {0, 2, 3}) {
    const config::Config cfg = make_config(stage, false, false, world, micro, 1);
    const ModelKind kind = stage == 3 ? ModelKind::kUnitMlp : ModelKind::kMlp;
    auto model = make_model(kind);
    Engine engine(model, cfg, comm);
    // The parity loop's fixed global batch, every step.
    auto loss = [&] { return rank_loss(kind, *model, comm, engine.dtype()); };
    for (int step = 0; step < 3; ++step) {
      if (step == 1) {
        try {
          engine.step();
          ADD_FAILURE() << "stage " << stage << ": step() without backward() was accepted";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("step() without an engine.backward()"), std::string::npos)
              << e.what();
        }
        engine.backward(loss());
        try {
          engine.backward(loss());
          ADD_FAILURE() << "stage " << stage << ": a second backward() before step() was accepted";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("backward() called twice"), std::string::npos) << e.what();
        }
        try {
          loss().backward();
          ADD_FAILURE() << "stage " << stage << ": loss.backward() outside the engine was accepted";
        } catch (const std::exception& e) {
          EXPECT_NE(std::string(e.what()).find("came from a backward that was not engine.backward(loss)"),
                    std::string::npos)
              << e.what();
        }
        EXPECT_TRUE(engine.step()) << "stage " << stage;  // the first backward's micro-batch
      }
      engine.backward(loss());
      EXPECT_TRUE(engine.step()) << "stage " << stage;
    }
    engine.flush();
    // Four optimizer steps on the same batch, as if the refused calls had
    // not been made.
    const RunResult want = train(kind, cfg, comm, 4);
    const std::vector<at::Tensor> got = engine.gather_master_params();
    ASSERT_EQ(got.size(), want.params.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(got[i].equal(want.params[i])) << "stage " << stage << " parameter " << i;
    }
    EXPECT_EQ(engine.stats().step, 4) << "stage " << stage;
  }
}

// A second live engine on the module (or on a part of it) would adopt the
// first one's views (at stage 3 their hollow shapes) and break both: it is
// refused, naming a parameter; once the first is gone, a new one builds.
TEST(Lifetime, ASecondLiveEngineOnTheModuleIsRefused) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  // (In bf16 the live engine's module is bf16: the error is still that it
  // is taken, not its dtype.)
  for (int stage : {0, 3, -2}) {
    const bool bf16 = stage < 0;
    stage = std::abs(stage);
    const config::Config cfg = make_config(stage, false, bf16, world, kGlobalBatch / world, 1);
    const ModelKind kind = stage == 3 ? ModelKind::kUnitMlp : ModelKind::kMlp;
    auto model = make_model(kind);
    {
      Engine first(model, cfg, comm);
      auto part = model->children().front();
      for (const auto& target : {model, part}) {
        try {
          Engine second(target, cfg, comm);
          ADD_FAILURE() << "stage " << stage << ": a second live engine was built";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("is trained by another zero::Engine that is still alive"),
                    std::string::npos)
              << e.what();
        }
      }
      first.backward(rank_loss(kind, *model, comm, first.dtype()));
      EXPECT_TRUE(first.step()) << "stage " << stage << ": the first engine trains on";
    }
    Engine again(model, cfg, comm);
    again.backward(rank_loss(kind, *model, comm, again.dtype()));
    EXPECT_TRUE(again.step()) << "stage " << stage;
  }
}

// An Embedding unit fed token ids (no input gradient marks the end of its
// backward) stays gathered until the backward ends, and is released then:
// between steps its weight is hollow like every unit's.
TEST(Stage3Units, AnEmbeddingUnitIsReleasedWhenTheBackwardEnds) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  auto model = make_model(ModelKind::kUnitMlp);
  Engine engine(model, make_config(3, false, false, world, kGlobalBatch / world, 1), comm);
  const at::Tensor weight = model->named_parameters()["ids.weight"];
  for (int step = 0; step < 2; ++step) {
    engine.backward(rank_loss(ModelKind::kUnitMlp, *model, comm, engine.dtype()));
    EXPECT_EQ(weight.numel(), 0) << "step " << step << ": the Embedding unit is still gathered after backward";
    EXPECT_TRUE(engine.step());
  }
}

// A graph recorded before a step reads weights the step changed: LibTorch's
// own optimizers make its backward fail (the step's in-place update moves
// the parameters' version counter), and so does the engine's step, at every
// stage, instead of computing gradients at weights that are gone.
TEST(Lifetime, AGraphRecordedBeforeAStepFailsInBackwardAsInLibTorch) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const int micro = kGlobalBatch / world;
  {
    auto model = make_model(ModelKind::kMlp);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    const at::Tensor first = mlp_loss(*model, comm, at::kFloat), second = mlp_loss(*model, comm, at::kFloat);
    first.backward();
    opt.step();
    EXPECT_THROW(second.backward(), std::exception) << "LibTorch's reference behaviour changed";
  }
  // Stage 3 twice: with parameters kept gathered (kUnitMlp), and with every
  // parameter in a unit (kMlp), released between steps, whose counter waits
  // aside while it is; there the stale graph is backed up after another
  // window has gathered and released the units again.
  for (int stage : {0, 1, 2, 3, -3}) {
    const bool all_in_units = stage < 0;
    stage = std::abs(stage);
    const config::Config cfg = make_config(stage, stage == 2, false, world, micro, 1);
    const ModelKind kind = stage == 3 && !all_in_units ? ModelKind::kUnitMlp : ModelKind::kMlp;
    auto model = make_model(kind);
    Engine engine(model, cfg, comm);
    auto loss = [&] { return rank_loss(kind, *model, comm, engine.dtype()); };
    const at::Tensor first = loss(), second = loss();
    engine.backward(first);
    ASSERT_TRUE(engine.step());
    if (all_in_units) {
      engine.backward(loss());
      ASSERT_TRUE(engine.step());
    }
    try {
      engine.backward(second);
      ADD_FAILURE() << "stage " << stage << ": backward of a graph recorded before the step was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("modified by an inplace operation"), std::string::npos) << e.what();
    }
    // Training goes on.
    engine.backward(loss());
    EXPECT_TRUE(engine.step()) << "stage " << stage;
  }
}

// Stage 3: a graph that outlives its engine (the engine destroyed between
// forward and backward) backs up as plain LibTorch: the units' hooks find
// no engine and do nothing, the module holds its parameters again.
TEST(Lifetime, AStage3GraphThatOutlivesItsEngineIsPlainLibTorch) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const config::Config cfg = make_config(3, false, false, world, kGlobalBatch / world, 1);
  auto plain = make_model(ModelKind::kUnitMlp);
  auto model = make_model(ModelKind::kUnitMlp);
  at::Tensor loss;
  {
    Engine engine(model, cfg, comm);
    loss = rank_loss(ModelKind::kUnitMlp, *model, comm, at::kFloat);
  }
  loss.backward();
  rank_loss(ModelKind::kUnitMlp, *plain, comm, at::kFloat).backward();
  const auto got = model->parameters(), want = plain->parameters();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].grad().defined()) << "parameter " << i;
    EXPECT_TRUE(at::allclose(got[i].grad(), want[i].grad(), 1e-5, 1e-6)) << "parameter " << i;
  }
}

// The module's parameters replaced after the engine was built (model->to())
// would leave the engine training tensors the module no longer has: the
// next backward() names the parameter. A sparse gradient (an Embedding with
// sparse(true)) is named too, instead of failing inside the reducer.
TEST(Modules, ReplacedParametersAndSparseGradientsAreNamed) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  // (Stage 3: Stage3ReplacedUnitParametersAreNamedAtTheirGather.)
  for (int stage : {0, 2}) {
    const config::Config cfg = make_config(stage, false, false, world, kGlobalBatch / world, 1);
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
    model->to(at::kDouble);
    try {
      engine.backward(model->parameters()[0].sum().to(at::kFloat));
      ADD_FAILURE() << "stage " << stage << ": a module converted after the engine was built was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("parameter 'l1.weight' was replaced after the engine was built (it is now Double"),
                std::string::npos) << what;
    }
  }
  struct Sparse : torch::nn::Module {
    torch::nn::Embedding emb{nullptr};
    Sparse() { emb = register_module("emb", torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 4).sparse(true))); }
  };
  auto sparse = std::make_shared<Sparse>();
  Engine engine(sparse, make_config(2, false, false, world, kGlobalBatch / world, 1), comm);
  try {
    engine.backward(sparse->emb->forward(at::arange(3)).sum());
    ADD_FAILURE() << "a sparse gradient was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'emb.weight' has a sparse gradient"), std::string::npos)
        << e.what();
  }
}

// At stage 3 a unit's parameters are the engine's views into its buckets:
// set_data() (what torch::load and model->to() do) on one, between steps,
// used to be put back silently by the next gather, the replacement lost.
// The gather names it instead, and so does backward() for a kept one.
TEST(Modules, Stage3ReplacedUnitParametersAreNamedAtTheirGather) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const config::Config cfg = make_config(3, false, false, world, kGlobalBatch / world, 1);
  for (const bool to_double : {false, true}) {
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
    ASSERT_TRUE(mlp_step(engine, *model, comm, 0));
    auto* mlp = dynamic_cast<Mlp*>(model.get());
    ASSERT_NE(mlp, nullptr);
    if (to_double) {
      model->to(at::kDouble);
    } else {
      torch::NoGradGuard no_grad;
      mlp->l2->weight.set_data(at::ones({40, 48}));
    }
    try {
      mlp_step(engine, *model, comm, 1);
      ADD_FAILURE() << "a unit's parameter replaced after the engine was built was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      // (model->to(): the first unit's first parameter in bucket order.)
      const std::string name = to_double ? "l1." : "l2.weight'";
      EXPECT_NE(what.find("parameter '" + name), std::string::npos) << what;
      EXPECT_NE(what.find(" was replaced after the engine was built ("), std::string::npos)
          << (to_double ? "to(kDouble): " : "set_data: ") << what;
      EXPECT_NE(what.find("at stage 3 the next gather would have put the engine's values back over it"),
                std::string::npos)
          << what;
    }
  }
}

TEST(Lifetime, FailedConstructorLeavesTheModuleAsItWas) {
  // The device budget refuses after the parameters became views and got their
  // hooks (the moments come later). One process: the refusal is per rank.
  auto single = comm::make_single_process_communicator();
  auto model = make_model(ModelKind::kMlp);
  std::vector<at::Tensor> before;
  for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
  std::vector<const void*> storages;
  for (const auto& p : model->parameters()) storages.push_back(p.data_ptr());
  config::Config cfg = make_config(0, false, true, 1, 2, 1);
  std::vector<std::size_t> numels;
  for (const auto& p : model->parameters()) numels.push_back(static_cast<std::size_t>(p.numel()));
  const std::int64_t padded = static_cast<std::int64_t>(
      FlatLayout(numels, static_cast<std::size_t>(cfg.zero_optimization.reduce_bucket_size), 1, 1, kPlanAlignElements).padded_numel());
  // Room for the construction peak (fp32 copy + fp32 master + bf16 params:
  // 10 bytes per element) and the first moment, not the second.
  cfg.device_memory_limit = 10 * padded;
  try {
    Engine engine(model, cfg, *single);
    FAIL() << "expected the device budget to refuse the moments";
  } catch (const ::zero::Error& e) {
    // Refused after the parameters were views with hooks.
    EXPECT_NE(std::string(e.what()).find("optimizer moments"), std::string::npos) << e.what();
  }
  std::size_t i = 0;
  for (const auto& p : model->parameters()) {
    EXPECT_EQ(p.scalar_type(), at::kFloat) << "parameter " << i;
    EXPECT_EQ(p.data_ptr(), storages[i]) << "parameter " << i << " is not its own tensor again";
    EXPECT_TRUE(at::equal(p, before[i])) << "parameter " << i;
    ++i;
  }
  mlp_loss(*model, *single, at::kFloat).backward();
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined()) << "a hook survived the failure";
}

TEST(Lifetime, SecondEngineStartsFromTheFirstOnesWeights) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  auto model = make_model(ModelKind::kMlp);
  const config::Config cfg = make_config(2, true, false, world, kGlobalBatch / world, 1);
  std::vector<at::Tensor> master;
  {
    Engine first(model, cfg, comm);
    for (int step = 0; step < 3; ++step) {
      first.backward(mlp_loss(*model, comm, first.dtype()));
      first.step();
    }
    master = first.gather_master_params();
  }
  // fp32 training: the module holds exactly the first engine's master weights.
  std::size_t i = 0;
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(at::equal(p, master[i])) << "parameter " << i;
    ++i;
  }
  // A second engine on it starts from them, as one on a fresh copy would.
  auto fresh = make_model(ModelKind::kMlp);
  {
    torch::NoGradGuard no_grad;
    i = 0;
    for (auto& p : fresh->parameters()) p.copy_(master[i++]);
  }
  Engine second(model, cfg, comm), third(fresh, cfg, comm);
  for (int step = 0; step < 2; ++step) {
    second.backward(mlp_loss(*model, comm, second.dtype()));
    second.step();
    third.backward(mlp_loss(*fresh, comm, third.dtype()));
    third.step();
  }
  const auto a = second.gather_master_params(), b = third.gather_master_params();
  for (std::size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(at::equal(a[k], b[k])) << "parameter " << k;
}

// A backward that throws part way (after some buckets were launched) drops
// its accumulation window; the engine then trains on as if the failed
// micro-batches had never been: bitwise the run without them.
TEST(Backward, AThrowDropsTheWindowAndTrainingGoesOn) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  for (auto [stage, offload] : {std::pair{0, false}, std::pair{1, false}, std::pair{2, false}, std::pair{2, true}}) {
    const std::string what = "stage " + std::to_string(stage) + (offload ? " offload" : "");
    const config::Config cfg = make_config(stage, offload, false, world, kGlobalBatch / 2 / world, 2);
    auto run = [&](bool with_failure) {
      auto model = make_model(ModelKind::kMlp);
      auto& mlp = static_cast<Mlp&>(*model);
      Engine engine(model, cfg, comm);
      GlobalBatch gb = global_batch(ModelKind::kMlp, 0);
      const int micro = kGlobalBatch / 2 / world;
      auto micro_loss_at = [&](int j, bool fail) {
        const int begin = j * (kGlobalBatch / 2) + comm.rank() * micro;
        at::Tensor a1 = mlp.l1->forward(gb.x.narrow(0, begin, micro));
        // Thrown when a1's gradient arrives: after l3's and l2's parameter
        // gradients (their buckets filled, some launched), before l1's.
        if (fail) a1.register_hook([](const at::Tensor&) -> at::Tensor { throw std::runtime_error("boom"); });
        at::Tensor out = mlp.l3->forward(at::gelu(mlp.l2->forward(at::gelu(a1))));
        return at::mse_loss(out, gb.y.narrow(0, begin, micro));
      };
      for (int step = 0; step < 3; ++step) {
        if (with_failure && step == 1) {
          // A window whose second micro-batch fails: both are dropped.
          engine.backward(micro_loss_at(0, false));
          EXPECT_FALSE(engine.step());
          EXPECT_THROW(engine.backward(micro_loss_at(1, true)), std::exception) << what;
        }
        for (int j = 0; j < 2; ++j) {
          engine.backward(micro_loss_at(j, false));
          EXPECT_EQ(engine.step(), j == 1) << what;
        }
      }
      engine.flush();
      return engine.gather_master_params();
    };
    const auto got = run(true), want = run(false);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << what << " parameter " << i;
  }
}

// An MLP whose first layer is frozen and which scales its output by a buffer.
struct FrozenFirstLayer : torch::nn::Module {
  FrozenFirstLayer() {
    l1 = register_module("l1", torch::nn::Linear(16, 24));
    l2 = register_module("l2", torch::nn::Linear(24, 4));
    scale = register_buffer("scale", at::ones({4}));
    l1->weight.requires_grad_(false);
    l1->bias.requires_grad_(false);
  }
  at::Tensor forward(const at::Tensor& x) { return l2->forward(at::gelu(l1->forward(x))) * scale; }
  torch::nn::Linear l1{nullptr}, l2{nullptr};
  at::Tensor scale;
};

// Ranks that built their frozen layers and buffers differently (another
// seed, another buffer value) train identically: the engine broadcasts them
// from rank 0, as it does the trainable parameters.
TEST(Modules, FrozenParametersAndBuffersStartEqualOnEveryRank) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  for (bool bf16 : {false, true}) {
    torch::manual_seed(77 + comm.rank());  // a different init on every rank
    auto model = std::make_shared<FrozenFirstLayer>();
    {
      torch::NoGradGuard no_grad;
      model->scale.fill_(1.0 + comm.rank());
    }
    // Integer and bool buffers too (a step counter of 3 bytes' worth, a
    // mask of an odd length: padded to the broadcast's 2-byte units).
    at::Tensor counter = model->register_buffer("counter", at::full({3}, 10 + comm.rank(), at::kLong));
    at::Tensor mask = model->register_buffer("mask", at::full({5}, comm.rank() % 2 == 1, at::kBool));
    Engine engine(model, make_config(2, false, bf16, world, 2, 1), comm);
    for (const at::Tensor& t : {model->l1->weight, model->l1->bias, model->scale}) {
      at::Tensor sum = t.detach().to(at::kFloat).contiguous().clone();
      comm.all_reduce(sum.data_ptr(), static_cast<std::size_t>(sum.numel()), DType::kFloat32)->wait();
      EXPECT_TRUE(at::equal(sum / world, t.detach().to(at::kFloat))) << "rank " << comm.rank() << " bf16 " << bf16;
    }
    EXPECT_TRUE(at::equal(model->scale.to(at::kFloat), at::ones({4})));  // rank 0's value
    EXPECT_TRUE(at::equal(model->named_buffers()["counter"], at::full({3}, 10, at::kLong))) << "rank " << comm.rank();
    EXPECT_TRUE(at::equal(model->named_buffers()["mask"], at::zeros({5}, at::kBool))) << "rank " << comm.rank();
    (void)counter;
    (void)mask;
  }
}

// A large frozen layer under a small trained head (a base under adapters);
// `units`: both marked as stage-3 units.
struct FrozenBase : torch::nn::Module {
  explicit FrozenBase(bool units = false) {
    base = register_module("base", torch::nn::Linear(256, 256));
    head = register_module("head", torch::nn::Linear(256, 4));
    scale = register_buffer("scale", at::ones({4}));
    for (auto& p : base->parameters()) p.requires_grad_(false);
    if (units) {
      zero::mark_unit(*base);
      zero::mark_unit(*head);
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = at::gelu(zero::unit(*base, x, [&](const at::Tensor& in) { return base->forward(in); }));
    return zero::unit(*head, h, [&](const at::Tensor& in) { return head->forward(in); }) * scale;
  }
  torch::nn::Linear base{nullptr}, head{nullptr};
  at::Tensor scale;
};

// The frozen parameters and buffers are whole on every rank at stages 0-2,
// and at stage 3 where no unit holds them; at stage 3 those of a unit are
// partitioned (`units`: 1/world of them on each rank; 256 x 256 + 256
// elements split evenly by 1, 2 and 4 ranks, so every rank's share is the
// same). The ledger counts their bytes (as they are after construction, in
// the training precision), zero-estimate's --frozen-params counts the same,
// and device_memory_limit refuses a budget they do not fit, naming them.
TEST(Modules, FrozenParametersAndBuffersAreInTheLedgerAndTheBudget) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  for (int stage : {0, 2, 3}) {
    for (const bool units : {false, true}) {
      if (units && stage != 3) continue;
      for (bool bf16 : {false, true}) {
        const std::string what =
            "stage " + std::to_string(stage) + (bf16 ? " bf16" : " fp32") + (units ? " with units" : "");
        const std::int64_t es = bf16 ? 2 : 4;
        torch::manual_seed(5);
        auto model = std::make_shared<FrozenBase>(units);
        config::Config cfg = make_config(stage, false, bf16, world, 2, 1);
        std::int64_t limit = 0;
        {
          Engine engine(model, cfg, comm);
          const std::int64_t frozen = es * (256 * 256 + 256), buffer = es * 4;
          const std::int64_t want = (units ? frozen / world : frozen) + buffer;
          const auto s = engine.ledger().snapshot();
          EXPECT_EQ(s.bytes(Tier::kDevice, Kind::kFrozen), want) << what;
          EstimateInput in;
          in.params = 256 * 4 + 4;
          in.frozen_params = 256 * 256 + 256;
          in.element_bytes = es;
          in.world = world;
          in.stage = stage;
          // The estimate's units: the head's (its frozen base spread over it), or none.
          if (stage == 3) in.param_units = {units ? 1 : -1};
          in.persistence_threshold = cfg.zero_optimization.stage3_param_persistence_threshold;
          EXPECT_EQ(estimate_memory(in).device_frozen, want - buffer) << what << " (the buffer aside)";
          // A budget 256 x 128 of them short; at stage 3 with units, where
          // the construction's peak comes as their partition is added (one
          // bucket in fp32 still alive), a byte short of that peak.
          limit = units ? s.tier_peak[int(Tier::kDevice)] - 1 : s.tier_current[int(Tier::kDevice)] - es * 256 * 128;
          // And it trains.
          engine.backward(model->forward(at::randn({2, 256}).to(engine.dtype())).to(at::kFloat).square().mean());
          engine.step();
        }
        // A budget that the frozen parameters do not fit: refused at construction, naming them.
        torch::manual_seed(5);
        model = std::make_shared<FrozenBase>(units);
        cfg.device_memory_limit = limit;
        try {
          Engine engine(model, cfg, comm);
          ADD_FAILURE() << what << ": a budget the frozen parameters do not fit was accepted";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find(units ? "the frozen parameter partition"
                                                     : "the frozen parameters and the module's buffers"),
                    std::string::npos)
              << what << ": " << e.what();
        }
      }
    }
  }
}

// In fp32 training buffers keep their dtype, as in a plain LibTorch loop: a
// float64 buffer keeps its precision (it was cast to fp32 and lost it) and
// a half one its dtype, and both still start equal on every rank (rank 0's,
// broadcast as bytes). In bf16 they take the training precision.
struct OddBuffers : torch::nn::Module {
  OddBuffers() {
    l = register_module("l", torch::nn::Linear(16, 4));
    wide = register_buffer("wide", at::full({3}, 1.0 + 1e-10, at::kDouble));
    narrow = register_buffer("narrow", at::full({5}, 0.5, at::kHalf));
  }
  torch::nn::Linear l{nullptr};
  at::Tensor wide, narrow;
};

TEST(Modules, BuffersKeepTheirDtypeInFp32) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    auto model = std::make_shared<OddBuffers>();
    if (comm.rank() > 0) {
      torch::NoGradGuard no_grad;
      model->wide.fill_(7.0);
      model->narrow.fill_(3.0);
    }
    Engine engine(model, make_config(2, false, bf16, world, 2, 1), comm);
    EXPECT_EQ(model->wide.scalar_type(), bf16 ? at::kBFloat16 : at::kDouble);
    EXPECT_EQ(model->narrow.scalar_type(), bf16 ? at::kBFloat16 : at::kHalf);
    if (!bf16) {
      EXPECT_TRUE(at::equal(model->wide, at::full({3}, 1.0 + 1e-10, at::kDouble))) << "rank " << comm.rank();
      EXPECT_TRUE(at::equal(model->narrow, at::full({5}, 0.5, at::kHalf))) << "rank " << comm.rank();
    } else {
      EXPECT_TRUE(at::equal(model->narrow.to(at::kFloat), at::full({5}, 0.5))) << "rank " << comm.rank();
    }
  }
}

// A module with a buffer or a frozen parameter that the checkpoint lacks is
// refused at load, naming it (each rank used to keep its own value, ranks
// apart, silently); the other way round was refused already.
TEST(Modules, ALoadRefusesModuleStateTheCheckpointLacks) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  struct Plain : torch::nn::Module {
    Plain() { l = register_module("l", torch::nn::Linear(16, 4)); }
    torch::nn::Linear l{nullptr};
  };
  struct WithFrozen : Plain {
    WithFrozen() { gain = register_parameter("gain", at::ones({4}), /*requires_grad=*/false); }
    at::Tensor gain;
  };
  const std::filesystem::path dir = shared_temp_dir(comm, "zero_lacks_", "ckpt");
  const config::Config cfg = make_config(2, false, false, world, 2, 1);
  {
    auto plain = std::make_shared<Plain>();
    Engine engine(plain, cfg, comm);
    engine.save_checkpoint(dir.string(), "plain");
  }
  for (const bool buffers : {true, false}) {
    std::shared_ptr<torch::nn::Module> model;
    if (buffers) {
      model = std::make_shared<OddBuffers>();
    } else {
      model = std::make_shared<WithFrozen>();
    }
    Engine engine(model, cfg, comm);
    try {
      engine.load_checkpoint(dir.string(), "plain");
      ADD_FAILURE() << "a checkpoint without the module's " << (buffers ? "buffers" : "frozen parameter") << " loaded";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(buffers ? "holds no narrow (a buffer), which this module has"
                                  : "holds no gain (a frozen parameter), which this module has"),
                std::string::npos)
          << what;
    }
    // DeepSpeed's load_module_strict false: the module's values kept, said.
    testing::internal::CaptureStderr();
    EXPECT_NO_THROW(engine.load_checkpoint(dir.string(), "plain", /*load_module_strict=*/false));
    const std::string said = testing::internal::GetCapturedStderr();
    if (comm.rank() == 0) {
      EXPECT_NE(said.find(buffers ? "holds no narrow, wide (load_module_strict false): the module's values are kept"
                                  : "holds no gain (load_module_strict false): the module's values are kept"),
                std::string::npos)
          << said;
    }
  }
  // A buffer of a dtype the checkpoint cannot encode (int8) is left out at
  // the save, said there, and not asked for at the load: a model loads its
  // own checkpoint.
  struct WithInt8 : Plain {
    WithInt8() { q = register_buffer("q", at::ones({8}, at::kChar)); }
    at::Tensor q;
  };
  {
    auto model = std::make_shared<WithInt8>();
    Engine engine(model, cfg, comm);
    engine.save_checkpoint(dir.string(), "int8");
  }
  auto model = std::make_shared<WithInt8>();
  Engine engine(model, cfg, comm);
  EXPECT_NO_THROW(engine.load_checkpoint(dir.string(), "int8"));
  comm.barrier()->wait();
  if (comm.rank() == 0) rm_tree(dir);
}

TEST(Lifetime, DestroyingWithAPendingDelayedUpdateSaysSo) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  auto model = make_model(ModelKind::kMlp);
  config::Config cfg = make_config(2, true, false, world, kGlobalBatch / world, 1);
  cfg.zero_optimization.offload_optimizer.delayed_param_update = true;
  cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = 1;
  testing::internal::CaptureStderr();
  {
    Engine engine(model, cfg, comm);
    for (int step = 0; step < 2; ++step) {  // the second step is delayed: pending at the end
      engine.backward(mlp_loss(*model, comm, engine.dtype()));
      engine.step();
    }
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("delayed update pending"), std::string::npos) << err;
  EXPECT_NE(err.find("engine.flush()"), std::string::npos) << err;
  // After flush() nothing is said.
  testing::internal::CaptureStderr();
  {
    Engine engine(model, cfg, comm);
    for (int step = 0; step < 2; ++step) {
      engine.backward(mlp_loss(*model, comm, engine.dtype()));
      engine.step();
    }
    engine.flush();
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("pending"), std::string::npos);
}

// ---- Host reads: at most one per optimizer step ------------------------

// Counts the host reads of a tensor's value (Tensor::item(), what a GPU would
// wait for) on any thread while alive.
class HostReadCounter {
 public:
  HostReadCounter()
      : handle_(at::addGlobalCallback(
            at::RecordFunctionCallback(
                [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                  if (std::string_view(fn.name()) == "aten::_local_scalar_dense") count().fetch_add(1);
                  return nullptr;
                })
                .scopes({at::RecordScope::FUNCTION}))) {}
  ~HostReadCounter() { at::removeCallback(handle_); }
  static std::atomic<int>& count() {
    static std::atomic<int> n{0};
    return n;
  }

 private:
  at::CallbackHandle handle_;
};

TEST(HostReads, AtMostOnePerOptimizerStepAtEveryStage) {
  // docs/gpu.md: the clipping norm and the loss scaler's overflow check stay
  // where the gradients are; one host read per optimizer step (the global
  // squared norm both come from), none per micro-batch. fp16 (dynamic
  // scaling) with clipping, accumulation 2.
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  for (int stage : {0, 1, 2, 3}) {
    config::Config cfg = make_config(stage, false, false, world, kGlobalBatch / world / 2, 2);
    cfg.fp16.enabled = true;
    const ModelKind kind = stage == 3 ? ModelKind::kUnitMlp : ModelKind::kMlp;
    auto model = make_model(kind);
    Engine engine(model, cfg, comm);
    const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
    for (int step = 0; step < 3; ++step) {
      GlobalBatch gb = global_batch(kind, step);
      int reads = 0;
      for (int j = 0; j < 2; ++j) {
        const int begin = j * (kGlobalBatch / 2) + comm.rank() * micro;
        at::Tensor loss = micro_loss(kind, *model, gb.x.narrow(0, begin, micro), gb.y.narrow(0, begin, micro),
                                     engine.dtype());
        HostReadCounter::count() = 0;
        {
          HostReadCounter counter;
          engine.backward(loss);
          engine.step();
        }
        reads += HostReadCounter::count();
        if (j == 0) {
          EXPECT_EQ(HostReadCounter::count(), 0) << "stage " << stage << " step " << step << ": a micro-batch";
        }
      }
      EXPECT_EQ(reads, 1) << "stage " << stage << " step " << step;
    }
    EXPECT_EQ(engine.stats().step + engine.stats().skipped, 3);
  }
}

// Engine::trace(): every lane the engine records, in the order the work
// happened, stamped with the step it belongs to. On the CPU the compute is
// synchronous, so its intervals follow one another; the CPU step of a
// delayed update runs on the worker, after its own step began, one interval
// per bucket; an ordinary step's CPU step lies inside its "step" interval.
TEST(Timeline, TracesComputeCpuStepAndWaitsInOrder) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  constexpr int kAccum = 2, kSteps = 4, kWarmup = 2;
  auto model = make_model(ModelKind::kMlp);
  config::Config cfg = make_config(2, true, false, world, kGlobalBatch / kAccum / world, kAccum);
  cfg.zero_optimization.offload_optimizer.delayed_param_update = true;
  cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = kWarmup;
  Engine engine(model, cfg, comm);
  engine.trace(true);
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < kAccum; ++micro) {
      engine.backward(mlp_loss(*model, comm, engine.dtype()));
      engine.step();
    }
  }
  engine.flush();
  const std::vector<TimelineInterval> tl = engine.take_timeline();
  EXPECT_TRUE(engine.take_timeline().empty()) << "take_timeline() clears what it returned";

  std::vector<const TimelineInterval*> compute, cpu, waits;
  for (const TimelineInterval& iv : tl) {
    EXPECT_LE(0.0, iv.start_ms) << iv.lane << " " << iv.what;
    EXPECT_LE(iv.start_ms, iv.end_ms) << iv.lane << " " << iv.what;
    if (iv.lane == "compute") compute.push_back(&iv);
    else if (iv.lane == "cpu step") cpu.push_back(&iv);
    else if (iv.lane == "host wait") waits.push_back(&iv);
    else ADD_FAILURE() << "a lane the CPU does not have: " << iv.lane;
  }
  // Per optimizer step: forward, backward for each micro-batch, then the
  // boundary's step (off the boundary step() returns at once, untraced).
  constexpr std::size_t kPerStep = 2 * kAccum + 1;
  ASSERT_EQ(compute.size(), kPerStep * kSteps);
  for (std::size_t i = 0; i < compute.size(); ++i) {
    const std::size_t k = i % kPerStep;
    EXPECT_EQ(compute[i]->what, k == kPerStep - 1 ? "step" : (k % 2 == 0 ? "forward" : "backward"))
        << "compute interval " << i;
    if (i > 0) {
      EXPECT_LE(compute[i - 1]->end_ms, compute[i]->start_ms + 1e-3) << "compute interval " << i;
    }
  }
  // One CPU-step interval per piece per optimizer step (the small buckets
  // of make_config give several); each names its step.
  ASSERT_EQ(cpu.size() % kSteps, 0u);
  const std::size_t buckets = cpu.size() / kSteps;
  ASSERT_GT(buckets, 1u);
  for (int s = 0; s < kSteps; ++s) {
    const TimelineInterval& first = *cpu[static_cast<std::size_t>(s) * buckets];
    EXPECT_EQ(first.step, s) << "the CPU step of optimizer step " << s + 1;
    EXPECT_EQ(first.what, "piece 0");
    const TimelineInterval& st = *compute[static_cast<std::size_t>(s) * kPerStep + kPerStep - 1];
    EXPECT_GE(first.start_ms, st.start_ms - 1e-3) << "step " << s;
    const TimelineInterval& last = *cpu[static_cast<std::size_t>(s + 1) * buckets - 1];
    if (s < kWarmup) {
      EXPECT_LE(last.end_ms, st.end_ms + 1e-3) << "an ordinary step's CPU step is inside step() (step " << s << ")";
    }
  }
  // The main thread waited for each delayed update once: at the next
  // boundary and at flush().
  EXPECT_EQ(waits.size(), static_cast<std::size_t>(kSteps + 1));

  // Off: nothing more is recorded.
  engine.trace(false);
  engine.backward(mlp_loss(*model, comm, engine.dtype()));
  engine.step();
  EXPECT_TRUE(engine.take_timeline().empty());
}

}  // namespace
}  // namespace zero::test

// ---- Construction checks that every rank takes alike ------------------------

namespace zero::test {
namespace {

// A budget that covers what the engine holds but not its gradient buckets at
// their bound: every rank refuses at construction with the same message,
// instead of one rank refusing inside backward while the others wait in the
// reduce-scatter (the test returning at all on 2 and 4 ranks is the "no
// hang" half).
TEST(Budget, BucketRefusalIsTheSameOnEveryRankAndAtConstruction) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  config::Config cfg = make_config(2, false, true, world, 2, 1);
  std::int64_t held = 0;
  {
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
    held = engine.ledger().snapshot().tier_current[int(Tier::kDevice)];
  }
  std::vector<std::size_t> numels;
  for (const auto& p : make_model(ModelKind::kMlp)->parameters()) numels.push_back(static_cast<std::size_t>(p.numel()));
  const FlatLayout layout(numels, static_cast<std::size_t>(cfg.zero_optimization.reduce_bucket_size), world, world, kPlanAlignElements);
  std::vector<std::size_t> sizes;
  for (const Bucket& b : layout.buckets()) sizes.push_back(b.padded);
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  std::int64_t bound = 0;
  for (std::size_t i = 0; i < sizes.size() && i < static_cast<std::size_t>(kPlanLiveBuckets); ++i) bound += static_cast<std::int64_t>(sizes[i] * 2);
  ASSERT_GT(bound, 0);

  cfg.device_memory_limit = held + bound - 1;
  float refused = 0.0f;
  try {
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
  } catch (const ::zero::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the gradient buckets need up to"), std::string::npos) << msg;
    EXPECT_NE(msg.find("= " + std::to_string(held + bound) + " bytes"), std::string::npos) << msg;
    refused = 1.0f;
  }
  // Every rank refused (the sum is the world size on every rank).
  comm.all_reduce(&refused, 1, DType::kFloat32)->wait();
  EXPECT_EQ(refused, static_cast<float>(world));

  // At the bound it trains.
  cfg.device_memory_limit = held + bound;
  auto model = make_model(ModelKind::kMlp);
  Engine engine(model, cfg, comm);
  GlobalBatch gb = global_batch(ModelKind::kMlp, 0);
  const int rank = comm.rank();
  engine.backward(micro_loss(ModelKind::kMlp, *model, gb.x.narrow(0, rank * 2, 2), gb.y.narrow(0, rank * 2, 2),
                             engine.dtype()));
  EXPECT_TRUE(engine.step());
}

// Batch sizes resolved for another world size are refused with the fix.
TEST(Config, BatchSizesForAnotherWorldSizeAreRefused) {
  comm::Communicator& comm = world_comm();
  config::Config cfg = make_config(1, false, false, comm.world_size() + 1, 2, 1);
  cfg.world_size = comm.world_size() + 1;
  try {
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
    FAIL() << "expected an error";
  } catch (const ::zero::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("were resolved for " + std::to_string(comm.world_size() + 1) + " rank(s) but the "
                       "communicator has " + std::to_string(comm.world_size())),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("load_config(path, comm.world_size())"), std::string::npos) << msg;
  }
}

// A config built in code with an optimizer type zerocpp has not (or spelt
// otherwise than the parser writes it) is refused at construction, not
// stepped as some other optimizer.
// Two Linear layers registered in the order asked for.
struct TwoLayers : torch::nn::Module {
  explicit TwoLayers(bool b_first) {
    if (b_first) b = register_module("b", torch::nn::Linear(4, 4));
    a = register_module("a", torch::nn::Linear(4, 4));
    if (!b_first) b = register_module("b", torch::nn::Linear(4, 4));
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};

// Ranks built differently train silently wrong (their own rate on their
// partition, rank 0's values broadcast into another layer) or meet
// collectives of other sizes: refused at construction on every rank, naming
// the first difference. Settings that may differ per node do not count.
TEST(Config, RanksBuiltDifferentlyAreRefusedNamingTheDifference) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  if (world == 1) GTEST_SKIP() << "needs two ranks or more";
  const bool last = comm.rank() == world - 1;
  const std::string other = std::to_string(world - 1);
  auto expect_refused = [&](const std::shared_ptr<torch::nn::Module>& model, const config::Config& cfg,
                            const std::string& expect) {
    try {
      Engine engine(model, cfg, comm);
      ADD_FAILURE() << "built; expected: " << expect;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  };
  config::Config cfg = make_config(2, true, false, world, kGlobalBatch / world, 1);
  config::Config mine = cfg;
  if (last) mine.optimizer.lr = cfg.optimizer.lr * 2;
  expect_refused(make_model(ModelKind::kMlp), mine,
                 "rank " + other + " was given another config than rank 0 (optimizer.params.lr: ");
  mine = cfg;
  if (last) mine.zero_optimization.stage = 1;
  expect_refused(make_model(ModelKind::kMlp), mine, "(zero_optimization.stage: 2 on rank 0, 1 on rank " + other);
  // (Every rank must refuse a memory budget alike: the limit is compared.)
  mine = cfg;
  if (last) mine.device_memory_limit = std::int64_t{1} << 30;
  expect_refused(make_model(ModelKind::kMlp), mine, "(device_memory_limit: 0 on rank 0, 1073741824 on rank " + other);
  expect_refused(std::make_shared<TwoLayers>(last), cfg,
                 "rank " + other + "'s model differs from rank 0's at parameter 0 of 4 (rank 0: a.weight [4, 4] "
                 "Float trainable; rank " + other + ": b.weight [4, 4] Float trainable)");
  auto frozen = std::make_shared<TwoLayers>(false);
  if (last) frozen->b->bias.set_requires_grad(false);
  expect_refused(frozen, cfg, "at parameter 3 of 4 (rank 0: b.bias [4] Float trainable; rank " + other +
                                  ": b.bias [4] Float frozen)");
  // Per node: where the NVMe folder is, pinning, threads, printing; and
  // publish_in_backward, off with several ranks however it is said.
  mine = cfg;
  if (last) {
    mine.zero_optimization.offload_optimizer.publish_in_backward = false;
    mine.steps_per_print = 7;
    mine.zero_optimization.offload_optimizer.cpu_threads = 1;
    mine.zero_optimization.offload_optimizer.pin_memory = !cfg.zero_optimization.offload_optimizer.pin_memory;
  }
  auto model = make_model(ModelKind::kMlp);
  Engine engine(model, mine, comm);
  engine.backward(rank_loss(ModelKind::kMlp, *model, comm, engine.dtype()));
  EXPECT_TRUE(engine.step());
}

TEST(Config, AnOptimizerTypeBuiltInCodeIsChecked) {
  comm::Communicator& comm = world_comm();
  for (const char* type : {"adamw", "Lamb", "", "muon"}) {
    config::Config cfg = make_config(2, true, false, comm.world_size(), 2, 1);
    cfg.optimizer.type = type;
    try {
      auto model = make_model(ModelKind::kMlp);
      Engine engine(model, cfg, comm);
      ADD_FAILURE() << "optimizer type '" << type << "' was accepted";
    } catch (const ::zero::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("optimizer.type=\"") + type +
                                           "\" is not an optimizer zerocpp has: set it to \"Adam\", \"AdamW\", "
                                           "\"Adagrad\", \"Lion\" or \"Muon\""),
                std::string::npos)
          << e.what();
    }
  }
}

// Settings the engine does not act on are named once, with what it does instead.
TEST(Config, IgnoredSettingsAreNamedAtConstruction) {
  comm::Communicator& comm = world_comm();
  config::Config cfg = make_config(2, true, false, comm.world_size(), 2, 1);
  cfg.zero_optimization.reduce_scatter = false;
  cfg.zero_optimization.contiguous_gradients = false;
  cfg.zero_optimization.allgather_bucket_size = 12345;
  cfg.zero_optimization.offload_optimizer.pin_memory = true;
  testing::internal::CaptureStderr();
  {
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  // The defaults warn about nothing, nor an allgather_bucket_size equal to
  // reduce_bucket_size, as DeepSpeed's examples set them (every rank builds
  // both engines: the constructor is collective).
  config::Config quiet = make_config(2, true, false, comm.world_size(), 2, 1);
  quiet.zero_optimization.reduce_bucket_size = quiet.zero_optimization.allgather_bucket_size = 200000000;
  testing::internal::CaptureStderr();
  {
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, quiet, comm);
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("config warning"), std::string::npos);
  if (comm.rank() != 0) {
    EXPECT_EQ(err.find("config warning"), std::string::npos) << "only rank 0 warns:\n" << err;
    return;
  }
  for (const char* key : {"zero_optimization.reduce_scatter=false is ignored",
                          "zero_optimization.contiguous_gradients=false is ignored",
                          "zero_optimization.allgather_bucket_size is ignored: the parameter all-gather uses the "
                          "reduce buckets",
                          "offload_optimizer.pin_memory has no effect on the CPU"}) {
    EXPECT_NE(err.find(key), std::string::npos) << key << "\n" << err;
  }
}

// The parser's warnings (a misplaced key) are printed by the engine on rank
// 0, so that a program that never prints Config::warnings still shows them
// (a misplaced offload_optimizer trained without offload, silently); one
// that printed them clears the list, and nothing is said twice.
TEST(Config, TheParsersWarningsArePrintedByTheEngine) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const std::string text = "{\"train_micro_batch_size_per_gpu\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}";
  config::Config cfg = config::parse_config(text, world, "ds.json");
  ASSERT_EQ(cfg.warnings.size(), 1u);
  for (const bool cleared : {false, true}) {
    if (cleared) cfg.warnings.clear();
    testing::internal::CaptureStderr();
    {
      auto model = make_model(ModelKind::kMlp);
      Engine engine(model, cfg, comm);
    }
    const std::string err = testing::internal::GetCapturedStderr();
    const bool said = err.find("zerocpp: config warning: ds.json: unknown key 'offload_optimizer' is ignored; it "
                               "belongs inside 'zero_optimization'") != std::string::npos;
    EXPECT_EQ(said, comm.rank() == 0 && !cleared) << err;
  }
}

// offload_optimizer.cpu_threads above the machine's cores is a warning (rank
// 0's) and the core count: 10^5 threads exhausted a machine before the first
// step (4096 here, which a machine survives if the cap is lost).
TEST(Config, CpuThreadsAboveTheCoresAreTheCoreCount) {
  comm::Communicator& comm = world_comm();
  if (std::thread::hardware_concurrency() >= 4096) GTEST_SKIP() << "a machine of 4096 cores or more";
  config::Config cfg = make_config(2, true, false, comm.world_size(), kGlobalBatch / comm.world_size(), 1);
  cfg.zero_optimization.offload_optimizer.cpu_threads = 4096;
  auto model = make_model(ModelKind::kMlp);
  testing::internal::CaptureStderr();
  Engine engine(model, cfg, comm);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(mlp_step(engine, *model, comm, 0));
  if (comm.rank() == 0) {
    EXPECT_NE(err.find("offload_optimizer.cpu_threads 4096 is more than the"), std::string::npos) << err;
  } else {
    EXPECT_EQ(err.find("cpu_threads"), std::string::npos) << err;
  }
}

// cpu_threads 0: this rank's share of the cores it may run on among the
// ranks on this node (ranks that each took every core contended for them),
// said in the engine's start line.
TEST(Config, CpuThreadsZeroIsTheRanksShareOfItsCores) {
  comm::Communicator& comm = world_comm();
  config::Config cfg = make_config(2, true, false, comm.world_size(), kGlobalBatch / comm.world_size(), 1);
  cfg.zero_optimization.offload_optimizer.cpu_threads = 0;
  auto model = make_model(ModelKind::kMlp);
  std::vector<std::string> said;
  struct Restore {
    LogSink previous;
    ~Restore() { set_log_sink(std::move(previous)); }
  } restore;
  restore.previous = set_log_sink([&](const LogRecord& r) { said.emplace_back(r.text); });
  Engine engine(model, cfg, comm);
  EXPECT_TRUE(mlp_step(engine, *model, comm, 0));
  const int local = comm::launcher_local_size().value_or(1);
  const int want = std::max(1, usable_cores() / local);
  if (comm.rank() == 0) {
    const std::string tail = ", " + std::to_string(want) + " CPU optimizer thread" + (want == 1 ? "" : "s");
    bool found = false;
    for (const std::string& line : said) {
      found = found || (line.rfind("stage 2,", 0) == 0 && line.size() >= tail.size() &&
                        line.compare(line.size() - tail.size(), tail.size(), tail) == 0);
    }
    EXPECT_TRUE(found) << "no start line ending '" << tail << "' (local ranks " << local << ", cores "
                       << usable_cores() << ")";
  }
}

// reduce_bucket_size 0 is DeepSpeed's "every parameter reduced on its own"
// (transformers' ZeRO-3 test config has it): a bucket per parameter, and
// the same training as with buckets of many.
TEST(Config, ReduceBucketSizeZeroIsABucketPerParameter) {
  comm::Communicator& comm = world_comm();
  auto train = [&](std::int64_t bucket, std::string* start_line) {
    config::Config cfg = make_config(2, false, false, comm.world_size(), 2, 1);
    cfg.zero_optimization.reduce_bucket_size = bucket;
    auto model = make_model(ModelKind::kMlp);
    testing::internal::CaptureStderr();
    Engine engine(model, cfg, comm);
    *start_line = testing::internal::GetCapturedStderr();
    for (int step = 0; step < 3; ++step) {
      GlobalBatch gb = global_batch(ModelKind::kMlp, step);
      engine.backward(micro_loss(ModelKind::kMlp, *model, gb.x.narrow(0, comm.rank() * 2, 2),
                                 gb.y.narrow(0, comm.rank() * 2, 2), engine.dtype()));
      engine.step();
    }
    return engine.gather_master_params();
  };
  std::string zero_line, default_line;
  const std::vector<at::Tensor> per_param = train(0, &zero_line);
  const std::vector<at::Tensor> bucketed = train(500000000, &default_line);
  if (comm.rank() == 0) {
    const std::size_t n = make_model(ModelKind::kMlp)->parameters().size();
    EXPECT_NE(zero_line.find(" parameters in " + std::to_string(n) + " buckets"), std::string::npos) << zero_line;
    EXPECT_NE(default_line.find(" parameters in 1 bucket "), std::string::npos) << default_line;
  }
  ASSERT_EQ(per_param.size(), bucketed.size());
  for (std::size_t i = 0; i < bucketed.size(); ++i) {
    EXPECT_TRUE(at::allclose(per_param[i], bucketed[i], 1e-6, 1e-7)) << "parameter " << i;
  }
}

// The engine's end gives the module fp32 tensors of its own: the optimizer
// state and the gradients are freed first, so the process's peak resident
// set does not grow at the end (it grew by the model's fp32 size, 4 bytes a
// parameter, on top of all the engine held: a run's peak came at its exit).
// Measured with the kernel's peak (VmHWM), reset just before the engine goes.
TEST(Lifetime, TheEngineEndNeedsNoMoreMemoryThanTraining) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer keeps freed memory in quarantine: the resident set is not the program's";
#endif
  comm::Communicator& comm = world_comm();
  auto model = std::make_shared<torch::nn::Module>();
  torch::nn::Linear a(2048, 2048), b(2048, 2048);
  model->register_module("a", a);
  model->register_module("b", b);
  const std::int64_t psi = 2 * (2048 * 2048 + 2048);
  config::Config cfg = make_config(comm.world_size() > 1 ? 2 : 0, false, false, comm.world_size(), 2, 1);
  std::int64_t before_kib = 0;
  {
    Engine engine(model, cfg, comm);
    const at::Tensor x = at::randn({2, 2048});
    engine.backward(b->forward(a->forward(x)).square().mean());
    engine.step();
    reset_resident_peak();
    before_kib = status_kib("VmRSS:");
    ASSERT_LE(status_kib("VmHWM:") - before_kib, 1024) << "/proc/self/clear_refs did not reset the peak";
  }
  const std::int64_t grew = (status_kib("VmHWM:") - before_kib) * 1024;
  EXPECT_LT(grew, psi) << "the engine's end raised the peak resident set by " << grew << " bytes (" << psi
                       << " parameters)";
  for (const at::Tensor& p : model->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);
}

// A host too small for the engine's buffers: refused before anything is
// allocated, on every rank, with the numbers and the fixes (never the
// kernel's OOM killer). ZERO_HOST_MEMORY_LIMIT stands for a small host.
TEST(Budget, HostTooSmallIsRefusedBeforeAllocating) {
  comm::Communicator& comm = world_comm();
  const config::Config cfg = make_config(2, true, false, comm.world_size(), 2, 1);
  ::setenv("ZERO_HOST_MEMORY_LIMIT", "4K", 1);
  float refused = 0.0f;
  std::int64_t per_rank = 0, local = 0;
  try {
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
  } catch (const ::zero::Error& e) {
    const std::string msg = e.what();
    refused = 1.0f;
    // Every rank is short: the first (rank 0) says by how much, the others
    // name it (one line for the job).
    if (comm.rank() > 0) {
      // (EXPECT, not ASSERT: a rank that left the test early would leave the
      // others waiting in the broadcasts below.)
      const auto* marked = dynamic_cast<const comm::RaisedForAnotherRank*>(&e);
      EXPECT_NE(marked, nullptr) << msg;
      if (marked != nullptr) {
        EXPECT_EQ(marked->failed_rank(), 0);
      }
      EXPECT_NE(msg.find("host memory: rank 0 found its node's host memory too small"), std::string::npos) << msg;
    }
  }
  // Rank 0's message, on every rank (the numbers below come from it).
  std::string msg;
  {
    std::int64_t n = 0;
    std::vector<char> text;
    if (comm.rank() == 0) {
      try {
        auto model = make_model(ModelKind::kMlp);
        Engine engine(model, cfg, comm);
      } catch (const ::zero::Error& e) {
        msg = e.what();
      }
    } else {
      try {
        auto model = make_model(ModelKind::kMlp);
        Engine engine(model, cfg, comm);
      } catch (const ::zero::Error&) {
      }
    }
    n = static_cast<std::int64_t>(msg.size());
    comm.broadcast(&n, 2, DType::kFloat32, {0})->wait();  // (8 bytes, copied as they are)
    text.assign(static_cast<std::size_t>(n) + 3, '\0');
    std::copy(msg.begin(), msg.end(), text.begin());
    comm.broadcast(text.data(), static_cast<std::size_t>((n + 3) / 4), DType::kFloat32, {0})->wait();
    msg.assign(text.data(), static_cast<std::size_t>(n));
  }
  {
    EXPECT_NE(msg.find("4.0 KiB is available (ZERO_HOST_MEMORY_LIMIT)"), std::string::npos) << msg;
    // The fixes that apply to this job (stage 2, CPU offload, no DPU, on
    // the CPU), and no others.
    EXPECT_NE(msg.find("To fit: "), std::string::npos) << msg;
    EXPECT_EQ(msg.find("run fewer ranks per node") != std::string::npos, comm.world_size() > 1) << msg;
    EXPECT_EQ(msg.find("partition more (zero_optimization.stage 3 or 3)") != std::string::npos, false) << msg;
    EXPECT_EQ(msg.find("partition more (zero_optimization.stage 3") != std::string::npos, comm.world_size() > 1)
        << msg;
    EXPECT_NE(msg.find("offload_optimizer.device \"nvme\""), std::string::npos) << msg;
    EXPECT_EQ(msg.find("delayed update"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("bf16"), std::string::npos) << msg;
    std::smatch m;
    const std::regex re("the engine's buffers need [^=]+= ([0-9]+) bytes per rank \\(([0-9]+) rank\\(s\\) on this node");
    if (std::regex_search(msg, m, re)) {
      per_rank = std::stoll(m[1]);
      local = std::stoll(m[2]);
    }
  }
  comm.all_reduce(&refused, 1, DType::kFloat32)->wait();
  EXPECT_EQ(refused, static_cast<float>(comm.world_size()));
  ASSERT_GT(per_rank, 0);
  // All the ranks on this node launched here (one node).
  EXPECT_EQ(local, comm.world_size());
  // Enough for one rank but not for the node's ranks together: refused
  // (several ranks on a node share its memory).
  if (local > 1) {
    ::setenv("ZERO_HOST_MEMORY_LIMIT", std::to_string(per_rank * local - 1).c_str(), 1);
    bool node_refused = false;
    try {
      auto model = make_model(ModelKind::kMlp);
      Engine engine(model, cfg, comm);
    } catch (const ::zero::Error& e) {
      node_refused = std::string(e.what()).find("host memory") != std::string::npos;
    }
    EXPECT_TRUE(node_refused) << "the node's " << local << " ranks together need more than the limit";
  }
  // Exactly enough: trains.
  ::setenv("ZERO_HOST_MEMORY_LIMIT", std::to_string(per_rank * local).c_str(), 1);
  {
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
  }

  // A malformed limit names the variable and the form it takes.
  ::setenv("ZERO_HOST_MEMORY_LIMIT", "64GB", 1);
  try {
    auto model = make_model(ModelKind::kMlp);
    Engine engine(model, cfg, comm);
    ADD_FAILURE() << "a malformed ZERO_HOST_MEMORY_LIMIT was accepted";
  } catch (const ::zero::Error& e) {
    EXPECT_NE(std::string(e.what()).find("ZERO_HOST_MEMORY_LIMIT='64GB' is not a byte count"), std::string::npos)
        << e.what();
  }
  ::unsetenv("ZERO_HOST_MEMORY_LIMIT");

  // Ranks short (rank 1 and up, here): the first of them says by how much;
  // the others, short or not, name it, marked as raised for it, and print
  // nothing (short nodes with other free memory would print lines that
  // differ).
  if (comm.world_size() > 1) {
    if (comm.rank() >= 1) ::setenv("ZERO_HOST_MEMORY_LIMIT", "4K", 1);
    try {
      auto model = make_model(ModelKind::kMlp);
      Engine engine(model, cfg, comm);
      ADD_FAILURE() << "rank 1 short of host memory did not fail the job";
    } catch (const ::zero::Error& e) {
      const auto* marked = dynamic_cast<const comm::RaisedForAnotherRank*>(&e);
      if (comm.rank() == 1) {
        EXPECT_EQ(marked, nullptr) << e.what();
        EXPECT_NE(std::string(e.what()).find("4.0 KiB is available"), std::string::npos) << e.what();
      } else {
        EXPECT_NE(marked, nullptr) << "rank " << comm.rank() << ": " << e.what();
        if (marked != nullptr) {
          EXPECT_EQ(marked->failed_rank(), 1);
        }
        EXPECT_NE(std::string(e.what()).find("host memory: rank 1 found its node's host memory too small"),
                  std::string::npos) << e.what();
      }
    }
    ::unsetenv("ZERO_HOST_MEMORY_LIMIT");
  }
}

}  // namespace
}  // namespace zero::test
