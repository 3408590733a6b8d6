#include "zero/models/gpt.h"

#include <tuple>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/init.h>

#include "zero/core/error.h"
#include "zero/models/autocast_scope.h"
#include "zero/zero/deferred_init.h"
#include "zero/zero/unit.h"

namespace zero::models {
namespace {

// y = x W^T + b through at::linear, not torch::nn::Linear::forward: the C++
// frontend's functional linear is a matmul followed by a separate `+= bias`
// (torch/nn/functional/linear.h), where at::linear (what Python's nn.Linear
// calls) folds the bias into the GEMM for contiguous 3-D inputs. On an H100
// the separate adds cost 16 ms of a 1.21B GPT's 57 ms forward
// (docs/PERFORMANCE.md, "The C++ GPT against PyTorch").
at::Tensor linear(const torch::nn::Linear& l, const at::Tensor& x) { return at::linear(x, l->weight, l->bias); }

}  // namespace

std::int64_t GptConfig::num_parameters() const {
  const std::int64_t d = n_embd;
  const std::int64_t block = 2 * d /*ln1*/ + d * 3 * d + 3 * d /*qkv*/ + d * d + d /*proj*/ +
                             2 * d /*ln2*/ + d * 4 * d + 4 * d /*fc*/ + 4 * d * d + d /*proj*/;
  return vocab_size * d + block_size * d + n_layer * block + 2 * d;
}

std::vector<std::int64_t> GptConfig::parameter_numels() const {
  const std::int64_t d = n_embd;
  std::vector<std::int64_t> v{vocab_size * d, block_size * d};
  for (std::int64_t i = 0; i < n_layer; ++i) {
    for (std::int64_t n : {d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d}) v.push_back(n);
  }
  v.push_back(d);
  v.push_back(d);
  return v;
}

std::vector<std::vector<std::int64_t>> GptConfig::parameter_shapes() const {
  const std::int64_t d = n_embd;
  std::vector<std::vector<std::int64_t>> v{{vocab_size, d}, {block_size, d}};
  for (std::int64_t i = 0; i < n_layer; ++i) {
    for (const std::vector<std::int64_t>& s : std::vector<std::vector<std::int64_t>>{
             {d}, {d}, {3 * d, d}, {3 * d}, {d, d}, {d}, {d}, {d}, {4 * d, d}, {4 * d}, {d, 4 * d}, {d}}) {
      v.push_back(s);
    }
  }
  v.push_back({d});
  v.push_back({d});
  return v;
}

std::vector<int> GptConfig::parameter_units() const {
  std::vector<int> v{-1, -1};
  for (std::int64_t i = 0; i < n_layer; ++i) v.insert(v.end(), 12, static_cast<int>(i));
  v.push_back(-1);
  v.push_back(-1);
  return v;
}

double GptConfig::flops_per_token(std::int64_t seq_len) const {
  return 6.0 * static_cast<double>(num_parameters()) +
         6.0 * static_cast<double>(n_layer * seq_len * n_embd);
}

std::vector<std::string> gpt_preset_names() {
  return {"gpt2-tiny", "gpt2-small-test", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
}

GptConfig gpt_preset(const std::string& name, std::int64_t vocab_size) {
  GptConfig c;
  c.vocab_size = vocab_size;
  if (name == "gpt2-tiny") {
    c.n_layer = 2, c.n_head = 2, c.n_embd = 64, c.block_size = 64;
  } else if (name == "gpt2-small-test") {
    c.n_layer = 4, c.n_head = 4, c.n_embd = 128, c.block_size = 128;
  } else if (name == "gpt2") {
    c.n_layer = 12, c.n_head = 12, c.n_embd = 768, c.block_size = 1024;
  } else if (name == "gpt2-medium") {
    c.n_layer = 24, c.n_head = 16, c.n_embd = 1024, c.block_size = 1024;
  } else if (name == "gpt2-large") {
    c.n_layer = 36, c.n_head = 20, c.n_embd = 1280, c.block_size = 1024;
  } else if (name == "gpt2-xl") {
    c.n_layer = 48, c.n_head = 25, c.n_embd = 1600, c.block_size = 1024;
  } else {
    std::string known;
    for (const auto& n : gpt_preset_names()) known += (known.empty() ? "" : ", ") + n;
    ZERO_CHECK(false, "unknown model preset '", name, "': use one of ", known,
               "; for another shape, start from a preset and override it (zero-train and zero-estimate: "
               "--n-layer, --n-head, --n-embd, --block-size; in C++: the fields of GptConfig)");
  }
  return c;
}

CausalSelfAttention::CausalSelfAttention(const GptConfig& c) : n_head_(c.n_head) {
  ZERO_CHECK(c.n_embd % c.n_head == 0, "n_embd (", c.n_embd, ") must be a multiple of n_head (",
             c.n_head, ")");
  qkv_ = register_module("qkv", torch::nn::Linear(c.n_embd, 3 * c.n_embd));
  proj_ = register_module("proj", torch::nn::Linear(c.n_embd, c.n_embd));
}

at::Tensor CausalSelfAttention::forward(const at::Tensor& x) {
  const auto B = x.size(0), T = x.size(1), C = x.size(2);
  auto qkv = linear(qkv_, x).view({B, T, 3, n_head_, C / n_head_}).permute({2, 0, 3, 1, 4});
  at::Tensor y = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], /*attn_mask=*/{},
                                                  /*dropout_p=*/0.0, /*is_causal=*/true);
  return linear(proj_, y.transpose(1, 2).reshape({B, T, C}));
}

