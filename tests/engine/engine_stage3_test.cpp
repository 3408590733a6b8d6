// ZeRO stage 3 beyond parity (engine_parity_test.cpp and
// engine_reference_test.cpp hold it to stage 0 and to torch::optim::AdamW):
// what each rank holds on the device while units are gathered and released,
// the bytes sent per step, prefetch, parameter offload, a model too large
// for the device budget at stage 2, a model with no marked unit, and the
// module given back when the engine goes. The model is zero::models::Gpt,
// whose blocks are its units.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>
#include <optional>
#include <cstdio>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/ops/gelu.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include "../support/cpu_allocation_peak.h"
#include "train_loop.h"
#include "zero/core/error.h"
#include "zero/models/gpt.h"
#include "zero/zero/memory_plan.h"

namespace zero::test {
namespace {

using memory::Kind;
using memory::Tier;

constexpr std::int64_t kSeq = 16;

models::GptConfig tiny_gpt() {
  models::GptConfig g;
  g.vocab_size = 64;
  g.block_size = kSeq;
  g.n_layer = 4;
  g.n_head = 2;
  g.n_embd = 32;
  return g;
}

std::shared_ptr<models::Gpt> make_gpt(const models::GptConfig& g = tiny_gpt()) {
  torch::manual_seed(77);
  return std::make_shared<models::Gpt>(g);
}

config::Config stage3_config(int world, bool bf16 = true) {
  config::Config c = make_config(3, false, bf16, world, 2, 1);
  c.zero_optimization.reduce_bucket_size = 4096;
  return c;
}

struct GptRun {
  std::vector<float> losses;
  std::vector<at::Tensor> params;
  std::vector<StepStats> stats;
  memory::LedgerSnapshot ledger;
  comm::CommStats last_comm;
};

// `steps` steps on fresh token batches, the same on every rank for a step,
// each rank its own rows.
GptRun train_gpt(models::Gpt& model, Engine& engine, comm::Communicator& comm, int steps) {
  GptRun r;
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(900 + step);
    const at::Tensor all = at::randint(tiny_gpt().vocab_size, {2 * comm.world_size(), kSeq + 1});
    const at::Tensor mine = all.narrow(0, 2 * comm.rank(), 2);
    at::Tensor loss = model.loss(mine.narrow(1, 0, kSeq), mine.narrow(1, 1, kSeq));
    engine.backward(loss);
    engine.step();
    r.losses.push_back(loss.item<float>());
    r.stats.push_back(engine.stats());
  }
  engine.flush();
  r.ledger = engine.ledger().snapshot();
  r.last_comm = engine.last_step_comm();
  r.params = engine.gather_master_params();
  return r;
}

// Two runs that must be the same run: every step's loss and every final
// weight bit for bit (`what` names the case).
void expect_same_run(const GptRun& a, const GptRun& b, const std::string& what = "") {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (std::size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i << what;
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_TRUE(at::equal(a.params[i], b.params[i])) << "parameter " << i << what;
  }
}

// The model's parameters by unit, from the module (not from the engine):
// each block's, and those of no unit (embeddings, final LayerNorm).
struct UnitSizes {
  std::vector<std::int64_t> units;  // elements per block
  std::int64_t kept = 0, psi = 0;
  std::int64_t n_params = 0;        // trainable tensors (each is padded at most once per bucket)
};
UnitSizes unit_sizes(models::Gpt& model) {
  UnitSizes u;
  for (const auto& item : model.named_children()) {
    std::int64_t n = 0;
    for (const at::Tensor& p : item.value()->parameters()) n += p.numel();
    if (item.key().rfind('h', 0) == 0 && zero::is_unit(*item.value())) {
      u.units.push_back(n);
    } else {
      u.kept += n;
    }
    u.n_params += static_cast<std::int64_t>(item.value()->parameters().size());
  }
  for (const at::Tensor& p : model.parameters()) u.psi += p.numel();
  return u;
}

// ---- memory: the partition plus the gathered units -----------------------

struct MemoryCase {
  bool prefetch;
  bool offload_param;
};
class Stage3Memory : public testing::TestWithParam<MemoryCase> {};

TEST_P(Stage3Memory, DeviceHoldsPartitionKeptAndLiveUnitsOnly) {
  const auto [prefetch, offload_param] = GetParam();
  comm::Communicator& comm = world_comm();
  const std::int64_t N = comm.world_size();
  auto model = make_gpt();
  const UnitSizes u = unit_sizes(*model);
  ASSERT_EQ(u.units.size(), 4u);
  std::vector<std::int64_t> units = u.units;
  std::sort(units.rbegin(), units.rend());
  config::Config cfg = stage3_config(static_cast<int>(N));
  // Prefetch one block ahead (its padded size; the default fetches up to
  // 50M elements ahead: here, the whole model).
  cfg.zero_optimization.stage3_prefetch_bucket_size = prefetch ? units[0] + 2 * N * kPlanAlignElements * 8 : 0;
  if (offload_param) cfg.zero_optimization.offload_param.device = "cpu";
  Engine engine(model, cfg, comm);
  const GptRun r = train_gpt(*model, engine, comm, 3);

  // The bound, from the module's sizes: each bucket is padded to N * 32
  // elements, so each of a group's parameters adds at most that much.
  const std::int64_t es = 2, pad = N * kPlanAlignElements;
  const std::int64_t slack = u.n_params * pad;  // padding of every bucket, at most
  const std::int64_t partition = (u.psi + slack) / N;
  const std::int64_t live = units[0] + (prefetch ? units[1] : 0);
  const std::int64_t bound = es * ((offload_param ? 0 : partition) + u.kept + live + slack);
  const std::int64_t peak = r.ledger.peak[int(Tier::kDevice)][int(Kind::kHalfParams)];
  EXPECT_LE(peak, bound) << "device parameter bytes at their peak";
  // Units really were gathered beside what stays (the peak saw one block),
  // and at 4 ranks the device never held the whole model.
  const std::int64_t floor = es * ((offload_param ? 0 : u.psi / N) + u.kept + units.back());
  EXPECT_GE(peak, floor - es * slack);
  if (N == 4 && !prefetch) {
    EXPECT_LT(peak, es * u.psi);
  }
  // After the step no unit is gathered: what stays is the partition (on the
  // host with offload_param) and the parameters of no unit.
  const std::int64_t now = r.ledger.bytes(Tier::kDevice, Kind::kHalfParams);
  EXPECT_LE(now, es * ((offload_param ? 0 : partition) + u.kept));
  if (offload_param) {
    EXPECT_GE(r.ledger.bytes(Tier::kHost, Kind::kHalfParams), es * (u.psi / N - slack));
    EXPECT_LE(now, es * u.kept);
  } else {
    EXPECT_EQ(r.ledger.bytes(Tier::kHost, Kind::kHalfParams), 0);
  }
  std::printf("[ measured ] N=%lld prefetch=%d offload_param=%d: device parameter peak %lld B, bound %lld B, "
              "full model %lld B\n",
              static_cast<long long>(N), prefetch, offload_param, static_cast<long long>(peak),
              static_cast<long long>(bound), static_cast<long long>(es * u.psi));
  if (prefetch) {
    for (std::size_t s = 1; s < r.stats.size(); ++s) EXPECT_GT(r.stats[s].units_prefetched, 0);
  }
  // Not only the ledger: between steps the blocks' parameters really hold
  // no memory (their storage is freed), the others do.
  for (const auto& item : model->named_children()) {
    const bool unit = zero::is_unit(*item.value());
    for (const at::Tensor& p : item.value()->parameters()) {
      if (unit) {
        EXPECT_EQ(p.storage().nbytes(), 0u) << item.key() << " is released";
      } else {
        EXPECT_GE(p.storage().nbytes(), static_cast<std::size_t>(p.numel() * es)) << item.key() << " stays";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Stage3Memory,
                         testing::Values(MemoryCase{false, false}, MemoryCase{true, false},
                                         MemoryCase{false, true}, MemoryCase{true, true}),
                         [](const testing::TestParamInfo<MemoryCase>& i) {
                           return std::string(i.param.prefetch ? "prefetch" : "no_prefetch") +
                                  (i.param.offload_param ? "_offload_param" : "");
                         });

// ---- communication per step ------------------------------------------------

// Stage 3 sends per step: the units' all-gather in forward and again in
// backward, the reduce-scatter of the gradients (as stage 2), and the
// all-gather of the kept parameters after the step: (2 Psi_units + Psi_kept
// + Psi) (N-1)/N elements, about 1.5 times stage 2's 2 Psi (N-1)/N. With
// prefetch, a unit the recording needs again within its reach stays gathered
// (the last block of forward is the first of backward): one block less.
// Construction, bucket by bucket: what the allocator really held at its
// peak (each bucket in fp32 beside its copy in the training precision, the
// partition, the kept parameters) is what the ledger counted, so that
// device_memory_limit and zero-estimate see the real construction peak.
// The CUDA allocator's peak showed the bf16 copy on an H200
// (engine_cuda_test's EngineCudaBuild); this is the same check on the CPU,
// where device and host are both the CPU's memory. One large block, so that
// on 4 ranks the construction (six bytes per element of the block) is the
// peak rather than the optimizer state allocated after it.
TEST(Stage3, TheLedgerSeesTheConstructionPeakTheAllocatorSaw) {
  comm::Communicator& comm = world_comm();
  for (bool bf16 : {true, false}) {
    models::GptConfig g = tiny_gpt();
    g.n_layer = 1;
    g.n_embd = 128;
    auto model = make_gpt(g);
    config::Config cfg = stage3_config(comm.world_size(), bf16);
    cfg.zero_optimization.reduce_bucket_size = 1 << 20;
    auto peak = std::make_shared<CpuAllocationPeak>();
    std::optional<Engine> engine;
    {
      c10::DebugInfoGuard on(c10::DebugInfoKind::PROFILER_STATE, peak);
      engine.emplace(model, cfg, comm);
    }
    const auto s = engine->ledger().snapshot();
    const std::int64_t counted = s.tier_peak[int(Tier::kDevice)] + s.tier_peak[int(Tier::kHost)];
    const std::int64_t after = s.tier_current[int(Tier::kDevice)] + s.tier_current[int(Tier::kHost)];
    std::printf("[ measured ] %s, %d ranks: CPU allocation peak while built %lld B, the ledger's %lld B (%lld B "
                "held once built)\n",
                bf16 ? "bf16" : "fp32", comm.world_size(), static_cast<long long>(peak->bytes()),
                static_cast<long long>(counted), static_cast<long long>(after));
    // 4 KiB for what is not the engine's buffers (shapes, small tensors).
    EXPECT_LE(peak->bytes(), counted + 4096) << (bf16 ? "bf16" : "fp32");
    EXPECT_GT(peak->bytes(), counted / 2) << "the probe saw the engine's buffers";
    if (comm.world_size() == 4 && bf16) {
      EXPECT_GT(peak->bytes(), after + 65536) << "on 4 ranks the construction is the peak, which this compares";
    }
  }
}

TEST(Stage3, BytesSentPerStepMatchTheFormula) {
  comm::Communicator& comm = world_comm();
  const std::int64_t N = comm.world_size();
  if (N == 1) GTEST_SKIP() << "one rank sends nothing";
  const UnitSizes u = unit_sizes(*make_gpt());
  const std::int64_t block = *std::max_element(u.units.begin(), u.units.end());
  auto sent = [&](int stage, std::int64_t prefetch) {
    auto model = make_gpt();
    config::Config cfg = stage3_config(static_cast<int>(N));
    cfg.zero_optimization.stage = stage;
    cfg.zero_optimization.stage3_prefetch_bucket_size = prefetch;
    Engine engine(model, cfg, comm);
    return train_gpt(*model, engine, comm, 3).last_comm;
  };
  const comm::CommStats s2 = sent(2, 0), s3 = sent(3, 0), s3_ahead = sent(3, block + 1024);
  const double es = 2.0, share = double(N - 1) / double(N);
  std::int64_t psi_units = 0;
  for (std::int64_t n : u.units) psi_units += n;
  const double slack = es * double(u.n_params * N * kPlanAlignElements) * 3;  // padding, generously
  const double norm = 2.0 * double(N - 1) * 4;                                  // the fp32 norm all-reduce
  auto kind = [](const comm::CommStats& c, comm::CollectiveKind k) { return double(c.bytes_sent[int(k)]); };
  EXPECT_NEAR(kind(s3, comm::CollectiveKind::kReduceScatter), es * share * u.psi, slack);
  EXPECT_NEAR(kind(s3, comm::CollectiveKind::kAllGather), es * share * (2.0 * psi_units + u.kept), slack);
  EXPECT_NEAR(double(s3.total_bytes()), es * share * (2.0 * psi_units + u.kept + u.psi) + norm, slack);
  EXPECT_NEAR(double(s3_ahead.total_bytes()), double(s3.total_bytes()) - es * share * block, slack);
  const double ratio = double(s3.total_bytes()) / double(s2.total_bytes());
  std::printf("[ measured ] N=%lld: stage 3 sends %llu B per step (%llu with prefetch), stage 2 %llu B: %.3fx\n",
              static_cast<long long>(N), static_cast<unsigned long long>(s3.total_bytes()),
              static_cast<unsigned long long>(s3_ahead.total_bytes()),
              static_cast<unsigned long long>(s2.total_bytes()), ratio);
  EXPECT_GT(ratio, 1.3);
  EXPECT_LT(ratio, 1.55);
}

// ---- prefetch ---------------------------------------------------------------

// Prefetch starts the next block's all-gather early and changes no number:
// the same losses and weights, bit for bit, as without it.
TEST(Stage3, PrefetchChangesNothingButWhen) {
  comm::Communicator& comm = world_comm();
  auto run = [&](bool prefetch, bool checkpoint) {
    models::GptConfig g = tiny_gpt();
    g.checkpoint_activations = checkpoint;
    auto model = make_gpt(g);
    config::Config cfg = stage3_config(comm.world_size(), /*bf16=*/false);
    if (!prefetch) cfg.zero_optimization.stage3_prefetch_bucket_size = 0;
    Engine engine(model, cfg, comm);
    return train_gpt(*model, engine, comm, 4);
  };
  for (bool checkpoint : {false, true}) {
    const GptRun on = run(true, checkpoint), off = run(false, checkpoint);
    expect_same_run(on, off, ", checkpoint " + std::to_string(checkpoint));
    // The first step records the order; the next ones fetch blocks 1-3 ahead
    // in forward (the default prefetch reaches the whole model, which then
    // stays gathered until the end of backward), none in vain.
    EXPECT_EQ(on.stats[0].units_prefetched, 0);
    for (std::size_t s = 1; s < on.stats.size(); ++s) {
      EXPECT_EQ(on.stats[s].units_prefetched, 3) << "step " << s << ", checkpoint " << checkpoint;
      EXPECT_EQ(on.stats[s].units_prefetched_unused, 0) << "step " << s << ", checkpoint " << checkpoint;
    }
    for (const StepStats& st : off.stats) EXPECT_EQ(st.units_prefetched, 0);
  }
}

// A reach smaller than a unit (a 4.5B GPT's 113M-element block against
// DeepSpeed's default 50M) still fetches ahead: the next block's first
// buckets, up to the reach. The same training, bit for bit, as without
// prefetch, and the device never holds more than the unit in use plus the
// reach (the bound from the module's sizes).
// With reduce_bucket_size 4096 a block is several buckets; with the default
// (500M) its parameters, all in the unit (persistence threshold 0), would be
// one bucket larger than the reach: stage 3 then closes its buckets at the
// reach, so that there is something to fetch ahead.
class Stage3Reach : public testing::TestWithParam<std::int64_t> {};

TEST_P(Stage3Reach, PrefetchReachesIntoAUnitLargerThanItsReach) {
  comm::Communicator& comm = world_comm();
  const std::int64_t N = comm.world_size();
  const UnitSizes u = unit_sizes(*make_gpt());
  const std::int64_t block = *std::max_element(u.units.begin(), u.units.end());
  const std::int64_t reach = block / 2;  // above one 4096-element bucket, below a block
  // The buckets the reach leads to (padded, each within it), given to the
  // run without prefetch too: the same layout, the same sums.
  const std::int64_t pad = N * kPlanAlignElements;
  const std::int64_t buckets = std::min(GetParam(), reach / pad * pad);
  auto run = [&](std::int64_t r) {
    auto model = make_gpt();
    config::Config cfg = stage3_config(static_cast<int>(N));
    cfg.zero_optimization.reduce_bucket_size = r > 0 ? GetParam() : buckets;
    cfg.zero_optimization.stage3_prefetch_bucket_size = r;
    Engine engine(model, cfg, comm);
    return train_gpt(*model, engine, comm, 4);
  };
  testing::internal::CaptureStderr();
  const GptRun part = run(reach);
  const std::string said = testing::internal::GetCapturedStderr();
  const GptRun off = run(0);
  expect_same_run(part, off, ", reach " + std::to_string(reach));
  // The engine says so at construction, and what fetches a whole unit.
  if (comm.rank() == 0) {
    EXPECT_NE(said.find("prefetch fetches at most " + std::to_string(reach) + " elements of the next units ahead"),
              std::string::npos) << said;
    EXPECT_NE(said.find("stage3_prefetch_bucket_size >= "), std::string::npos) << said;
  }
  EXPECT_EQ(part.stats[0].units_prefetched, 0);  // the first step records the order
  for (std::size_t s = 1; s < part.stats.size(); ++s) {
    EXPECT_GT(part.stats[s].units_prefetched, 0) << "step " << s << ": nothing fetched ahead";
    EXPECT_EQ(part.stats[s].units_prefetched_unused, 0) << "step " << s;
  }
  const std::int64_t es = 2, slack = u.n_params * N * kPlanAlignElements;
  const std::int64_t partition = (u.psi + slack) / N;
  const std::int64_t bound = es * (partition + u.kept + block + reach + slack);
  const std::int64_t peak = part.ledger.peak[int(Tier::kDevice)][int(Kind::kHalfParams)];
  EXPECT_LE(peak, bound) << "device parameter bytes at their peak";
  std::printf("[ measured ] N=%lld reach %lld of a %lld-element block: device parameter peak %lld B, bound %lld B\n",
              static_cast<long long>(N), static_cast<long long>(reach), static_cast<long long>(block),
              static_cast<long long>(peak), static_cast<long long>(bound));
}

INSTANTIATE_TEST_SUITE_P(Buckets, Stage3Reach, testing::Values(std::int64_t{4096}, std::int64_t{500'000'000}),
                         [](const testing::TestParamInfo<std::int64_t>& i) {
                           return "reduce_bucket_size_" + std::to_string(i.param);
                         });

// A forward with gradients between backward() and step() (a loss looked at
// before stepping, its graph dropped) fetches units ahead for a backward
// that does not come; the step's all-gather of the updated partition then
// meets their all-gathers still in flight, and waits for them before it
// writes their send buffers (a second collective on a buffer in use is
// undefined in MPI: ParamStore refuses to start one). The training is the
// same, bit for bit, as without the extra forward.
TEST(Stage3, AForwardBetweenBackwardAndStepLeavesTheStepsGatherCorrect) {
  comm::Communicator& comm = world_comm();
  auto run = [&](bool extra_forward, std::int64_t reach) {
    auto model = make_gpt();
    config::Config cfg = stage3_config(comm.world_size(), /*bf16=*/false);
    cfg.zero_optimization.stage3_prefetch_bucket_size = reach;
    Engine engine(model, cfg, comm);
    GptRun r;
    for (int step = 0; step < 4; ++step) {
      torch::manual_seed(900 + step);
      const at::Tensor all = at::randint(tiny_gpt().vocab_size, {2 * comm.world_size(), kSeq + 1});
      const at::Tensor mine = all.narrow(0, 2 * comm.rank(), 2);
      at::Tensor loss = model->loss(mine.narrow(1, 0, kSeq), mine.narrow(1, 1, kSeq));
      engine.backward(loss);
      if (extra_forward) {
        const at::Tensor look = model->loss(mine.narrow(1, 0, kSeq), mine.narrow(1, 1, kSeq));
        EXPECT_TRUE(look.isfinite().item<bool>());
      }
      engine.step();
      r.losses.push_back(loss.item<float>());
    }
    engine.flush();
    r.params = engine.gather_master_params();
    return r;
  };
  const UnitSizes u = unit_sizes(*make_gpt());
  const std::int64_t block = *std::max_element(u.units.begin(), u.units.end());
  for (std::int64_t reach : {block + 1024, std::int64_t{50'000'000}}) {
    const GptRun plain = run(false, reach), looked = run(true, reach);
    expect_same_run(plain, looked, ", reach " + std::to_string(reach));
  }
}

// Forwards with gradients and no backward (a validation or generation loop
// without NoGradGuard) are part of the step's recording, up to 16 gathers
// per unit + 4096: past that the recording is dropped, and the step after
// records afresh. Without the limit the recording grew by every such
// forward (memory without bound) and each gather following it scanned the
// rest of it (time quadratic in the loop's length). Either way the training
// is the same, bit for bit.
TEST(Stage3, ForwardsWithGradientsAndNoBackwardAreRecordedUpToALimit) {
  comm::Communicator& comm = world_comm();
  constexpr int kUnits = 4;                        // tiny_gpt()'s blocks
  constexpr int kForwards = (16 * kUnits + 4096) / kUnits + 10;  // past the limit
  auto run = [&](bool loop) {
    auto model = make_gpt();
    Engine engine(model, stage3_config(comm.world_size(), /*bf16=*/false), comm);
    GptRun r;
    for (int step = 0; step < 5; ++step) {
      torch::manual_seed(900 + step);
      const at::Tensor all = at::randint(tiny_gpt().vocab_size, {2 * comm.world_size(), kSeq + 1});
      const at::Tensor mine = all.narrow(0, 2 * comm.rank(), 2);
      if (loop && step == 2) {
        for (int i = 0; i < kForwards; ++i) (void)model->loss(mine.narrow(1, 0, kSeq), mine.narrow(1, 1, kSeq));
      }
      at::Tensor loss = model->loss(mine.narrow(1, 0, kSeq), mine.narrow(1, 1, kSeq));
      engine.backward(loss);
      engine.step();
      r.losses.push_back(loss.item<float>());
      r.stats.push_back(engine.stats());
    }
    engine.flush();
    r.params = engine.gather_master_params();
    return r;
  };
  const GptRun plain = run(false), looped = run(true);
  expect_same_run(plain, looped, ", a loop of forwards with gradients before step 3");
  for (std::size_t s = 1; s < plain.stats.size(); ++s) EXPECT_EQ(plain.stats[s].units_prefetched, 3) << "step " << s;
  // Step 3 took the loop's gathers past the limit: step 4 had no recording
  // to follow (it records), step 5 follows step 4's.
  EXPECT_EQ(looped.stats[3].units_prefetched, 0);
  EXPECT_EQ(looped.stats[4].units_prefetched, 3);
  EXPECT_EQ(looped.stats[4].units_prefetched_unused, 0);
}

// Three units a, b, c; the forward may skip b (an order that changes).
struct SkipNet : torch::nn::Module {
  SkipNet() {
    a = register_module("a", torch::nn::Linear(16, 16));
    b = register_module("b", torch::nn::Linear(16, 16));
    c = register_module("c", torch::nn::Linear(16, 4));
    for (auto* l : {&a, &b, &c}) zero::mark_unit(**l);
  }
  at::Tensor forward(const at::Tensor& x, bool skip_b) {
    at::Tensor h = at::gelu(as_unit(a, x));
    if (!skip_b) h = at::gelu(as_unit(b, h));
    return as_unit(c, h);
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};

// A step in another order departs from the recording (prefetch stops there,
// and what it fetched in vain is counted) and becomes the new recording; a
// validation forward (no gradients) in between changes nothing.
TEST(Stage3, PrefetchFollowsAChangedOrder) {
  comm::Communicator& comm = world_comm();
  torch::manual_seed(3);
  auto model = std::make_shared<SkipNet>();
  config::Config cfg = make_config(3, false, false, comm.world_size(), 4, 1);
  Engine engine(model, cfg, comm);
  auto step = [&](int s, bool skip_b) {
    torch::manual_seed(50 + s);
    const at::Tensor x = at::randn({4, 16}), y = at::randn({4, 4});
    engine.backward(at::mse_loss(model->forward(x, skip_b), y));
    engine.step();
    return std::make_pair(engine.stats().units_prefetched, engine.stats().units_prefetched_unused);
  };
  EXPECT_EQ(step(0, false), std::make_pair(std::int64_t{0}, std::int64_t{0}));  // recording
  const auto full = step(1, false);
  EXPECT_GT(full.first, 0);
  EXPECT_EQ(full.second, 0);
  {
    torch::NoGradGuard no_grad;  // validation
    (void)model->forward(at::randn({4, 16}), false);
  }
  // It released every unit after use (nothing kept for a step to come)...
  for (const auto& l : {model->a, model->b, model->c}) {
    EXPECT_EQ(l->weight.storage().nbytes(), 0u) << "a unit stayed gathered after validation";
  }
  // ...and left the recording alone.
  EXPECT_EQ(step(2, false), full) << "a validation forward disturbed the recording";
  // b skipped: fetched ahead for nothing; then the new order is followed.
  const auto changed = step(3, true);
  EXPECT_GE(changed.second, 1);
  const auto followed = step(4, true);
  EXPECT_EQ(followed.second, 0) << "the changed order was not recorded";
  EXPECT_GT(followed.first, 0);
  EXPECT_EQ(step(5, true), followed);
}

// A step that departs from the recording lets go at once of what the
// recording had fetched ahead (b, skipped) or kept gathered for it (a, kept
// for backward): beside the units the step gathers instead, it would pass
// the plan's bound. The training is the same, bit for bit, as without
// prefetch.
TEST(Stage3, ADepartureFromTheRecordingLetsGoOfWhatWasFetchedAhead) {
  comm::Communicator& comm = world_comm();
  auto run = [&](bool prefetch, bool check) {
    torch::manual_seed(3);
    auto model = std::make_shared<SkipNet>();
    config::Config cfg = make_config(3, false, false, comm.world_size(), 4, 1);
    if (!prefetch) cfg.zero_optimization.stage3_prefetch_bucket_size = 0;
    Engine engine(model, cfg, comm);
    std::vector<float> losses;
    for (int s = 0; s < 4; ++s) {
      const bool skip_b = s == 2;
      torch::manual_seed(50 + s);
      const at::Tensor x = at::randn({4, 16}), y = at::randn({4, 4});
      const at::Tensor loss = at::mse_loss(model->forward(x, skip_b), y);
      if (check && skip_b) {
        for (const auto& [name, l] : {std::make_pair("a", model->a), std::make_pair("b", model->b),
                                      std::make_pair("c", model->c)}) {
          EXPECT_EQ(l->weight.storage().nbytes(), 0u) << name << " still gathered after the departing forward";
        }
      }
      engine.backward(loss);
      engine.step();
      losses.push_back(loss.item<float>());
    }
    engine.flush();
    return std::make_pair(losses, engine.gather_master_params());
  };
  const auto on = run(true, true), off = run(false, false);
  EXPECT_EQ(on.first, off.first);
  ASSERT_EQ(on.second.size(), off.second.size());
  for (std::size_t i = 0; i < on.second.size(); ++i) EXPECT_TRUE(at::equal(on.second[i], off.second[i])) << i;
}

// Three units of one size; a step may call the first again after the last
// (a unit called twice).
struct ThreeNet : torch::nn::Module {
  ThreeNet() {
    a = register_module("a", torch::nn::Linear(16, 16));
    b = register_module("b", torch::nn::Linear(16, 16));
    c = register_module("c", torch::nn::Linear(16, 16));
    for (auto* l : {&a, &b, &c}) zero::mark_unit(**l);
  }
  at::Tensor forward(const at::Tensor& x, bool a_again) {
    at::Tensor h = as_unit(c, at::gelu(as_unit(b, at::gelu(as_unit(a, x)))));
    return a_again ? as_unit(a, at::gelu(h)) : h;
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};

// With prefetch one unit ahead, after forward the recording keeps c
// gathered for backward and has fetched b ahead; a step that then calls a
// again departs from the recording there, and lets go of both before a is
// gathered: the device never holds more than the unit in use plus the
// reach (three units would be one past the plan's bound).
TEST(Stage3, ADepartingGatherStaysWithinTheBound) {
  comm::Communicator& comm = world_comm();
  const std::int64_t N = comm.world_size(), pad = N * kPlanAlignElements;
  const std::int64_t unit = (16 * 16 + 16 + pad - 1) / pad * pad;  // a bucket per unit, padded
  torch::manual_seed(5);
  auto model = std::make_shared<ThreeNet>();
  config::Config cfg = make_config(3, false, true, static_cast<int>(N), 4, 1);
  cfg.zero_optimization.stage3_prefetch_bucket_size = unit;
  Engine engine(model, cfg, comm);
  for (int s = 0; s < 4; ++s) {
    torch::manual_seed(60 + s);
    const at::Tensor x = at::randn({4, 16}).to(at::kBFloat16), y = at::randn({4, 16}).to(at::kBFloat16);
    engine.backward(at::mse_loss(model->forward(x, /*a_again=*/s == 2), y).to(at::kFloat));
    engine.step();
  }
  const std::int64_t es = 2;
  const std::int64_t bound = es * (3 * unit / N + 2 * unit);  // the partition, the unit in use and the reach
  const std::int64_t peak = engine.ledger().snapshot().peak[int(Tier::kDevice)][int(Kind::kHalfParams)];
  EXPECT_LE(peak, bound) << "device parameter bytes at their peak (a unit is " << es * unit << " B)";
  std::printf("[ measured ] N=%lld: device parameter peak %lld B, bound %lld B\n", static_cast<long long>(N),
              static_cast<long long>(peak), static_cast<long long>(bound));
}

// ---- a model larger than the device budget at stage 2 -----------------------

TEST(Stage3, TrainsAModelWhoseParametersExceedTheDeviceBudget) {
  comm::Communicator& comm = world_comm();
  auto probe = make_gpt();
  const UnitSizes u = unit_sizes(*probe);
  // Less than the full bf16 parameters: stage 2 cannot even hold them.
  const std::int64_t limit = 2 * u.psi * 3 / 4;
  auto build = [&](int stage) {
    auto model = make_gpt();
    config::Config cfg = stage3_config(comm.world_size());
    cfg.zero_optimization.stage = stage;
    cfg.zero_optimization.offload_optimizer.device = "cpu";
    if (stage == 3) cfg.zero_optimization.offload_param.device = "cpu";
    // One block gathered at a time (the default prefetch would fetch the
    // whole model ahead, and the engine would refuse the budget for that).
    cfg.zero_optimization.stage3_prefetch_bucket_size = 0;
    cfg.device_memory_limit = limit;
    return std::make_pair(model, cfg);
  };
  {
    auto [model, cfg] = build(2);
    try {
      Engine engine(model, cfg, comm);
      ADD_FAILURE() << "stage 2 built within a budget below its parameters";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("device memory budget exceeded"), std::string::npos) << e.what();
    }
  }
  auto [model, cfg] = build(3);
  Engine engine(model, cfg, comm);
  const GptRun r = train_gpt(*model, engine, comm, 3);
  EXPECT_LE(r.ledger.tier_peak[int(Tier::kDevice)], limit);
  EXPECT_EQ(r.stats.back().step, 3);
  for (float l : r.losses) EXPECT_TRUE(std::isfinite(l));
}

// ---- a model with no marked unit --------------------------------------------

TEST(Stage3, ModelWithNoUnitTrainsAsOneUnitAndSaysSo) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  config::Config cfg = make_config(3, false, false, world, kGlobalBatch / world, 1);
  testing::internal::CaptureStderr();
  const RunResult got = train(ModelKind::kTiedMlp, cfg, comm, 5);
  const std::string err = testing::internal::GetCapturedStderr();
  if (comm.rank() == 0) {
    EXPECT_NE(err.find("no module of the model is marked as a unit"), std::string::npos) << err;
    EXPECT_NE(err.find("docs/engine.md"), std::string::npos) << err;
  }
  config::Config ref_cfg = make_config(0, false, false, world, kGlobalBatch / world, 1);
  const RunResult ref = train(ModelKind::kTiedMlp, ref_cfg, comm, 5);
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << "step " << i;
  }
}

// GPT's tied weights the other way round from the docs' example: the
// embedding is no unit (it runs at the root) and the output head is a unit
// registering the same weight. The embedding uses it while the head is
// released, so it stays gathered (an outside probe: stage 3 partitioned it,
// and the first forward failed in LibTorch's embedding, "'weight' must be
// 2-D", naming nothing). And a unit fed data that needs no gradient may
// change it in place (an in-place ReLU first): LibTorch refused it on
// stage 3's stand-in for the input, a view of a leaf. `pair`: a unit
// around two units that share a weight (`b` applies `a`'s): the weight is
// the outer unit's, gathered while either inner one runs.
struct TiedHeadUnitNet : torch::nn::Module {
  TiedHeadUnitNet() {
    emb = register_module("emb", torch::nn::Embedding(8, 32));
    inp = register_module("inp", torch::nn::Linear(16, 32));
    block = register_module("block", torch::nn::Linear(32, 32));
    pair = register_module("pair", std::make_shared<torch::nn::Module>());
    a = pair->register_module("a", torch::nn::Linear(32, 32));
    b = pair->register_module("b", std::make_shared<torch::nn::Module>());
    b->register_parameter("weight", a->weight);
    head = register_module("head", std::make_shared<torch::nn::Module>());
    head->register_parameter("weight", emb->weight);
    for (torch::nn::Module* m : {static_cast<torch::nn::Module*>(inp.get()), static_cast<torch::nn::Module*>(block.get()),
                                 pair.get(), static_cast<torch::nn::Module*>(a.get()), b.get(), head.get()}) {
      zero::mark_unit(*m);
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor bits = (x.narrow(1, 0, 3) > 0).to(at::kLong);
    const at::Tensor tokens = bits.select(1, 0) + 2 * bits.select(1, 1) + 4 * bits.select(1, 2);
    at::Tensor h = zero::unit(*inp, x, [&](const at::Tensor& in) {
      at::Tensor t = in.mul_(0.5);  // in place, on the data
      return inp->forward(t.relu_());
    });
    h = at::gelu(h + emb->forward(tokens));
    h = at::gelu(zero::unit(*block, h, [&](const at::Tensor& in) { return block->forward(in); }));
    h = zero::unit(*pair, h, [&](const at::Tensor& in) {
      const at::Tensor h1 = at::gelu(zero::unit(*a, in, [&](const at::Tensor& t) { return a->forward(t); }));
      const at::Tensor aw = a->weight;
      return at::gelu(zero::unit(*b, h1, [&](const at::Tensor& t) { return at::linear(t, aw); }));
    });
    const at::Tensor w = emb->weight;
    const at::Tensor logits = zero::unit(*head, h, [&](const at::Tensor& in) { return at::linear(in, w); });
    return logits.narrow(1, 0, 4);
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear inp{nullptr}, block{nullptr}, a{nullptr};
  std::shared_ptr<torch::nn::Module> pair, b, head;
};

TEST(Stage3, ATiedWeightUsedOutsideItsUnitStaysGatheredAndAUnitMayChangeItsDataInPlace) {
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  const int micro = kGlobalBatch / world;
  auto run = [&](int stage, std::string* said) {
    torch::manual_seed(1234);
    auto model = std::make_shared<TiedHeadUnitNet>();
    config::Config cfg = make_config(stage, false, false, world, micro, 1);
    testing::internal::CaptureStderr();
    Engine engine(model, cfg, comm);
    const std::string err = testing::internal::GetCapturedStderr();
    if (said != nullptr) *said = err;
    std::vector<float> losses;
    for (int step = 0; step < 4; ++step) {
      const GlobalBatch gb = global_batch(ModelKind::kMlp, step);
      // (A copy: the model changes its data in place.)
      const at::Tensor x = gb.x.narrow(0, comm.rank() * micro, micro).clone();
      const at::Tensor loss = at::mse_loss(model->forward(x), gb.y.narrow(0, comm.rank() * micro, micro));
      losses.push_back(loss.item<float>());
      engine.backward(loss);
      engine.step();
    }
    return std::make_pair(losses, engine.gather_master_params());
  };
  std::string said;
  const auto [got_losses, got] = run(3, &said);
  const auto [ref_losses, ref] = run(0, nullptr);
  if (comm.rank() == 0) {
    // emb.weight (8 x 32) stays gathered; the Linear units' parameters, and
    // pair.a.weight with `pair`, are partitioned.
    EXPECT_NE(said.find("256 of 2912 parameters stay gathered"), std::string::npos) << said;
  }
  for (std::size_t i = 0; i < ref_losses.size(); ++i) {
    EXPECT_NEAR(got_losses[i], ref_losses[i], 1e-5 * std::abs(ref_losses[i])) << "step " << i;
  }
  ASSERT_EQ(got.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    EXPECT_LT((got[i] - ref[i]).abs().max().item<float>(), 1e-5f) << "parameter " << i;
  }
}

// ---- the module given back ----------------------------------------------------

// When the engine goes, the module's parameters are gathered back: plain
// fp32 tensors of their own with the trained values (in fp32 training the
// master weights), and the module runs without the engine.
TEST(Stage3, ModuleGetsItsTrainedParametersBack) {
  comm::Communicator& comm = world_comm();
  auto model = make_gpt();
  std::vector<at::Tensor> master;
  {
    config::Config cfg = stage3_config(comm.world_size(), /*bf16=*/false);
    Engine engine(model, cfg, comm);
    master = train_gpt(*model, engine, comm, 2).params;
  }
  std::vector<at::Tensor> params;
  std::unordered_set<const void*> seen;
  for (const at::Tensor& p : model->parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
  }
  ASSERT_EQ(params.size(), master.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(params[i].detach(), master[i])) << "parameter " << i;
  }
  torch::NoGradGuard no_grad;
  const at::Tensor idx = at::randint(tiny_gpt().vocab_size, {1, kSeq});
  EXPECT_TRUE(model->forward(idx).isfinite().all().item<bool>());
}

// ---- between steps: hollow parameters, gather_parameters() --------------------

// The module's trainable parameters, each once, by name.
std::vector<std::pair<std::string, at::Tensor>> trainable(models::Gpt& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : model.named_parameters()) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) out.emplace_back(item.key(), item.value());
  }
  return out;
}
bool in_a_block(const std::string& name) { return name.size() > 1 && name[0] == 'h' && std::isdigit(name[1]); }

// Outside its unit a unit's parameter is hollow (shape [0]): reading it
// gives an empty tensor instead of a read of freed memory, and a write
// fails on the shape. gather_parameters() gives the module every value (in
// fp32 training, the master weights) until its scope ends.
// A block registered under two names (SharedUnitMlp's b0 and b1) is one
// unit, partitioned like any other: hollow between steps, gathered while it
// runs. (named_modules() lists it twice; as two units that each held its
// parameters, neither inside the other, they stayed gathered on every rank.)
// A frozen unit fed data that needs no gradient leaves none: nothing of it
// trains, so nothing is back-propagated through it.
TEST(Stage3, ABlockRegisteredTwiceIsOneUnitAndAFrozenUnitLeavesNoGradientPath) {
  comm::Communicator& comm = world_comm();
  auto model = std::make_shared<SharedUnitMlp>();
  config::Config cfg = make_config(3, false, /*bf16=*/false, comm.world_size(), 2, 1);
  Engine engine(model, cfg, comm);
  EXPECT_EQ(model->block->weight.numel(), 0) << "the shared block stays gathered";
  EXPECT_EQ(model->head->weight.numel(), 0);
  EXPECT_EQ(model->stem->weight.numel(), 0) << "a frozen unit is partitioned too: hollow outside it";
  const at::Tensor x = at::randn({2, 16});
  const at::Tensor stem_out = as_unit(model->stem, x);
  EXPECT_FALSE(stem_out.requires_grad()) << "data through a frozen unit needs a gradient: its backward would run";
  // And it trains: a step through the shared block, hollow again after it.
  for (int step = 0; step < 2; ++step) {
    engine.backward(at::mse_loss(model->forward(at::randn({2, 16})), at::zeros({2, 4})));
    engine.step();
  }
  EXPECT_EQ(model->block->weight.numel(), 0);
  EXPECT_GT(engine.stats().grad_norm, 0.0f);
}

// A base model under adapters (LoraMlp: each block a unit of a frozen
// Linear and its trainable low-rank pair, a frozen input unit, a frozen
// gain of no unit). At stage 3 each rank holds 1/N of the units' frozen
// weights, counted in the ledger as `frozen` (all ranks' together: every
// element once); they are hollow outside their units, whole inside
// gather_parameters(), and whole again, in their own dtype, with the values
// they were built with (bf16: rounded), when the engine goes. Training
// matches stage 0, which keeps them whole (bf16 here; fp32 against LibTorch
// in engine_reference_test's Adapters).
TEST(Stage3, FrozenWeightsOfUnitsArePartitioned) {
  comm::Communicator& comm = world_comm();
  const int N = comm.world_size();
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const std::int64_t es = bf16 ? 2 : 4;
    const c10::ScalarType dtype = bf16 ? at::kBFloat16 : at::kFloat;
    auto model = std::dynamic_pointer_cast<LoraMlp>(make_model(ModelKind::kLoraMlp));
    // The frozen tensors of units, from the module (not the engine).
    std::vector<at::Tensor> unit_frozen = {model->inp->weight, model->inp->bias};
    for (auto& b : model->blocks) {
      unit_frozen.push_back(b->base->weight);
      unit_frozen.push_back(b->base->bias);
    }
    std::int64_t unit_frozen_elements = 0;
    std::vector<at::Tensor> built;
    for (const at::Tensor& t : unit_frozen) {
      unit_frozen_elements += t.numel();
      built.push_back(t.detach().to(dtype).to(at::kFloat));
    }
    const config::Config cfg = make_config(3, false, bf16, N, 2, 1);
    {
      Engine engine(model, cfg, comm);
      for (const at::Tensor& t : unit_frozen) EXPECT_EQ(t.numel(), 0) << "hollow outside its unit";
      EXPECT_EQ(model->gain.numel(), 32) << "a frozen parameter of no unit stays whole";
      // The ledger: the gain whole, the rest this rank's share.
      const memory::LedgerSnapshot snap = engine.ledger().snapshot();
      const std::int64_t share = snap.bytes(Tier::kDevice, Kind::kFrozen) - es * model->gain.numel();
      EXPECT_LE(share, es * (unit_frozen_elements / N + 4 * 32)) << "more than this rank's share (4 buckets' padding)";
      float all = static_cast<float>(share);  // (exact: far below 2^24)
      comm.all_reduce(&all, 1, DType::kFloat32)->wait();
      EXPECT_EQ(static_cast<std::int64_t>(all), es * unit_frozen_elements)
          << "the ranks' partitions hold every frozen element once";
      // Training, and the frozen values do not move.
      for (int step = 0; step < 3; ++step) step_once(ModelKind::kLoraMlp, *model, engine, comm, step);
      {
        const GatheredParameters scope = engine.gather_parameters();
        for (std::size_t i = 0; i < unit_frozen.size(); ++i) {
          ASSERT_EQ(unit_frozen[i].sizes(), built[i].sizes()) << "whole in gather_parameters()";
          EXPECT_TRUE(unit_frozen[i].to(at::kFloat).equal(built[i])) << "frozen tensor " << i << " moved";
        }
      }
      EXPECT_EQ(model->blocks[1]->base->weight.numel(), 0) << "released with the scope";
    }
    for (std::size_t i = 0; i < unit_frozen.size(); ++i) {
      EXPECT_EQ(unit_frozen[i].scalar_type(), at::kFloat) << "its own dtype back";
      EXPECT_TRUE(unit_frozen[i].equal(built[i])) << "frozen tensor " << i << " given back";
    }
    // Training against stage 0 (the frozen weights whole): the same run.
    const RunResult got = train(ModelKind::kLoraMlp, cfg, comm, 4);
    const RunResult ref = train(ModelKind::kLoraMlp, make_config(0, false, bf16, N, 2, 1), comm, 4);
    ASSERT_EQ(got.params.size(), ref.params.size());
    for (std::size_t i = 0; i < got.losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], ref.losses[i], (bf16 ? 1e-2 : 1e-5) * std::abs(ref.losses[i])) << "step " << i;
    }
    for (std::size_t i = 0; i < got.params.size(); ++i) {
      const double diff = (got.params[i] - ref.params[i]).abs().max().item<double>();
      EXPECT_LE(diff, bf16 ? kBf16ParamBound : 1e-5) << "trainable parameter " << i;
    }
  }
}

