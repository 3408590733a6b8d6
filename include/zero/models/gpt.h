// A GPT-2 style decoder in LibTorch: token + position embeddings, pre-LayerNorm
// blocks of causal self-attention and a GELU MLP, a final LayerNorm and an
// output head tied to the token embedding.
//
// Presets keep GPT-2's shapes (layers, heads, width, context) with the
// vocabulary of the tokenizer in use (256 for zerocpp's byte-level one), so
// the parameter counts are GPT-2's minus the smaller embedding.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

namespace zero::models {

struct GptConfig {
  std::int64_t vocab_size = 256;
  std::int64_t block_size = 128;  // longest sequence
  std::int64_t n_layer = 2;
  std::int64_t n_head = 2;
  std::int64_t n_embd = 64;
  // Activation checkpointing per block: forward keeps only each block's input
  // and backward re-runs the block (PyTorch's reentrant checkpoint). Trades
  // one extra forward for the activations inside the blocks.
  bool checkpoint_activations = false;
  // With checkpoint_activations: keep the block inputs on the host (kCPU) and
  // copy each back to the block's device when its backward runs.
  bool checkpoint_on_cpu = false;

  std::int64_t num_parameters() const;  // with the tied head counted once
  // Sizes of the parameters in the order Gpt::parameters() lists them (wte,
  // wpe, each block's ln1, qkv, proj, ln2, fc, proj with weight then bias,
  // ln_f): the engine's flat layout without building the model.
  std::vector<std::int64_t> parameter_numels() const;
  // Their shapes, in the same order (Linear weights are [out, in]).
  std::vector<std::vector<std::int64_t>> parameter_shapes() const;
  // Each of those parameters' unit of ZeRO stage 3: its block's index, or -1
  // (the embeddings and the final LayerNorm, used outside the blocks).
  std::vector<int> parameter_units() const;
  // Training FLOPs per token: 6 * params + attention (6 * n_layer * block * n_embd, PaLM's formula
  // with the causal half: 6 * n_layer * seq * n_embd).
  double flops_per_token(std::int64_t seq_len) const;
};

// "gpt2-tiny", "gpt2-small-test", "gpt2" (GPT-2 small's 124M shapes: ~86M
// parameters with the byte vocabulary), "gpt2-medium", "gpt2-large", "gpt2-xl".
// An unknown name throws an error that lists these.
GptConfig gpt_preset(const std::string& name, std::int64_t vocab_size = 256);
std::vector<std::string> gpt_preset_names();

class CausalSelfAttention : public torch::nn::Module {
 public:
  explicit CausalSelfAttention(const GptConfig& c);
  at::Tensor forward(const at::Tensor& x);

 private:
  std::int64_t n_head_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
};

class Block : public torch::nn::Module {
 public:
  explicit Block(const GptConfig& c);
  at::Tensor forward(const at::Tensor& x);
  // forward() up to the MLP's activation: h (after the attention's residual
  // add) and a = gelu(fc(ln2(h))); forward(x) is h + proj(a). Activation
  // checkpointing recomputes only this much in backward: the last linear's
  // backward needs its input a, not its output.
  std::pair<at::Tensor, at::Tensor> forward_to_activation(const at::Tensor& x);
  const torch::nn::Linear& mlp_proj() const { return proj_; }

 private:
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  std::shared_ptr<CausalSelfAttention> attn_;
  torch::nn::Linear fc_{nullptr}, proj_{nullptr};
};

class Gpt : public torch::nn::Module {
 public:
  // on_meta false: the parameters on the CPU with GPT-2's initialisation
  // (init_parameter). true: on the meta device, no memory held (each
  // submodule is moved there as soon as it is built, zero::to_meta); give
  // zero::Engine the init, EngineOptions{device, [&](auto& n, auto& t) {
  // gpt->init_parameter(n, t); }}, and it fills them on its device: the
  // same values as on_meta false from the same seed.
  explicit Gpt(const GptConfig& c, bool on_meta = false);
  // GPT-2's initialisation of the parameter `name` (as named_parameters()
  // gives it) into `value`, in place: N(0, 0.02), the residual projections
  // scaled by 1/sqrt(2 n_layer), biases zero, LayerNorms one and zero. The
  // numbers are drawn on the CPU from a generator of the parameter's own,
  // seeded by the name and one draw of the global generator at construction:
  // a value on a GPU gets the same ones, and the order of the calls does not
  // matter.
  void init_parameter(const std::string& name, const at::Tensor& value) const;
  // idx: [B, T] token ids (int64), T <= block_size -> logits [B, T, vocab].
  at::Tensor forward(const at::Tensor& idx);
  // Mean cross-entropy of next-token prediction, computed in fp32.
  at::Tensor loss(const at::Tensor& idx, const at::Tensor& targets);
  const GptConfig& config() const { return config_; }
  // Turns activation checkpointing on or off (see GptConfig) for later forwards.
  void set_activation_checkpointing(bool enabled, bool on_cpu = false);

 private:
  GptConfig config_;
  std::int64_t init_seed_ = 0;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  std::vector<std::shared_ptr<Block>> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
};

}  // namespace zero::models
