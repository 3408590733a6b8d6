// Per-parameter optimizer settings: what PyTorch's param groups with
// options of their own are used for. GPT training (GPT-2, nanoGPT,
// Megatron-LM, Hugging Face's Trainer) decays the weight matrices and
// embeddings and leaves biases and the gains of LayerNorm undecayed;
// fine-tuning trains a new head faster than the body, or each layer at a
// rate that decays with its depth (layer-wise lr decay).
//
//   zero::EngineOptions options;
//   options.weight_decay = zero::no_decay_below_2d();   // biases, norms: 0
//   options.lr_scale = [](const std::string& name, const at::Tensor&) -> std::optional<float> {
//     if (name.rfind("head.", 0) == 0) return 10.0f;     // the head at 10x the rate
//     return std::nullopt;
//   };
//   zero::Engine engine(model, config, comm, std::move(options));
//
// A rule is asked once per trainable parameter, when the engine is built,
// with the parameter's name (as named_parameters() gives it; a tied one by
// its first name) and the parameter (its shape is right; its values may be
// on the meta device). It returns that parameter's setting, or std::nullopt
// for the default.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

namespace zero {

using ParamRule = std::function<std::optional<float>(const std::string& name, const at::Tensor& param)>;

// A parameter's weight decay (std::nullopt: the config's
// optimizer.params.weight_decay), applied as the optimizer applies the
// config's: decoupled in AdamW and Lion, L2 in Adam with adam_w_mode false
// and in Adagrad. A finite number >= 0.
using WeightDecayRule = ParamRule;

// A parameter's learning rate as a multiple of the engine's (std::nullopt:
// 1): each step it takes lr() times its scale, so a schedule keeps the
// ratios, as torch's LambdaLR does with groups of different initial rates.
// A finite number >= 0.
using LrScaleRule = ParamRule;

// Whether a parameter steps with Muon (optimizer.type "Muon", DeepSpeed's
// MuonWithAuxAdam) or with its Adam half; only a parameter of two or more
// dimensions can take Muon (one of more is orthogonalized as
// [size(0), the rest]).
using MuonRule = std::function<std::optional<bool>(const std::string& name, const at::Tensor& param)>;

// DeepSpeed's choice (deepspeed.initialize's set_optimizer_flags): Muon for
// the parameters of two or more dimensions whose name holds neither
// "embed" nor "lm_head" (in any case), Adam for the rest. What the engine
// takes where EngineOptions::use_muon is not given, or gives std::nullopt.
bool muon_by_default(const std::string& name, const at::Tensor& param);

// Muon for the parameters of two or more dimensions whose name holds none
// of `parts` (as written), Adam for the rest: for a model whose embeddings
// and output head have other names (zero::models::Gpt: {"wte", "wpe"}, its
// head being wte).
MuonRule muon_except_named(std::vector<std::string> parts);

// No weight decay on parameters of fewer than two dimensions (biases, norm
// gains and shifts); the config's on the rest (nanoGPT's rule).
WeightDecayRule no_decay_below_2d();

// No weight decay on parameters whose name contains one of `parts` (Hugging
// Face's {"bias", "LayerNorm.weight"}); the config's on the rest.
WeightDecayRule no_decay_named(std::vector<std::string> parts);

}  // namespace zero