// A GPT whose blocks' first MLP layer is frozen, with activation
// checkpointing: the block's recomputation in backward gathers the frozen
// weights again with the trainable ones. Stage 3 (frozen partitioned, with
// and without offload_param) trains as stage 0 (frozen whole) does, and
// the frozen weights end as they began (engine_cuda_test runs the same on a
// GPU, against the CPU).
TEST(Stage3, ACheckpointedGptWithFrozenLayersTrainsAsStage0) {
  comm::Communicator& comm = world_comm();
  models::GptConfig g = tiny_gpt();
  g.checkpoint_activations = true;
  auto run = [&](int stage, bool offload_param, std::vector<at::Tensor>* frozen_after) {
    auto model = make_gpt(g);
    std::vector<at::Tensor> frozen;
    for (const auto& item : model->named_parameters()) {
      if (item.key().find(".fc.") == std::string::npos) continue;
      item.value().set_requires_grad(false);
      frozen.push_back(item.value());
    }
    config::Config cfg = stage3_config(comm.world_size());
    cfg.zero_optimization.stage = stage;
    if (offload_param) {
      cfg.zero_optimization.offload_optimizer.device = "cpu";
      cfg.zero_optimization.offload_param.device = "cpu";
    }
    GptRun r;
    {
      Engine engine(model, cfg, comm);
      if (stage == 3) {
        EXPECT_EQ(frozen.front().numel(), 0) << "partitioned";
      }
      r = train_gpt(*model, engine, comm, 3);
    }
    for (const at::Tensor& t : frozen) frozen_after->push_back(t.detach().clone());
    return r;
  };
  std::vector<at::Tensor> frozen0, frozen3, frozen3p;
  const GptRun s0 = run(0, false, &frozen0), s3 = run(3, false, &frozen3), s3p = run(3, true, &frozen3p);
  for (const GptRun* r : {&s3, &s3p}) {
    for (std::size_t i = 0; i < s0.losses.size(); ++i) {
      EXPECT_NEAR(r->losses[i], s0.losses[i], 1e-2 * std::abs(s0.losses[i])) << "step " << i;
    }
    ASSERT_EQ(r->params.size(), s0.params.size());
    for (std::size_t i = 0; i < s0.params.size(); ++i) {
      EXPECT_LE((r->params[i] - s0.params[i]).abs().max().item<double>(), kBf16ParamBound) << "parameter " << i;
    }
  }
  ASSERT_EQ(frozen3.size(), frozen0.size());
  for (std::size_t i = 0; i < frozen0.size(); ++i) {
    EXPECT_TRUE(frozen3[i].equal(frozen0[i])) << "frozen tensor " << i << " moved at stage 3";
    EXPECT_TRUE(frozen3p[i].equal(frozen0[i])) << "frozen tensor " << i << " moved at stage 3 with offload_param";
  }
}

