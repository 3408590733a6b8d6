// Each trainable parameter's own optimizer settings under EngineOptions'
// rules (zero/engine/param_rules.h), checked, and the lines that tell the
// user.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "zero/comm/communicator.h"
#include "zero/engine/param_rules.h"

namespace zero::detail {

struct ParamHyper {
  float weight_decay = 0.0f;
  float lr_scale = 1.0f;
  // 1: the parameter steps with Muon (optimizer.type "Muon"); an int, not a
  // bool, so that the struct has no padding (the ranks compare its bytes).
  std::int32_t muon = 0;
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
// use_muon: nullptr unless the optimizer is Muon (then each parameter's
// half, by the rule, or muon_by_default where it gives none or is empty;
// throws naming a parameter of fewer than two dimensions given Muon).
// Empty when no rule is given and the optimizer is not Muon.
ParamHypers resolve_param_hypers(const WeightDecayRule& weight_decay, const LrScaleRule& lr_scale,
                                 const MuonRule* use_muon, const std::vector<std::string>& names,
                                 const std::vector<at::Tensor>& params, float config_weight_decay);

// "weight decay 0.1 on 50 parameters (124.3M elements), 0 on 98 (121.3K
// elements)" for a weight-decay rule, "lr scale 10 on 2 parameters (...), 1
// on 146 (...)" for an lr rule, largest first, joined by "; ".
std::string describe_param_hypers(const ParamHypers& hypers, const std::vector<std::size_t>& numels,
                                  bool weight_decay_rule, bool lr_scale_rule);

// "Muon on 48 matrices (84.9M elements) at lr x 1, Adam on 100 parameters
// (39.5M elements) at lr x 0.015": the halves of optimizer "Muon" and their
// shares of the rate.
std::string describe_muon_halves(const ParamHypers& hypers, const std::vector<std::size_t>& numels, float muon_scale,
                                 float adam_scale);

// Every rank's rules gave the same settings (a rule must answer from the
// name and the shape alone; one that draws on the rank, a clock or a random
// number would train each replica or partition differently), and none
// failed (`error`: this rank's rule's, "" for none): throws on every rank,
// its own error where a rule failed, the failing rank's elsewhere, or
// naming the first rank whose settings differ from rank 0's (also where
// one rank gave rules and another none). Collective: every rank calls it,
// with or without rules.
void agree_on_param_hypers(comm::Communicator& comm, const c10::Device& device, const ParamHypers& hypers,
                           const std::string& error, const std::vector<std::size_t>& numels);

// `v` in the fewest digits that read back as the same float ("0.01").
std::string shortest(float v);

// A load's check of the settings a checkpoint recorded per parameter
// (saved[i]: parameter i's, in this engine's order; nullopt where it
// recorded none) against this engine's (`mine`; empty: no rules, so the
// config's decay and a scale of 1). A warning naming how many parameters
// differ and the first of them, and what to do; "" when they agree (or
// neither side has per-parameter settings).
std::string compare_saved_param_hypers(const std::vector<std::optional<ParamHyper>>& saved, const ParamHypers& mine,
                                       const std::vector<std::string>& names, float config_weight_decay,
                                       const std::string& where);

}  // namespace zero::detail
