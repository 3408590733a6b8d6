// Small models and configs shared by the engine tests.
#pragma once

#include <cmath>
#include <optional>
#include <string>

#include <ATen/ops/arange.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/triu.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "zero/config/config.h"
#include "zero/engine/param_rules.h"
#include "zero/zero/unit.h"

namespace zero::test {

// An lr_scale rule (zero/engine/param_rules.h): `scale` times the rate for
// the parameters of fewer than two dimensions (biases, norms), the engine's
// for the rest.
inline LrScaleRule scale_below_2d(float scale) {
  return [scale](const std::string&, const at::Tensor& p) -> std::optional<float> {
    if (p.dim() < 2) return scale;
    return std::nullopt;
  };
}

// Runs `layer` as a unit of ZeRO stage 3 (zero/zero/unit.h).
template <typename Layer>
at::Tensor as_unit(Layer& layer, const at::Tensor& x) {
  return zero::unit(*layer, x, [&](const at::Tensor& in) { return layer->forward(in); });
}

// Linear - GELU - Linear - GELU - Linear with a regression loss; each Linear
// a unit of stage 3.
struct Mlp : torch::nn::Module {
  Mlp() {
    l1 = register_module("l1", torch::nn::Linear(16, 48));
    l2 = register_module("l2", torch::nn::Linear(48, 40));
    l3 = register_module("l3", torch::nn::Linear(40, 4));
    for (auto* l : {&l1, &l2, &l3}) zero::mark_unit(**l);
  }
  at::Tensor forward(const at::Tensor& x) {
    return as_unit(l3, at::gelu(as_unit(l2, at::gelu(as_unit(l1, x)))));
  }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
};

// One pre-LayerNorm transformer block over token embeddings, causal
// attention with two heads, a tied output head: the shapes of a GPT.
struct TinyTransformer : torch::nn::Module {
  static constexpr int kVocab = 29, kDim = 24, kHeads = 2, kSeq = 8;
  TinyTransformer() {
    tok = register_module("tok", torch::nn::Embedding(kVocab, kDim));
    pos = register_parameter("pos", at::randn({kSeq, kDim}) * 0.1);
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    // No qkv bias: the key bias gets an exactly-zero gradient (softmax ignores
    // a constant shift), i.e. rounding noise that Adam would amplify into
    // order-dependent lr-sized steps, hiding what parity is meant to see.
    qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(kDim, 3 * kDim).bias(false)));
    proj = register_module("proj", torch::nn::Linear(kDim, kDim));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    fc = register_module("fc", torch::nn::Linear(kDim, 4 * kDim));
    out = register_module("out", torch::nn::Linear(4 * kDim, kDim));
    lnf = register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    // Units of stage 3: the four Linear layers; the embedding (tied to the
    // head, used outside any unit) and the LayerNorms stay gathered.
    for (auto* l : {&qkv, &proj, &fc, &out}) zero::mark_unit(**l);
  }
  // idx: [B, T] int64 -> logits [B, T, vocab]
  at::Tensor forward(const at::Tensor& idx) {
    const auto B = idx.size(0), T = idx.size(1);
    at::Tensor x = tok->forward(idx) + pos.narrow(0, 0, T);
    at::Tensor h = ln1->forward(x);
    auto q_k_v = as_unit(qkv, h).view({B, T, 3, kHeads, kDim / kHeads}).permute({2, 0, 3, 1, 4});
    at::Tensor q = q_k_v[0], k = q_k_v[1], v = q_k_v[2];
    at::Tensor att = q.matmul(k.transpose(-2, -1)) / std::sqrt(double(kDim / kHeads));
    at::Tensor mask = at::ones({T, T}, idx.options().dtype(at::kBool)).triu(1);
    att = at::softmax(att.masked_fill(mask, -1e4), -1);
    at::Tensor y = att.matmul(v).transpose(1, 2).reshape({B, T, kDim});
    x = x + as_unit(proj, y);
    x = x + as_unit(out, at::gelu(as_unit(fc, ln2->forward(x))));
    return lnf->forward(x).matmul(tok->weight.t());  // tied head
  }
  torch::nn::Embedding tok{nullptr};
  at::Tensor pos;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr}, lnf{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, out{nullptr};
};

