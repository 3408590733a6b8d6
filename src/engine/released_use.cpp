#include "released_use.h"

#include <unordered_map>
#include <unordered_set>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

namespace zero::detail {

std::string released_use_message(const std::string& name, std::int64_t numel) {
  return "parameter '" + name + "' (" + std::to_string(numel) +
         " elements) was used while released: at stage 3 a parameter is hollow (shape [0]) outside the "
         "zero::unit that holds it, so a use of it there (a loss term such as a hand-written weight decay, a "
         "tied output head applied outside the unit) reads nothing and differentiates nothing. Use it inside "
         "its unit's function, or inside engine.gather_parameters() (docs/engine.md)";
}

std::vector<int> params_used_while_released(const at::Tensor& loss, const std::vector<at::Tensor>& params,
                                            const std::vector<std::size_t>& numels) {
  std::vector<int> found;
  if (!loss.defined() || !loss.grad_fn()) return found;
  std::unordered_map<const void*, int> index;
  for (std::size_t i = 0; i < params.size(); ++i) index.emplace(params[i].unsafeGetTensorImpl(), static_cast<int>(i));
  std::unordered_set<const torch::autograd::Node*> seen;
  std::unordered_set<int> named;
  std::vector<torch::autograd::Node*> stack{loss.grad_fn().get()};
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(node)) {
      const auto it = index.find(acc->variable.unsafeGetTensorImpl());
      if (it != index.end() && acc->num_inputs() == 1 && numels[static_cast<std::size_t>(it->second)] > 0) {
        std::int64_t expected = 1;
        for (const c10::SymInt& d : acc->input_metadata(0).shape_as_dim_vector()) expected *= d.guard_int(__FILE__, __LINE__);
        if (expected == 0 && named.insert(it->second).second) found.push_back(it->second);
      }
    }
    for (const torch::autograd::Edge& e : node->next_edges()) stack.push_back(e.function.get());
  }
  return found;
}

}  // namespace zero::detail
