#include "init_weights.h"

#include <set>
#include <vector>

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "zero/core/error.h"
#include "zero/core/text_list.h"

namespace zero::train {

namespace {

std::optional<at::ScalarType> float_dtype(const std::string& dtype) {
  if (dtype == "F32") return at::kFloat;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "F16") return at::kHalf;
  if (dtype == "F64") return at::kDouble;
  return std::nullopt;
}

std::string shape_text(at::IntArrayRef shape) {
  std::string t = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
  return t + "]";
}

}  // namespace

std::shared_ptr<const ckpt::SafetensorsReader> open_init_weights(const std::string& path,
                                                                 const torch::nn::Module& model) {
  std::shared_ptr<const ckpt::SafetensorsReader> w;
  try {
    w = std::make_shared<const ckpt::SafetensorsReader>(path);
  } catch (const Error& e) {
    throw Error(std::string("--init-from: ") + e.what());
  }
  std::vector<std::string> problems;
  std::set<std::string> names;
  std::size_t count = 0;
  for (const auto& p : model.named_parameters()) {
    ++count;
    names.insert(p.key());
    const ckpt::SafetensorsEntry* e = w->find(p.key());
    if (e == nullptr) {
      problems.push_back("'" + p.key() + "' is not in the file");
    } else if (!float_dtype(e->dtype)) {
      problems.push_back("'" + p.key() + "' is " + e->dtype + " there, not a floating type");
    } else if (at::IntArrayRef(e->shape) != p.value().sizes()) {
      problems.push_back("'" + p.key() + "' is " + shape_text(e->shape) + " there, " + shape_text(p.value().sizes()) +
                         " here");
    }
  }
  for (const auto& b : model.named_buffers()) names.insert(b.key());
  for (const ckpt::SafetensorsEntry& e : w->entries()) {
    if (names.count(e.name) == 0) problems.push_back("'" + e.name + "' is no parameter of this model");
  }
  if (!problems.empty()) {
    ZERO_CHECK(false, "--init-from ", path, " does not fit this model (", count, " parameters): ",
               zero::detail::join_first(problems, 4, "; "),
               ". Give the weights of a model of this shape (zero-ckpt consolidate of a checkpoint trained with "
               "the same --model and --n-layer/--n-head/--n-embd/--block-size), or the options of the model they "
               "are of");
  }
  return w;
}

std::string describe_init_weights(const ckpt::SafetensorsReader& weights, const torch::nn::Module& model) {
  std::int64_t elements = 0;
  std::size_t tensors = 0;
  for (const auto& p : model.named_parameters()) {
    elements += p.value().numel();
    ++tensors;
  }
  std::string text = "init: the weights of " + weights.path().string() + " (" + std::to_string(tensors) +
                     " parameters, " + std::to_string(elements) + " elements";
  const auto tag = weights.metadata().find("zerocpp_tag");  // zero-ckpt consolidate's
  if (tag != weights.metadata().end()) text += "; consolidated from checkpoint " + tag->second;
  return text + "); the optimizer, the schedule and the step start fresh";
}

bool fill_from_weights(const ckpt::SafetensorsReader& weights, const std::string& name, const at::Tensor& value) {
  const ckpt::SafetensorsEntry* e = weights.find(name);
  if (e == nullptr) return false;
  const auto dtype = float_dtype(e->dtype);
  ZERO_CHECK(dtype && at::IntArrayRef(e->shape) == value.sizes(), "--init-from ", weights.path().string(), ": '",
             name, "' is ", e->dtype, " ", shape_text(e->shape), ", the model's ", shape_text(value.sizes()));
  torch::NoGradGuard no_grad;
  at::Tensor host = at::empty(e->shape, at::TensorOptions().dtype(*dtype));
  weights.read(*e, host.data_ptr());
  value.copy_(host);
  return true;
}

}  // namespace zero::train
