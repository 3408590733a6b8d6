// Each trainable parameter's own optimizer settings under EngineOptions'
// rules (zero/engine/param_rules.h), checked, and the lines that tell the
// user.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "zero/engine/param_rules.h"

namespace zero::detail {

struct ParamHyper {
  float weight_decay = 0.0f;
  float lr_scale = 1.0f;
  bool operator==(const ParamHyper&) const = default;
};

struct ParamHypers {
  std::vector<ParamHyper> classes;  // the distinct settings, in the order first met
  std::vector<int> of_param;        // each parameter's class; empty: no rule given
  bool empty() const { return of_param.empty(); }
};

// The settings of each of `params` (named `names`) under the rules, the
// config's weight decay and a scale of 1 where a rule gives none. Throws
// naming the parameter when a rule gives a negative or non-finite value.
// Empty when neither rule is given.
ParamHypers resolve_param_hypers(const WeightDecayRule& weight_decay, const LrScaleRule& lr_scale,
                                 const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                                 float config_weight_decay);

// "weight decay 0.1 on 50 parameters (124.3M elements), 0 on 98 (121.3K
// elements)" for a weight-decay rule, "lr scale 10 on 2 parameters (...), 1
// on 146 (...)" for an lr rule, largest first, joined by "; ".
std::string describe_param_hypers(const ParamHypers& hypers, const std::vector<std::size_t>& numels,
                                  bool weight_decay_rule, bool lr_scale_rule);

}  // namespace zero::detail