// A unit whose output is a view of its own parameter (a weight returned
// transposed) would hand out memory that the release right after takes
// away: refused, naming the unit and the fix; a copy is fine.
TEST(Stage3, AUnitOutputThatIsAViewOfItsParametersIsRefused) {
  comm::Communicator& comm = world_comm();
  auto model = std::make_shared<SharedUnitMlp>();
  config::Config cfg = make_config(3, false, /*bf16=*/false, comm.world_size(), 2, 1);
  Engine engine(model, cfg, comm);
  const at::Tensor x = at::randn({2, 32});
  const auto& head = model->head;
  try {
    zero::unit(*head, x, [&](const at::Tensor&) { return head->weight.t(); });
    ADD_FAILURE() << "a view of the unit's weight was handed out";
  } catch (const zero::Error& e) {
    // Named by its path in the model (its class alone names every such layer).
    EXPECT_NE(std::string(e.what()).find("the output of unit 'head' (torch::nn::LinearImpl) is a view of its own "
                                         "parameters"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("return a copy"), std::string::npos) << e.what();
  }
  const at::Tensor copy = zero::unit(*head, x, [&](const at::Tensor&) { return head->weight.t().clone(); });
  EXPECT_EQ(copy.sizes(), (std::vector<std::int64_t>{32, 4}));
  EXPECT_TRUE(copy.isfinite().all().item<bool>());
  EXPECT_EQ(head->weight.numel(), 0) << "released after the call";
  // And training goes on.
  engine.backward(at::mse_loss(model->forward(at::randn({2, 16})), at::zeros({2, 4})));
  engine.step();
}

TEST(Stage3, BetweenStepsAUnitsParameterIsHollowAndGatherParametersGivesItsValues) {
  comm::Communicator& comm = world_comm();
  auto model = make_gpt();
  std::vector<std::vector<std::int64_t>> shapes;
  for (const auto& [name, p] : trainable(*model)) shapes.push_back(p.sizes().vec());
  config::Config cfg = stage3_config(comm.world_size(), /*bf16=*/false);
  Engine engine(model, cfg, comm);
  // `all`: every block's; otherwise a block may still be gathered (fetched
  // ahead for a backward that did not come), and then it holds its values.
  auto expect_hollow = [&](const char* when, bool all = true) {
    std::size_t i = 0, hollow = 0;
    for (const auto& [name, p] : trainable(*model)) {
      if (in_a_block(name)) {
        if (all || p.numel() == 0) {
          EXPECT_EQ(p.numel(), 0) << name << " " << when;
          EXPECT_EQ(p.detach().sum().item<float>(), 0.0f) << name << " " << when;
        } else {
          EXPECT_EQ(p.sizes().vec(), shapes[i]) << name << " " << when;
          EXPECT_TRUE(p.isfinite().all().item<bool>()) << name << " " << when;
        }
        hollow += p.numel() == 0 ? 1 : 0;
      } else {
        EXPECT_EQ(p.sizes().vec(), shapes[i]) << name << " stays gathered " << when;
      }
      ++i;
    }
    if (all) {
      EXPECT_GT(hollow, 0u) << when;
    }
  };
  expect_hollow("after construction");
  const std::vector<at::Tensor> master = train_gpt(*model, engine, comm, 2).params;
  expect_hollow("after two steps");
  {
    torch::NoGradGuard no_grad;
    const at::Tensor idx = at::randint(tiny_gpt().vocab_size, {1, kSeq});
    EXPECT_TRUE(model->forward(idx).isfinite().all().item<bool>());
  }
  expect_hollow("after a forward without gradients");
  {
    const at::Tensor idx = at::randint(tiny_gpt().vocab_size, {1, kSeq});
    EXPECT_TRUE(model->forward(idx).isfinite().all().item<bool>());  // its graph dropped, no backward
  }
  expect_hollow("after a forward whose graph was dropped", /*all=*/false);
  {
    GatheredParameters all = engine.gather_parameters();
    GatheredParameters nested = engine.gather_parameters();
    std::size_t i = 0;
    for (const auto& [name, p] : trainable(*model)) {
      EXPECT_EQ(p.sizes().vec(), shapes[i]) << name;
      EXPECT_TRUE(at::equal(p.detach(), master[i])) << name;
      ++i;
    }
  }
  expect_hollow("after gather_parameters()'s scope");
  // A write into a hollow parameter fails on its shape.
  for (const auto& [name, p] : trainable(*model)) {
    if (!in_a_block(name)) continue;
    torch::NoGradGuard no_grad;
    EXPECT_ANY_THROW(p.copy_(at::zeros(at::IntArrayRef(shapes[0]))));
    break;
  }
}

// A loss term that reads a unit's parameter outside the unit (a weight decay
// written by hand) reads a hollow tensor: its backward must name the
// parameter and the cause, not fail in the reducer on a shape or add
// nothing silently, and the engine must train on after it.
TEST(Stage3, ALossTermOnAReleasedParameterIsNamed) {
  comm::Communicator& comm = world_comm();
  auto model = make_gpt();
  std::string block_param, kept_param;
  at::Tensor w, kept;
  std::int64_t numel = 0;
  for (const auto& [name, p] : trainable(*model)) {
    if (in_a_block(name) && block_param.empty()) {
      block_param = name;
      w = p;
      numel = p.numel();
    } else if (!in_a_block(name) && kept_param.empty()) {
      kept_param = name;
      kept = p;
    }
  }
  ASSERT_FALSE(block_param.empty());
  ASSERT_FALSE(kept_param.empty());
  Engine engine(model, stage3_config(comm.world_size(), /*bf16=*/false), comm);
  torch::manual_seed(5);
  const at::Tensor batch = at::randint(tiny_gpt().vocab_size, {2, kSeq + 1});
  auto expect_named = [&](const at::Tensor& loss, const char* how) {
    try {
      engine.backward(loss);
      ADD_FAILURE() << how << ": a gradient of a released parameter was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("parameter '" + block_param + "' (" + std::to_string(numel) +
                          " elements) was used while released"),
                std::string::npos)
          << how << ": " << what;
      EXPECT_NE(what.find("outside the zero::unit"), std::string::npos) << how << ": " << what;
      EXPECT_NE(what.find("gather_parameters()"), std::string::npos) << how << ": " << what;
    }
  };
  // Used in its unit and outside it, in either order (autograd fails on
  // the shapes), and outside it only (its gradient comes with no element).
  {
    const at::Tensor model_loss = model->loss(batch.narrow(1, 0, kSeq), batch.narrow(1, 1, kSeq));
    const at::Tensor decay = 1e-3 * w.pow(2).sum();
    expect_named(model_loss + decay, "the unit first");
  }
  {
    const at::Tensor decay = 1e-3 * w.pow(2).sum();
    const at::Tensor model_loss = model->loss(batch.narrow(1, 0, kSeq), batch.narrow(1, 1, kSeq));
    expect_named(model_loss + decay, "the term first");
  }
  expect_named(1e-3 * w.pow(2).sum() + kept.sum(), "outside only");
  // The failed backwards left nothing behind: two plain steps train.
  const GptRun after = train_gpt(*model, engine, comm, 2);
  for (float l : after.losses) EXPECT_TRUE(std::isfinite(l));
  // Inside gather_parameters() the same term is a real one.
  {
    GatheredParameters all = engine.gather_parameters();
    EXPECT_EQ(w.numel(), numel);
    engine.backward(model->loss(batch.narrow(1, 0, kSeq), batch.narrow(1, 1, kSeq)) + 1e-3 * w.pow(2).sum());
    engine.step();
  }
}