// An MLP with tied weights: l2's weight is registered a second time under
// another name (so module->parameters() lists the same tensor twice, as a
// GPT's tied embedding and head do) and used twice in the forward.
struct TiedMlp : torch::nn::Module {
  TiedMlp() {
    l1 = register_module("l1", torch::nn::Linear(16, 24));
    l2 = register_module("l2", torch::nn::Linear(24, 24));
    head = register_module("head", torch::nn::Linear(24, 4));
    register_parameter("l2_weight_again", l2->weight);
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::gelu(l2->forward(at::gelu(l1->forward(x))));
    h = at::gelu(at::linear(h, l2->weight));
    return head->forward(h);
  }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, head{nullptr};
};

// Every shape of unit stage 3 must handle: l3 and head ordinary units; l2 a
// unit called twice in one forward; `tied` a unit that holds l3's weight too
// (a parameter of two units, which stays gathered); `scale` a parameter of
// no unit; `ids` an Embedding unit fed integer token ids (no input gradient
// marks the end of its backward); l1 a unit fed with data that needs no
// gradient, computing from its weight alone first (weight normalisation:
// nodes that autograd may run after the input's gradient exists).
struct UnitMlp : torch::nn::Module {
  UnitMlp() {
    l1 = register_module("l1", torch::nn::Linear(16, 32));
    l2 = register_module("l2", torch::nn::Linear(32, 32));
    l3 = register_module("l3", torch::nn::Linear(32, 32));
    tied = register_module("tied", std::make_shared<torch::nn::Module>());
    tied->register_parameter("weight", l3->weight);
    head = register_module("head", torch::nn::Linear(32, 4));
    scale = register_parameter("scale", at::ones({32}));
    ids = register_module("ids", torch::nn::Embedding(8, 16));
    for (auto* l : {&l1, &l2, &l3, &head}) zero::mark_unit(**l);
    zero::mark_unit(*tied);
    zero::mark_unit(*ids);
  }
  at::Tensor forward(const at::Tensor& x) {
    // Token ids from the signs of a sample's first three features: the same
    // in every precision (rounding keeps a sign) and for every split of the
    // batch over ranks.
    const at::Tensor bits = (x.narrow(1, 0, 3) > 0).to(at::kLong);
    const at::Tensor tokens = bits.select(1, 0) + 2 * bits.select(1, 1) + 4 * bits.select(1, 2);  // [B] in 0..7
    const at::Tensor e = as_unit(ids, tokens);                                    // [B, 16]
    at::Tensor h = zero::unit(*l1, x, [&](const at::Tensor& in) {
      const at::Tensor w = l1->weight / l1->weight.norm() * 4.0;
      return at::linear(in, w, l1->bias);
    });
    h = at::gelu(h + e.sum(-1, /*keepdim=*/true) * 0.1) * scale;
    h = at::gelu(as_unit(l2, h));
    h = at::gelu(as_unit(l2, h));
    h = at::gelu(as_unit(l3, h));
    const at::Tensor w = l3->weight;
    h = at::gelu(zero::unit(*tied, h, [&](const at::Tensor& in) { return at::linear(in, w); }));
    return as_unit(head, h);
  }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr}, head{nullptr};
  std::shared_ptr<torch::nn::Module> tied;
  torch::nn::Embedding ids{nullptr};
  at::Tensor scale;
};

// What a user's own model brings beyond UnitMlp: `stem`, a frozen unit fed
// the data first (no gradient flows into or out of it); `block`, one module
// registered under two names (a block shared by two layers) and called as
// both; and `spare`, a trainable layer registered last that the forward
// never uses (a pooler left out of the loss): its buckets come first in the
// layout, which is launched back to front, and it trains as a zero gradient
// (weight decay only), as DeepSpeed's ZeRO treats it.
struct SharedUnitMlp : torch::nn::Module {
  SharedUnitMlp() {
    stem = register_module("stem", torch::nn::Linear(16, 32));
    for (at::Tensor& p : stem->parameters()) p.set_requires_grad(false);
    block = register_module("b0", torch::nn::Linear(32, 32));
    register_module("b1", block);
    head = register_module("head", torch::nn::Linear(32, 4));
    spare = register_module("spare", torch::nn::Linear(32, 32));
    for (auto* l : {&stem, &block, &head}) zero::mark_unit(**l);
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::gelu(as_unit(stem, x));
    h = at::gelu(as_unit(block, h));
    h = at::gelu(as_unit(block, h));
    return as_unit(head, h);
  }
  torch::nn::Linear stem{nullptr}, block{nullptr}, head{nullptr}, spare{nullptr};
};

