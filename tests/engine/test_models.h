// Small models and configs shared by the engine tests.
#pragma once

#include <cmath>

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

namespace zero::test {

// Linear - GELU - Linear - GELU - Linear with a regression loss.
struct Mlp : torch::nn::Module {
  Mlp() {
    l1 = register_module("l1", torch::nn::Linear(16, 48));
    l2 = register_module("l2", torch::nn::Linear(48, 40));
    l3 = register_module("l3", torch::nn::Linear(40, 4));
  }
  at::Tensor forward(const at::Tensor& x) {
    return l3->forward(at::gelu(l2->forward(at::gelu(l1->forward(x)))));
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
  }
  // idx: [B, T] int64 -> logits [B, T, vocab]
  at::Tensor forward(const at::Tensor& idx) {
    const auto B = idx.size(0), T = idx.size(1);
    at::Tensor x = tok->forward(idx) + pos.narrow(0, 0, T);
    at::Tensor h = ln1->forward(x);
    auto q_k_v = qkv->forward(h).view({B, T, 3, kHeads, kDim / kHeads}).permute({2, 0, 3, 1, 4});
    at::Tensor q = q_k_v[0], k = q_k_v[1], v = q_k_v[2];
    at::Tensor att = q.matmul(k.transpose(-2, -1)) / std::sqrt(double(kDim / kHeads));
    at::Tensor mask = at::ones({T, T}, idx.options().dtype(at::kBool)).triu(1);
    att = at::softmax(att.masked_fill(mask, -1e4), -1);
    at::Tensor y = att.matmul(v).transpose(1, 2).reshape({B, T, kDim});
    x = x + proj->forward(y);
    x = x + out->forward(at::gelu(fc->forward(ln2->forward(x))));
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
  c.zero_optimization.offload_optimizer.device = offload ? "cpu" : "none";
  c.zero_optimization.offload_optimizer.cpu_threads = 1;
  // Small buckets, so that the models span several and overlap is exercised.
  c.zero_optimization.reduce_bucket_size = 1000;
  return c;
}

}  // namespace zero::test
