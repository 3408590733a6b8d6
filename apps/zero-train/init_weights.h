// zero-train --init-from: a new run that starts from the weights of a
// safetensors file (what `zero-ckpt consolidate` writes from a checkpoint:
// each parameter's fp32 master values under the module's names) instead of
// GPT-2's initialisation. The optimizer, the schedule and the step start
// fresh: fine-tuning, or going on with another optimizer than the one a
// checkpoint holds state for. The file is checked against the model before
// anything is built; the engine then fills each parameter from it through
// EngineOptions::init, bucket by bucket (at stage 3 each rank keeps only its
// partition), so the whole model is never held twice.
#pragma once

#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "zero/ckpt/safetensors_reader.h"

namespace zero::train {

// Opens `path` and checks that it holds every parameter of `model` (built
// on the meta device: names and shapes) in a floating dtype, and nothing
// that is neither a parameter nor a buffer of it; a zero::Error lists what
// does not fit.
std::shared_ptr<const ckpt::SafetensorsReader> open_init_weights(const std::string& path,
                                                                 const torch::nn::Module& model);

// "init: the weights of w.safetensors (28 tensors, 0.12M parameters ...)".
std::string describe_init_weights(const ckpt::SafetensorsReader& weights, const torch::nn::Module& model);

// Fills `value` (the parameter's shape, any dtype and device) with tensor
// `name` of the file, converted; false when the file has no such tensor.
bool fill_from_weights(const ckpt::SafetensorsReader& weights, const std::string& name, const at::Tensor& value);

}  // namespace zero::train