Block::Block(const GptConfig& c) {
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(c));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  fc_ = register_module("fc", torch::nn::Linear(c.n_embd, 4 * c.n_embd));
  proj_ = register_module("proj", torch::nn::Linear(4 * c.n_embd, c.n_embd));
}

std::pair<at::Tensor, at::Tensor> Block::forward_to_activation(const at::Tensor& x) {
  at::Tensor h = x + attn_->forward(ln1_->forward(x));
  at::Tensor a = at::gelu(linear(fc_, ln2_->forward(h)), "tanh");
  return {std::move(h), std::move(a)};
}

at::Tensor Block::forward(const at::Tensor& x) {
  auto [h, a] = forward_to_activation(x);
  return h + linear(proj_, a);
}

namespace {

// The backward of y = linear(a, w, b) without its forward: apply() gives an
// uninitialised tensor of y's shape and dtype (what at::linear would return
// under the autocast state in force), and backward computes what linear's
// backward does (addmm's with mat2 = w^T: grad_a = g w, grad_w = g^T a,
// contiguous, grad_b = the sum of g's rows, in y's dtype, each cast back to
// its input's dtype as autocast's casts do). For a recomputation whose output only feeds
// backward: the values of y are never read.
struct LinearBackwardOnly : torch::autograd::Function<LinearBackwardOnly> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a, const at::Tensor& w,
                            const at::Tensor& b) {
    const c10::DeviceType type = a.device().type();
    const at::ScalarType dtype =
        at::autocast::is_autocast_enabled(type) ? at::autocast::get_autocast_dtype(type) : a.scalar_type();
    ctx->save_for_backward({a, w, b});
    std::vector<std::int64_t> sizes = a.sizes().vec();
    sizes.back() = w.size(0);
    return at::empty(sizes, a.options().dtype(dtype));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& a = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& b = saved[2];
    const at::Tensor& g = grad_out[0];
    const at::ScalarType dt = g.scalar_type();
    const at::Tensor g2 = g.reshape({-1, g.size(-1)});
    const at::Tensor a2 = a.to(dt).reshape({-1, a.size(-1)});
    at::Tensor grad_a = g2.mm(w.to(dt)).view(a.sizes()).to(a.scalar_type());
    at::Tensor grad_w = g2.t().mm(a2).to(w.scalar_type());
    at::Tensor grad_b = b.defined() ? g2.sum(0).to(b.scalar_type()) : at::Tensor();
    return {grad_a, grad_w, grad_b};
  }
};

