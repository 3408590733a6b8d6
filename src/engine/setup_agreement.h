// Ranks built alike: before the engine allocates anything, every rank checks
// that the others were given the same config and the same model (parameter
// names, order, shapes, dtypes, which are trainable). A rank built
// differently otherwise trains silently wrong (its own learning rate or
// optimizer on its partition, rank 0's values broadcast into another layer)
// or meets a collective of another size, which MPI does not detect and which
// corrupts memory. One short exchange when the ranks agree (two checksums);
// the first difference is named when they do not. (A rank whose own checks
// refused its module earlier, such as a trainable parameter that is not
// fp32, never gets here: the others wait until comm_timeout.) Private to
// zero_engine.
#pragma once

#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include "zero/comm/communicator.h"

namespace zero::detail {

// The config as the ranks must share it: to_json's form without the keys
// that may differ per node (NVMe paths, pinning, thread and I/O settings,
// printing, the flight recorder's folder, the seed).
nlohmann::json shared_config_json(const nlohmann::json& config);

// One line per parameter of the module, in its order:
// "name [d0, d1] Float trainable" (or "frozen").
std::vector<std::string> parameter_lines(torch::nn::Module& module);

// Where two configs first differ ("optimizer.params.lr: 0.001 on rank 0,
// 0.002 on rank 1"), "" when they do not.
std::string first_config_difference(const nlohmann::json& rank0, const nlohmann::json& other, int other_rank);

// Throws zero::Error on every rank, naming the first rank that differs from
// rank 0 and how, when any does. Collective.
void agree_on_setup(comm::Communicator& comm, const c10::Device& device, const nlohmann::json& config,
                    const std::vector<std::string>& params);

}  // namespace zero::detail