// A base model under adapters (LoRA): each block a unit holding a frozen
// Linear (weight and bias) and its trainable low-rank pair, the frozen
// weight on the gradient's way to the earlier blocks' adapters (gathered
// again in backward); `inp`, a frozen unit fed the data; `gain`, a frozen
// parameter of no unit (stays whole); `head`, a trainable unit. Stage 3
// partitions the frozen weights of the units.
struct LoraBlock : torch::nn::Module {
  LoraBlock() {
    base = register_module("base", torch::nn::Linear(32, 32));
    for (at::Tensor& p : base->parameters()) p.set_requires_grad(false);
    a = register_parameter("a", at::randn({4, 32}) * 0.2);
    b = register_parameter("b", at::randn({32, 4}) * 0.2);
  }
  at::Tensor forward(const at::Tensor& x) { return base->forward(x) + at::linear(at::linear(x, a), b); }
  torch::nn::Linear base{nullptr};
  at::Tensor a, b;
};

struct LoraMlp : torch::nn::Module {
  LoraMlp() {
    inp = register_module("inp", torch::nn::Linear(16, 32));
    for (at::Tensor& p : inp->parameters()) p.set_requires_grad(false);
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("block" + std::to_string(i), std::make_shared<LoraBlock>()));
    head = register_module("head", torch::nn::Linear(32, 4));
    gain = register_parameter("gain", at::ones({32}) * 1.5, /*requires_grad=*/false);
    zero::mark_unit(*inp);
    for (auto& b : blocks) zero::mark_unit(*b);
    zero::mark_unit(*head);
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::gelu(as_unit(inp, x)) * gain;
    for (auto& b : blocks) h = at::gelu(zero::unit(*b, h, [&](const at::Tensor& in) { return b->forward(in); }));
    return as_unit(head, h);
  }
  torch::nn::Linear inp{nullptr}, head{nullptr};
  std::vector<std::shared_ptr<LoraBlock>> blocks;
  at::Tensor gain;
};

// bf16 runs against a stage-0 bf16 or an fp32 reference: the largest
// difference of a final fp32 master weight allowed, and of each tensor's mean
// difference (engine_parity_test.cpp justifies them with the measured values).
inline constexpr double kBf16ParamBound = 0.04;
inline constexpr double kBf16ParamMeanBound = 1e-3;

inline config::Config make_config(int stage, bool offload, bool bf16, int world, int micro,
                                  int accumulation, float clipping = 0.3f) {
  config::Config c;
  c.train_micro_batch_size_per_gpu = micro;
  c.gradient_accumulation_steps = accumulation;
  c.train_batch_size = static_cast<std::int64_t>(micro) * accumulation * world;
  // 0.3: below the first gradient norms of both models (MLP about 0.37,
  // transformer above 1), so that the parity runs exercise clipping.
  c.gradient_clipping = clipping;
  c.bf16.enabled = bf16;
  c.optimizer.type = "AdamW";
  c.optimizer.lr = 1e-2f;
  c.optimizer.weight_decay = 0.01f;
  // Some gradients are zero in exact arithmetic (the key bias of attention:
  // softmax ignores a constant shift) and pure rounding noise in practice;
  // with eps = 1e-8 Adam turns that noise into full lr-sized steps whose sign
  // depends on the summation order. eps = 1e-6 keeps such elements still, so
  // parity checks ZeRO and not the amplification of rounding noise.
  c.optimizer.eps = 1e-6f;
  c.zero_optimization.stage = stage;
  // Stage 3: the test models' parameters are all small; partition them all.
  c.zero_optimization.stage3_param_persistence_threshold = 0;
  c.zero_optimization.offload_optimizer.device = offload ? "cpu" : "none";
  c.zero_optimization.offload_optimizer.cpu_threads = 1;
  // Small buckets, so that the models span several and overlap is exercised.
  c.zero_optimization.reduce_bucket_size = 1000;
  return c;
}

}  // namespace zero::test
