// A stage-3 parameter used where it is released: outside the zero::unit
// that holds it, a unit's parameter is hollow (shape [0]), so a use there (a
// loss term such as a hand-written weight decay, a tied output head applied
// outside the unit) reads nothing and differentiates nothing. Autograd then
// fails with words about shapes ("returned an invalid gradient … expected
// shape compatible with [0]"), or the parameter's gradient arrives with no
// element and fails in the reducer: after such a failure, Engine::backward
// names the parameter and the cause instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

namespace zero::detail {

// The error for parameter `name` (`numel` elements), used while released.
std::string released_use_message(const std::string& name, std::int64_t numel);

// The parameters (indices into `params`) whose gradient accumulator in the
// graph of `loss` was made while they were hollow: the shape it expects has
// no element, the parameter has `numels[i]`. Walks the graph (after a
// failed backward: its structure is still there).
std::vector<int> params_used_while_released(const at::Tensor& loss, const std::vector<at::Tensor>& params,
                                            const std::vector<std::size_t>& numels);

}  // namespace zero::detail