// Training inside gather_parameters() (units held, not released between
// uses) is the same training as without it; the scope may outlive the engine.
TEST(Stage3, TrainingInsideGatherParametersIsTheSame) {
  comm::Communicator& comm = world_comm();
  auto run = [&](bool inside) {
    auto model = make_gpt();
    config::Config cfg = stage3_config(comm.world_size(), /*bf16=*/false);
    cfg.gradient_accumulation_steps = 2;
    cfg.train_batch_size *= 2;
    auto engine = std::make_unique<Engine>(model, cfg, comm);
    GptRun first = train_gpt(*model, *engine, comm, 2);
    std::optional<GatheredParameters> held;
    if (inside) held.emplace(engine->gather_parameters());
    GptRun second = train_gpt(*model, *engine, comm, 4);
    if (inside) {
      for (const auto& [name, p] : trainable(*model)) EXPECT_GT(p.numel(), 0) << name << " inside the scope";
    }
    engine.reset();
    held.reset();  // after the engine: does nothing
    second.losses.insert(second.losses.begin(), first.losses.begin(), first.losses.end());
    return second;
  };
  const GptRun plain = run(false), inside = run(true);
  expect_same_run(plain, inside);
}

// A backward that fails inside gather_parameters() (here a hook on the loss
// that throws, as a user's check might) drops that backward's window, not
// the scope's hold: inside the scope the module still has every parameter,
// a forward gives the loss it gave before, and training goes on after the
// scope as if the failed backward had not been.
TEST(Stage3, ABackwardThatFailsInsideGatherParametersKeepsTheScopesHold) {
  comm::Communicator& comm = world_comm();
  auto run = [&](bool fail) {
    auto model = make_gpt();
    Engine engine(model, stage3_config(comm.world_size(), /*bf16=*/false), comm);
    GptRun first = train_gpt(*model, engine, comm, 2);
    if (fail) {
      GatheredParameters held = engine.gather_parameters();
      torch::manual_seed(42);
      const at::Tensor b = at::randint(tiny_gpt().vocab_size, {2, kSeq + 1});
      at::Tensor loss = model->loss(b.narrow(1, 0, kSeq), b.narrow(1, 1, kSeq));
      const float before = loss.item<float>();
      loss.register_hook([](const at::Tensor&) -> at::Tensor { throw std::runtime_error("planted in a hook"); });
      EXPECT_THROW(engine.backward(loss), std::exception);
      for (const auto& [name, p] : trainable(*model)) EXPECT_GT(p.numel(), 0) << name << " inside the scope";
      at::NoGradGuard no_grad;
      EXPECT_EQ(model->loss(b.narrow(1, 0, kSeq), b.narrow(1, 1, kSeq)).item<float>(), before);
    }
    GptRun second = train_gpt(*model, engine, comm, 2);
    second.losses.insert(second.losses.begin(), first.losses.begin(), first.losses.end());
    return second;
  };
  const GptRun plain = run(false), failed = run(true);
  expect_same_run(plain, failed);
}

