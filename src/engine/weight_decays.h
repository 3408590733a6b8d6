// Each trainable parameter's weight decay under EngineOptions::weight_decay
// (zero/engine/weight_decay.h), checked, and the line that tells the user.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "zero/engine/weight_decay.h"

namespace zero::detail {

// The decay of each of `params` (named `names`) under `rule`, `fallback`
// (the config's) where it gives none. Throws naming the parameter when a
// rule gives a negative or non-finite decay. Empty when no rule is given.
std::vector<float> weight_decays(const WeightDecayRule& rule, const std::vector<std::string>& names,
                                 const std::vector<at::Tensor>& params, float fallback);

// "weight decay 0.1 on 50 parameters (124.3M elements), 0 on 98 (121.3K
// elements)": the decays, largest first, with how many parameters and
// elements take each.
std::string describe_weight_decays(const std::vector<float>& decays, const std::vector<std::size_t>& numels);

}  // namespace zero::detail
