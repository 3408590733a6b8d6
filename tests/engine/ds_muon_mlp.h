// The MLP of DeepSpeed's Muon run (tests/support/deepspeed_muon.py): the
// parameter names decide DeepSpeed's halves (embed and lm_head take Adam).
#pragma once

#include <ATen/ops/tanh.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include "../support/deepspeed_muon.h"

namespace zero::test {

struct DsMuonMlp : torch::nn::Module {
  DsMuonMlp() {
    namespace ds = deepspeed_muon;
    embed = register_module("embed", torch::nn::Linear(torch::nn::LinearOptions(ds::kIn, ds::kEmbed).bias(false)));
    fc1 = register_module("fc1", torch::nn::Linear(ds::kEmbed, ds::kHidden));
    fc2 = register_module("fc2", torch::nn::Linear(ds::kHidden, ds::kEmbed));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(ds::kEmbed, ds::kOut).bias(false)));
  }
  at::Tensor forward(const at::Tensor& x) { return lm_head(at::tanh(fc2(at::tanh(fc1(embed(x)))))); }
  torch::nn::Linear embed{nullptr}, fc1{nullptr}, fc2{nullptr}, lm_head{nullptr};
};

}  // namespace zero::test