// At stage 2 the module always has its parameters: the scope holds nothing.
TEST(Stage3, GatherParametersAtStageTwoHoldsNothing) {
  comm::Communicator& comm = world_comm();
  auto model = make_gpt();
  config::Config cfg = stage3_config(comm.world_size(), /*bf16=*/false);
  cfg.zero_optimization.stage = 2;
  Engine engine(model, cfg, comm);
  train_gpt(*model, engine, comm, 1);
  GatheredParameters none = engine.gather_parameters();
  for (const auto& [name, p] : trainable(*model)) EXPECT_GT(p.numel(), 0) << name;
}

// ---- offload_param with the optimizer offloaded and the delayed update ------

TEST(Stage3, OffloadParamWithOffloadedOptimizerAndDelayedUpdateMatchesStage2) {
  comm::Communicator& comm = world_comm();
  auto run = [&](int stage) {
    auto model = make_gpt();
    config::Config cfg = stage3_config(comm.world_size(), /*bf16=*/false);
    cfg.zero_optimization.stage = stage;
    cfg.zero_optimization.offload_optimizer.device = "cpu";
    cfg.zero_optimization.offload_optimizer.delayed_param_update = true;
    cfg.zero_optimization.offload_optimizer.delayed_param_update_warmup_steps = 2;
    if (stage == 3) cfg.zero_optimization.offload_param.device = "cpu";
    Engine engine(model, cfg, comm);
    return train_gpt(*model, engine, comm, 6);
  };
  // The delayed update is the same at every stage: stage 2 with DPU is the
  // reference (engine_behaviour_test holds it to its definition).
  const GptRun s3 = run(3), s2 = run(2);
  ASSERT_EQ(s3.losses.size(), s2.losses.size());
  for (std::size_t i = 0; i < s2.losses.size(); ++i) {
    EXPECT_NEAR(s3.losses[i], s2.losses[i], 1e-5 * std::abs(s2.losses[i])) << "step " << i;
  }
  for (std::size_t i = 0; i < s2.params.size(); ++i) {
    const at::Tensor diff = (s3.params[i] - s2.params[i]).abs();
    EXPECT_TRUE((diff <= s2.params[i].abs() * 1e-5 + 1e-6).all().item<bool>())
        << "parameter " << i << ": " << diff.max().item<double>();
  }
}

}  // namespace
}  // namespace zero::test