// Reentrant activation checkpoint of one block, as torch.utils.checkpoint
// with use_reentrant=True. Forward runs under no-grad (Function::apply turns
// grad mode off) and saves only the block's input; backward re-runs the block
// with grad on a detached copy of the input, up to the MLP's activation (the
// last linear and the residual add are not recomputed: their outputs feed
// nothing backward needs, as PyTorch's non-reentrant checkpoint stops early),
// and backpropagates through it with torch::autograd::backward. That inner
// backward accumulates the block's parameter gradients exactly as an
// ordinary backward does, so the post-accumulate-grad hooks the engine puts
// on them fire as usual. The block has no dropout or other randomness, so no
// RNG state needs restoring.
struct BlockCheckpoint : torch::autograd::Function<BlockCheckpoint> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, Block* block,
                            bool on_cpu) {
    // The block outlives the graph (the model owns it); kept as an integer
    // because saved_data holds IValues.
    ctx->saved_data["block"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(block));
    ctx->saved_data["on_cpu"] = on_cpu;
    // The recomputation must run in the precision the forward ran in: the
    // autocast state of the input's device type (torch.utils.checkpoint
    // saves and restores it too). Without it a bf16-autocast forward was
    // recomputed in fp32 in backward: other gradients, and on an H100 a
    // 1.21B GPT's checkpointed backward took 1.30 s instead of 0.14 s.
    const c10::DeviceType type = x.device().type();
    ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(type);
    ctx->saved_data["autocast_dtype"] = at::autocast::get_autocast_dtype(type);
    if (on_cpu) {
      ctx->saved_data["device"] = x.device();
      ctx->saved_data["input"] = x.to(at::kCPU);
    } else {
      ctx->save_for_backward({x});
    }
    return block->forward(x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto* block = reinterpret_cast<Block*>(static_cast<std::intptr_t>(ctx->saved_data["block"].toInt()));
    at::Tensor x = ctx->saved_data["on_cpu"].toBool()
                       ? ctx->saved_data["input"].toTensor().to(ctx->saved_data["device"].toDevice())
                       : ctx->get_saved_variables()[0];
    at::Tensor input = x.detach().requires_grad_(true);
    at::Tensor h, proj;
    {
      at::AutoGradMode grad_on(true);
      // As the forward being recomputed had it.
      AutocastScope autocast(input.device().type(), ctx->saved_data["autocast"].toBool(),
                             ctx->saved_data["autocast_dtype"].toScalarType());
      at::Tensor a;
      std::tie(h, a) = block->forward_to_activation(input);
      const torch::nn::Linear& p = block->mlp_proj();
      proj = LinearBackwardOnly::apply(a, p->weight, p->bias);
    }
    // The block's output is h + proj: the gradient reaches both (cast to
    // proj's dtype, as the add's backward casts it).
    const at::Tensor& g = grad_out[0];
    torch::autograd::backward({h, proj}, {g, g.to(proj.scalar_type())});
    return {input.grad(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

Gpt::Gpt(const GptConfig& c, bool on_meta) : config_(c) {
  ZERO_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0,
             "GPT dimensions must be positive: vocab ", c.vocab_size, ", block_size ", c.block_size,
             ", n_layer ", c.n_layer, ", n_head ", c.n_head, ", n_embd ", c.n_embd);
  // On meta, each submodule gives its memory back as soon as it is built:
  // the host never holds more than one block.
  auto settle = [&](torch::nn::Module& m) {
    if (on_meta) zero::to_meta(m);
  };
  wte_ = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
  settle(*wte_);
  wpe_ = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
  settle(*wpe_);
  for (std::int64_t i = 0; i < c.n_layer; ++i) {
    blocks_.push_back(register_module("h" + std::to_string(i), std::make_shared<Block>(c)));
    settle(*blocks_.back());
    zero::mark_unit(*blocks_.back());  // a unit of ZeRO stage 3 (forward() calls it through zero::unit)
  }
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  settle(*ln_f_);
  // One draw from the global generator seeds every parameter's own (by its
  // name): the values do not depend on the order the parameters are filled
  // in, which an engine filling a meta-built model bucket by bucket chooses.
  init_seed_ = at::randint(std::int64_t{1} << 62, {1}, at::TensorOptions().dtype(at::kLong)).item<std::int64_t>();
  if (on_meta) return;
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters()) init_parameter(item.key(), item.value());
}

void Gpt::init_parameter(const std::string& name, const at::Tensor& value) const {
  ZERO_CHECK(!value.is_meta(), "Gpt::init_parameter('", name, "'): the value is on the meta device; give it a "
             "tensor with memory");
  torch::NoGradGuard no_grad;
  const bool ln = name.rfind("ln", 0) == 0 || name.find(".ln") != std::string::npos;
  if (value.dim() == 2) {
    const bool residual = name.find("proj.weight") != std::string::npos;
    at::Tensor host = value.is_cpu() ? value : at::empty(value.sizes(), value.options().device(at::kCPU));
    std::uint64_t seed = 14695981039346656037ull ^ static_cast<std::uint64_t>(init_seed_);  // FNV-1a over the name
    for (const char ch : name) seed = (seed ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
    host.normal_(0.0, residual ? 0.02 / std::sqrt(2.0 * config_.n_layer) : 0.02,
                 at::make_generator<at::CPUGeneratorImpl>(seed));
    if (!value.is_cpu()) value.copy_(host);
  } else if (ln && name.size() >= 7 && name.compare(name.size() - 7, 7, ".weight") == 0) {
    value.fill_(1.0);  // LayerNorm gain
  } else {
    value.zero_();  // biases (LayerNorm's too)
  }
}

at::Tensor Gpt::forward(const at::Tensor& idx) {
  const auto T = idx.size(1);
  ZERO_CHECK(T <= config_.block_size, "sequence of ", T, " tokens is longer than the model's block_size ",
             config_.block_size, ": use a shorter --seq-len or a model with a larger block_size");
  at::Tensor pos = at::arange(T, idx.options());
  at::Tensor x = wte_->forward(idx) + wpe_->forward(pos);
  // Checkpointing only pays when a backward follows (not in evaluation or
  // generation under no-grad).
  const bool checkpoint = config_.checkpoint_activations && at::GradMode::is_enabled() && x.requires_grad();
  for (auto& b : blocks_) {
    // Each block is a unit of ZeRO stage 3 (zero/zero/unit.h): a plain call
    // unless a stage-3 engine handles it. The checkpoint is inside the unit,
    // so its recomputation runs while the unit is gathered for backward.
    x = zero::unit(*b, x, [&](const at::Tensor& in) {
      return checkpoint ? BlockCheckpoint::apply(in, b.get(), config_.checkpoint_on_cpu) : b->forward(in);
    });
  }
  return ln_f_->forward(x).matmul(wte_->weight.t());  // tied head
}

void Gpt::set_activation_checkpointing(bool enabled, bool on_cpu) {
  config_.checkpoint_activations = enabled;
  config_.checkpoint_on_cpu = on_cpu;
}

at::Tensor Gpt::loss(const at::Tensor& idx, const at::Tensor& targets) {
  at::Tensor logits = forward(idx);
  return at::cross_entropy_loss(logits.to(at::kFloat).reshape({-1, config_.vocab_size}),
                                targets.reshape({-1}));
}

}  // namespace zero::models
