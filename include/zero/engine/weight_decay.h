// Weight decay per parameter: what PyTorch's param groups with weight
// decays of their own are used for. GPT training (GPT-2, nanoGPT,
// Megatron-LM, Hugging Face's Trainer) decays the weight matrices and
// embeddings and leaves biases and the gains of LayerNorm undecayed.
//
//   zero::EngineOptions options;
//   options.weight_decay = zero::no_decay_below_2d();   // biases, norms: 0
//   zero::Engine engine(model, config, comm, std::move(options));
//
// A rule is asked once per trainable parameter, when the engine is built,
// with the parameter's name (as named_parameters() gives it; a tied one by
// its first name) and the parameter (its shape is right; its values may be
// on the meta device). It returns that parameter's weight decay, or
// std::nullopt for the config's optimizer.params.weight_decay. The decay is
// applied as the optimizer applies the config's (decoupled in AdamW, L2 in
// Adam with adam_w_mode false and in Adagrad).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

namespace zero {

using WeightDecayRule = std::function<std::optional<float>(const std::string& name, const at::Tensor& param)>;

// No weight decay on parameters of fewer than two dimensions (biases, norm
// gains and shifts); the config's on the rest (nanoGPT's rule).
WeightDecayRule no_decay_below_2d();

// No weight decay on parameters whose name contains one of `parts` (Hugging
// Face's {"bias", "LayerNorm.weight"}); the config's on the rest.
WeightDecayRule no_decay_named(std::vector<std::string> parts);

}  // namespace zero
