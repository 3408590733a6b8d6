// A module built without memory (zero::to_meta; zero::models::Gpt with
// on_meta) and filled by the engine on its device (EngineOptions): it trains
// exactly as the same module built on the CPU, at every stage; its frozen
// parameters and buffers are filled too; at stage 3 a rank's heap never holds
// more than its partition and one bucket of the model while the engine is
// built (measured from malloc, with the bound computed here from the model's
// sizes, not from the engine's plan); and bad uses are clear errors that
// leave the module as it was.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <ATen/ops/linspace.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include "../support/heap_bytes.h"
#include "train_loop.h"
#include "zero/core/error.h"
#include "zero/models/gpt.h"
#include "zero/zero/deferred_init.h"
#include "zero/zero/memory_plan.h"

namespace zero::test {
namespace {

constexpr std::int64_t kSeq = 16;

models::GptConfig gpt_shape(std::int64_t layers = 3, std::int64_t width = 32) {
  models::GptConfig g;
  g.vocab_size = 64;
  g.block_size = kSeq;
  g.n_layer = layers;
  g.n_head = 2;
  g.n_embd = width;
  return g;
}

EngineOptions gpt_build(const std::shared_ptr<models::Gpt>& gpt) {
  EngineOptions o;
  o.device = c10::Device(c10::kCPU);
  o.init = [p = gpt.get()](const std::string& name, const at::Tensor& value) { p->init_parameter(name, value); };
  return o;
}

struct Trained {
  std::vector<float> losses;
  std::vector<at::Tensor> masters;            // gathered fp32 master weights
  std::vector<at::Tensor> module_after;       // the module's parameters once the engine is gone
};

Trained train_gpt(const std::shared_ptr<models::Gpt>& model, const config::Config& cfg, EngineOptions options,
                  comm::Communicator& comm) {
  Trained t;
  {
    Engine engine(model, cfg, comm, std::move(options));
    for (int step = 0; step < 3; ++step) {
      torch::manual_seed(500 + step);
      const at::Tensor all = at::randint(model->config().vocab_size, {2 * comm.world_size(), kSeq + 1});
      const at::Tensor mine = all.narrow(0, 2 * comm.rank(), 2);
      at::Tensor loss = model->loss(mine.narrow(1, 0, kSeq), mine.narrow(1, 1, kSeq));
      engine.backward(loss);
      engine.step();
      t.losses.push_back(loss.item<float>());
    }
    engine.flush();
    t.masters = engine.gather_master_params();
  }
  for (const at::Tensor& p : model->parameters()) t.module_after.push_back(p.detach().clone());
  return t;
}

struct StageCase {
  int stage;
  bool offload;        // offload_optimizer cpu
  bool offload_param;  // stage 3
};
class BuildOnMeta : public testing::TestWithParam<StageCase> {};

// The same seed, the same GPT-2 initialisation drawn in the same order: a
// GPT built on meta and filled by the engine trains bit for bit as the one
// built on the CPU, and afterwards the module is an ordinary CPU module
// holding the trained values.
TEST_P(BuildOnMeta, GptTrainsExactlyAsTheCpuBuiltOne) {
  const StageCase c = GetParam();
  comm::Communicator& comm = world_comm();
  config::Config cfg = make_config(c.stage, c.offload, /*bf16=*/false, comm.world_size(), 2, 1);
  if (c.offload_param) cfg.zero_optimization.offload_param.device = "cpu";
  torch::manual_seed(21);
  auto cpu = std::make_shared<models::Gpt>(gpt_shape());
  const Trained expected = train_gpt(cpu, cfg, EngineOptions{}, comm);
  torch::manual_seed(21);
  auto meta = std::make_shared<models::Gpt>(gpt_shape(), /*on_meta=*/true);
  ASSERT_TRUE(has_meta_tensors(*meta));
  const Trained got = train_gpt(meta, cfg, gpt_build(meta), comm);
  ASSERT_EQ(got.losses.size(), expected.losses.size());
  for (std::size_t s = 0; s < got.losses.size(); ++s) EXPECT_EQ(got.losses[s], expected.losses[s]) << "step " << s;
  ASSERT_EQ(got.masters.size(), expected.masters.size());
  for (std::size_t i = 0; i < got.masters.size(); ++i) {
    EXPECT_TRUE(at::equal(got.masters[i], expected.masters[i])) << "master " << i;
  }
  EXPECT_FALSE(has_meta_tensors(*meta));
  for (std::size_t i = 0; i < got.module_after.size(); ++i) {
    EXPECT_TRUE(got.module_after[i].is_cpu());
    EXPECT_TRUE(at::equal(got.module_after[i], expected.module_after[i])) << "module parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, BuildOnMeta,
                         testing::Values(StageCase{0, false, false}, StageCase{1, false, false},
                                         StageCase{2, false, false}, StageCase{2, true, false},
                                         StageCase{3, false, false}, StageCase{3, true, true}),
                         [](const testing::TestParamInfo<StageCase>& i) {
                           return "stage" + std::to_string(i.param.stage) + (i.param.offload ? "_offload" : "") +
                                  (i.param.offload_param ? "_param" : "");
                         });

// Frozen parameters (floating and not) and buffers on meta are filled by
// init on the device too, in their own dtype, then cast as any module's are.
struct WithState : torch::nn::Module {
  WithState() {
    l1 = register_module("l1", torch::nn::Linear(16, 8));
    frozen = register_module("frozen", torch::nn::Linear(8, 8));
    for (auto& p : frozen->parameters()) p.requires_grad_(false);
    l2 = register_module("l2", torch::nn::Linear(8, 4));
    shift = register_buffer("shift", at::zeros({8}));
    steps = register_buffer("steps", at::zeros({1}, at::kLong));
    for (auto* l : {&l1, &l2}) zero::mark_unit(**l);
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::gelu(as_unit(l1, x)) + shift;
    return as_unit(l2, at::gelu(frozen->forward(h)));
  }
  torch::nn::Linear l1{nullptr}, frozen{nullptr}, l2{nullptr};
  at::Tensor shift, steps;
};

void fill_by_name(const std::string& name, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  if (!value.is_floating_point()) {
    value.fill_(static_cast<std::int64_t>(name.size()));
    return;
  }
  const double base = static_cast<double>(std::hash<std::string>{}(name) % 97) / 97.0;
  value.copy_(at::linspace(-base, base, value.numel()).view(value.sizes()));
}

TEST(BuildOnMetaState, FrozenParametersAndBuffersAreFilledOnTheDevice) {
  comm::Communicator& comm = world_comm();
  std::vector<at::Tensor> expected;
  auto run = [&](bool on_meta, std::set<std::string>* names) {
    auto net = std::make_shared<WithState>();
    EngineOptions o;
    if (on_meta) {
      to_meta(*net);
      o.device = c10::Device(c10::kCPU);
      o.init = [names](const std::string& name, const at::Tensor& value) {
        names->insert(name);
        fill_by_name(name, value);
      };
    } else {
      at::NoGradGuard no_grad;
      for (const auto& item : net->named_parameters()) fill_by_name(item.key(), item.value());
      for (const auto& item : net->named_buffers()) fill_by_name(item.key(), item.value());
    }
    config::Config cfg = make_config(3, false, /*bf16=*/true, comm.world_size(), 2, 1);
    std::vector<at::Tensor> out;
    {
      Engine engine(net, cfg, comm, std::move(o));
      EXPECT_EQ(net->shift.scalar_type(), at::kBFloat16) << "a floating buffer takes the training precision";
      EXPECT_EQ(net->steps.scalar_type(), at::kLong) << "an integer buffer keeps its dtype";
      EXPECT_EQ(net->frozen->weight.scalar_type(), at::kBFloat16);
      torch::manual_seed(8);
      const at::Tensor x = at::randn({2 * comm.world_size(), 16}).narrow(0, 2 * comm.rank(), 2);
      at::Tensor loss = net->forward(x.to(at::kBFloat16)).to(at::kFloat).pow(2).mean();
      engine.backward(loss);
      engine.step();
      out = engine.gather_master_params();
    }
    for (const auto& item : net->named_parameters()) out.push_back(item.value().detach().clone());
    for (const auto& item : net->named_buffers()) out.push_back(item.value().detach().clone());
    return out;
  };
  const std::vector<at::Tensor> reference = run(false, nullptr);
  std::set<std::string> names;
  const std::vector<at::Tensor> got = run(true, &names);
  EXPECT_EQ(names, (std::set<std::string>{"l1.weight", "l1.bias", "frozen.weight", "frozen.bias", "l2.weight",
                                          "l2.bias", "shift", "steps"}));
  ASSERT_EQ(got.size(), reference.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_FALSE(got[i].is_meta()) << i;
    EXPECT_EQ(got[i].scalar_type(), reference[i].scalar_type()) << i;
    EXPECT_TRUE(at::equal(got[i], reference[i])) << "tensor " << i;
  }
}

// ---- memory: a rank never holds the model while the engine is built -------

TEST(BuildOnMetaMemory, Stage3HoldsItsPartitionAndOneBucketAtMost) {
  comm::Communicator& comm = world_comm();
  const std::int64_t N = comm.world_size();
  const models::GptConfig g = gpt_shape(/*layers=*/8, /*width=*/128);
  torch::manual_seed(5);
  auto model = std::make_shared<models::Gpt>(g, /*on_meta=*/true);
  // Sizes from the module: each block is a unit; the embeddings and the
  // final LayerNorm (no unit) stay gathered in the training precision.
  std::int64_t psi = 0, kept = 0, largest_unit = 0, tensors = 0;
  for (const auto& item : model->named_children()) {
    std::int64_t n = 0;
    for (const at::Tensor& p : item.value()->parameters()) n += p.numel();
    if (is_unit(*item.value())) {
      largest_unit = std::max(largest_unit, n);
    } else {
      kept += n;
    }
    psi += n;
    tensors += static_cast<std::int64_t>(item.value()->parameters().size());
  }
  config::Config cfg = make_config(3, false, /*bf16=*/true, static_cast<int>(N), 2, 1);
  const std::int64_t slack = tensors * N * kPlanAlignElements;  // padding, at most
  const std::int64_t es = 2;
  // The partition (training precision) and the fp32 master partition, one
  // bucket in fp32 while it is filled, the buckets of no unit gathered.
  const std::int64_t bound =
      (es + 4) * ((psi + slack) / N) + 4 * (std::max(largest_unit, kept) + slack) + es * (kept + slack) + (256 << 10);
  EngineOptions o = gpt_build(model);
  std::int64_t peak = 0;
  const std::int64_t before = heap_bytes();
  auto inner = o.init;
  o.init = [&](const std::string& name, const at::Tensor& value) {
    inner(name, value);
    peak = std::max(peak, heap_bytes() - before);
  };
  {
    // Sampled while the model's values are being made (the moments and the
    // gradient buffers come after, and are the optimizer's, not the model's).
    Engine engine(model, cfg, comm, std::move(o));
    std::printf("[ measured ] N=%lld: heap growth while the engine filled a %lld-byte (fp32) model: %lld B at most, "
                "bound %lld B\n",
                static_cast<long long>(N), static_cast<long long>(4 * psi), static_cast<long long>(peak),
                static_cast<long long>(bound));
    EXPECT_LE(peak, bound);
    if (N >= 4) {
      EXPECT_LT(peak, 4 * psi / 2) << "far below the full model in fp32";
    }
  }
}

// ---- errors: each names the fix, and the module is left as it was ----------

std::shared_ptr<models::Gpt> meta_gpt() { return std::make_shared<models::Gpt>(gpt_shape(), /*on_meta=*/true); }

void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Part of a model on meta, the rest built on the CPU, and no device named:
// the engine trains where the rest is, filling the meta part there, bit for
// bit as the model built whole on the CPU.
TEST(BuildOnMeta, APartlyMetaModelTrainsWhereTheRestIs) {
  comm::Communicator& comm = world_comm();
  const config::Config cfg = make_config(2, false, /*bf16=*/false, comm.world_size(), 2, 1);
  torch::manual_seed(21);
  auto whole = std::make_shared<models::Gpt>(gpt_shape());
  const Trained expected = train_gpt(whole, cfg, EngineOptions{}, comm);
  torch::manual_seed(21);
  auto part = std::make_shared<models::Gpt>(gpt_shape());
  for (const auto& child : part->named_children()) {
    if (child.key() == "h1") to_meta(*child.value());
  }
  ASSERT_TRUE(has_meta_tensors(*part));
  EngineOptions o = gpt_build(part);
  o.device.reset();
  const Trained got = train_gpt(part, cfg, o, comm);
  ASSERT_EQ(got.losses.size(), expected.losses.size());
  for (std::size_t s = 0; s < got.losses.size(); ++s) EXPECT_EQ(got.losses[s], expected.losses[s]) << "step " << s;
  for (std::size_t i = 0; i < got.module_after.size(); ++i) {
    EXPECT_TRUE(got.module_after[i].is_cpu());
    EXPECT_TRUE(at::equal(got.module_after[i], expected.module_after[i])) << "module parameter " << i;
  }
}

TEST(BuildOnMetaErrors, EachMisuseIsNamed) {
  comm::Communicator& comm = world_comm();
  const config::Config cfg = make_config(3, false, /*bf16=*/true, comm.world_size(), 2, 1);
  auto model = meta_gpt();
  expect_error([&] { Engine e(model, cfg, comm); }, "no init function");
  EngineOptions no_device = gpt_build(model);
  no_device.device.reset();
  expect_error([&] { Engine e(model, cfg, comm, no_device); }, "EngineOptions::device");
  EngineOptions on_meta = gpt_build(model);
  on_meta.device = c10::Device(c10::kMeta);
  expect_error([&] { Engine e(model, cfg, comm, on_meta); }, "name the device to train on");
  // An init that assigns a new tensor instead of filling the one it is given.
  EngineOptions assigns = gpt_build(model);
  assigns.init = [](const std::string&, const at::Tensor& value) {
    at::Tensor v = value;
    v = at::zeros(value.sizes());
  };
  expect_error([&] { Engine e(model, cfg, comm, assigns); }, "EngineOptions::init left '");
  // An init that fails half-way: its error, and the module back on meta.
  EngineOptions fails = gpt_build(model);
  fails.init = [p = model.get()](const std::string& name, const at::Tensor& value) {
    ZERO_CHECK(name.rfind("h1.", 0) != 0, "no weights for ", name);
    p->init_parameter(name, value);
  };
  expect_error([&] { Engine e(model, cfg, comm, fails); }, "no weights for h1.");
  for (const at::Tensor& p : model->parameters()) EXPECT_TRUE(p.is_meta()) << "the module is as it was";
  // An init for a module that has memory already.
  torch::manual_seed(1);
  auto cpu = std::make_shared<models::Gpt>(gpt_shape());
  expect_error([&] { Engine e(cpu, cfg, comm, gpt_build(cpu)); }, "the module has none");
  // After all that, the meta module still builds and trains.
  const Trained t = train_gpt(model, cfg, gpt_build(model), comm);
  EXPECT_TRUE(std::isfinite(t.losses.back()));
}

// EngineOptions::weight_decay and lr_scale: asked once per trainable
// parameter with its name and its shape (on meta too, before anything is
// filled); a value that cannot be is named with its parameter, and the
// module stays as it was.
TEST(ParamRules, SeeEveryParameterOnceAndABadValueIsNamed) {
  comm::Communicator& comm = world_comm();
  const config::Config cfg = make_config(3, false, /*bf16=*/false, comm.world_size(), 2, 1);
  auto model = meta_gpt();
  std::vector<std::string> asked;
  EngineOptions counting = gpt_build(model);
  counting.weight_decay = [&](const std::string& name, const at::Tensor& p) -> std::optional<float> {
    asked.push_back(name);
    EXPECT_TRUE(p.is_meta()) << name;
    EXPECT_GT(p.numel(), 0) << name << " is asked with its shape";
    return p.dim() < 2 ? std::optional<float>(0.0f) : std::nullopt;
  };
  {
    Engine e(model, cfg, comm, counting);
  }
  std::vector<std::string> expected;
  for (const auto& np : model->named_parameters()) {
    if (np.value().requires_grad()) expected.push_back(np.key());
  }
  std::sort(asked.begin(), asked.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(asked, expected);

  auto fresh = meta_gpt();
  EngineOptions bad = gpt_build(fresh);
  bad.weight_decay = [](const std::string& name, const at::Tensor&) -> std::optional<float> {
    if (name == "h1.ln1.bias") return -0.1f;
    return std::nullopt;
  };
  expect_error([&] { Engine e(fresh, cfg, comm, bad); }, "gave parameter 'h1.ln1.bias' a weight decay of -0.1");
  bad.weight_decay = [](const std::string&, const at::Tensor&) -> std::optional<float> { return NAN; };
  expect_error([&] { Engine e(fresh, cfg, comm, bad); }, "a weight decay is a finite number >= 0");
  bad.weight_decay = nullptr;
  bad.lr_scale = [](const std::string& name, const at::Tensor&) -> std::optional<float> {
    if (name == "wpe.weight") return INFINITY;
    return std::nullopt;
  };
  expect_error([&] { Engine e(fresh, cfg, comm, bad); },
               "EngineOptions::lr_scale gave parameter 'wpe.weight' an lr scale of inf: an lr scale is a finite "
               "number >= 0 (return std::nullopt for the default, 1)");
  for (const at::Tensor& p : fresh->parameters()) EXPECT_TRUE(p.is_meta()) << "the module is as it was";
  // A rule that answers by rank: every rank refuses, naming the rank.
  if (comm.world_size() > 1) {
    bad.lr_scale = [r = comm.rank()](const std::string& name, const at::Tensor&) -> std::optional<float> {
      if (name == "wpe.weight") return static_cast<float>(1 + r);
      return std::nullopt;
    };
    expect_error([&] { Engine e(fresh, cfg, comm, bad); }, "rules gave rank 1 other settings than rank 0");
    // Rules on rank 0 alone: named, not a hang.
    EngineOptions some = gpt_build(fresh);
    if (comm.rank() == 0) some.weight_decay = no_decay_below_2d();
    expect_error([&] { Engine e(fresh, cfg, comm, some); }, "; rank 1: no rules)");
    // A rule that fails on rank 1 alone: its error on every rank.
    bad.lr_scale = [r = comm.rank()](const std::string& name, const at::Tensor&) -> std::optional<float> {
      if (r == 1 && name == "wpe.weight") return -1.0f;
      return std::nullopt;
    };
    expect_error([&] { Engine e(fresh, cfg, comm, bad); },
                 comm.rank() == 1 ? std::string("EngineOptions::lr_scale gave parameter 'wpe.weight' an lr scale of -1")
                                  : std::string("EngineOptions' rules failed on rank 1: EngineOptions::lr_scale gave "
                                                "parameter 'wpe.weight' an lr scale of -1"));
  }
  // Both rules: the line that says which parameters take what.
  std::size_t low = 0, total = 0;
  for (const at::Tensor& p : fresh->parameters()) {
    total += 1;
    if (p.dim() < 2) ++low;
  }
  EngineOptions both = gpt_build(fresh);
  both.weight_decay = no_decay_below_2d();
  both.lr_scale = scale_below_2d(2.0f);
  testing::internal::CaptureStderr();
  { Engine e(fresh, cfg, comm, both); }
  const std::string said = testing::internal::GetCapturedStderr();
  if (comm.rank() == 0) {
    const std::string n = std::to_string(total - low), k = std::to_string(low);
    EXPECT_NE(said.find("zerocpp: weight decay 0.01 on " + n + " parameters ("), std::string::npos) << said;
    EXPECT_NE(said.find("), 0 on " + k + " ("), std::string::npos) << said;
    EXPECT_NE(said.find("; lr scale 2 on " + k + " parameters ("), std::string::npos) << said;
    EXPECT_NE(said.find("), 1 on " + n + " ("), std::string::npos) << said;
    EXPECT_NE(said.find(" (EngineOptions::weight_decay, lr_scale)"), std::string::npos) << said;
  }
}

}  // namespace
}  // namespace zero::test
