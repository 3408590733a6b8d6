// zero::to_meta and zero::replace_data (zero/zero/deferred_init.h), and
// zero::models::Gpt built on the meta device: a tensor keeps its identity
// (the module's members still refer to it) across meta and the CPU, its
// memory is really freed, a module brought back trains as LibTorch trains
// it, and a GPT built on meta holds one block at most while it is built and
// gets GPT-2's initialisation, equal to the CPU build's, from init_parameter.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "../support/heap_bytes.h"
#include "zero/core/error.h"
#include "zero/models/gpt.h"
#include "zero/zero/deferred_init.h"

namespace zero {
namespace {

using test::heap_bytes;

// Bytes malloc holds for the program now (the main arena and mmapped chunks:
// LibTorch's CPU tensors come from there).
struct Net : torch::nn::Module {
  Net() {
    a = register_module("a", torch::nn::Linear(64, 256));
    b = register_module("b", torch::nn::Linear(256, 4));
    scale = register_buffer("scale", at::full({4}, 2.0f));
  }
  at::Tensor forward(const at::Tensor& x) { return b->forward(at::relu(a->forward(x))) * scale; }
  torch::nn::Linear a{nullptr}, b{nullptr};
  at::Tensor scale;
};

TEST(DeferredInit, ToMetaKeepsEachTensorAndFreesItsMemory) {
  torch::manual_seed(3);
  Net net;
  const at::TensorImpl* weight = net.a->weight.unsafeGetTensorImpl();
  const std::int64_t before = heap_bytes();
  to_meta(net);
  const std::int64_t freed = before - heap_bytes();
  EXPECT_GE(freed, (64 * 256 + 256) * 4) << "a's weight and bias went back to malloc";
  EXPECT_TRUE(has_meta_tensors(net));
  for (const at::Tensor& p : net.parameters()) {
    EXPECT_TRUE(p.is_meta());
    EXPECT_TRUE(p.requires_grad());
    EXPECT_EQ(p.scalar_type(), at::kFloat);
  }
  EXPECT_TRUE(net.scale.is_meta()) << "buffers too";
  EXPECT_EQ(net.a->weight.unsafeGetTensorImpl(), weight) << "the module's member is the same tensor";
  EXPECT_EQ(net.a->weight.sizes(), (at::IntArrayRef{256, 64}));
}

// Back from meta with values of its own, the module is an ordinary one: its
// forward, backward and a LibTorch optimizer step give what a module built
// with those values directly gives.
TEST(DeferredInit, AModuleBroughtBackTrainsAsLibTorchTrainsIt) {
  torch::manual_seed(3);
  Net reference;
  std::unordered_map<std::string, at::Tensor> values;
  for (const auto& item : reference.named_parameters()) values[item.key()] = item.value().detach().clone();
  Net net;
  to_meta(net);
  {
    at::NoGradGuard no_grad;
    for (const auto& item : net.named_parameters()) replace_data(item.value(), values.at(item.key()).clone());
    replace_data(net.scale, at::full({4}, 2.0f));
  }
  EXPECT_FALSE(has_meta_tensors(net));
  torch::optim::SGD opt_ref(reference.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD opt(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(100 + step);
    const at::Tensor x = at::randn({8, 64});
    for (auto* m : {&reference, &net}) {
      auto& o = m == &reference ? opt_ref : opt;
      o.zero_grad();
      m->forward(x).pow(2).mean().backward();
      o.step();
    }
  }
  for (const auto& item : reference.named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), net.named_parameters()[item.key()])) << item.key();
  }
}

TEST(DeferredInit, ReplaceDataRefusesWhatItCannotDo) {
  const at::Tensor t = at::zeros({4});
  EXPECT_THROW(replace_data(t, at::Tensor()), Error);
  // Within real devices it is set_data, with set_data's own rules.
  replace_data(t, at::ones({2}));
  EXPECT_EQ(t.numel(), 2);
  EXPECT_THROW(replace_data(at::zeros({4}), at::empty({4}, at::kMeta).to_sparse()), std::exception);
}

models::GptConfig small_gpt() {
  models::GptConfig g;
  g.vocab_size = 64;
  g.block_size = 32;
  g.n_layer = 6;
  g.n_head = 4;
  g.n_embd = 64;
  return g;
}

// Built on meta, the GPT holds none of its parameters' memory: the same
// GPT built on the CPU holds the whole model more (each submodule gives its
// memory back as soon as it is built, so the host never holds more than one).
TEST(DeferredInit, GptOnMetaHoldsNoParameterMemory) {
  const models::GptConfig g = small_gpt();
  std::int64_t block = 0;
  {
    models::Block b(g);
    for (const at::Tensor& p : b.parameters()) block += p.numel() * 4;
  }
  const std::int64_t full = g.num_parameters() * 4;
  ASSERT_GT(full, 5 * block) << "the model must be larger than one block for the check to mean something";
  std::int64_t before = heap_bytes();
  auto meta = std::make_shared<models::Gpt>(g, /*on_meta=*/true);
  const std::int64_t meta_held = heap_bytes() - before;
  before = heap_bytes();
  auto cpu = std::make_shared<models::Gpt>(g);
  const std::int64_t cpu_held = heap_bytes() - before;
  for (const at::Tensor& p : meta->parameters()) ASSERT_TRUE(p.is_meta());
  std::printf("[ measured ] GPT of %lld parameter bytes: built on meta it holds %lld bytes (the modules), on the CPU "
              "%lld (one block: %lld)\n",
              static_cast<long long>(full), static_cast<long long>(meta_held), static_cast<long long>(cpu_held),
              static_cast<long long>(block));
  EXPECT_LT(meta_held, block) << "less than one block: no parameter memory";
  EXPECT_GE(cpu_held - meta_held, full * 99 / 100);
  EXPECT_EQ(meta->parameters().size(), cpu->parameters().size());
}

// init_parameter is the CPU build's initialisation: filling a meta-built GPT
// through it from the same seed gives the same values, in any order (an
// engine fills them bucket by bucket; zero-train relies on it).
TEST(DeferredInit, GptInitParameterEqualsTheCpuBuild) {
  const models::GptConfig g = small_gpt();
  torch::manual_seed(11);
  auto cpu = std::make_shared<models::Gpt>(g);
  torch::manual_seed(11);
  auto meta = std::make_shared<models::Gpt>(g, /*on_meta=*/true);
  {
    at::NoGradGuard no_grad;
    auto items = meta->named_parameters().items();
    std::reverse(items.begin(), items.end());
    for (const auto& item : items) {
      const at::Tensor value = at::empty(item.value().sizes());
      meta->init_parameter(item.key(), value);
      replace_data(item.value(), value);
    }
  }
  const auto expected = cpu->named_parameters();
  for (const auto& item : meta->named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), expected[item.key()])) << item.key();
  }
  EXPECT_THROW(meta->init_parameter("wte.weight", at::empty({2, 2}, at::kMeta)), Error);
}

}  // namespace
}  // namespace zero
