// One engine per parameter: a ParamClaim holds the trainable parameters of
// one Engine (by TensorImpl) for as long as it lives, and refuses a second
// live engine on any of them (on the same module, or on a part of it), which
// would otherwise adopt the first engine's flat views (at stage 3 their
// hollow [0] shapes) and break both. Private to zero_engine.
#pragma once

#include <string>
#include <vector>

#include <ATen/Tensor.h>

namespace zero::detail {

class ParamClaim {
 public:
  ParamClaim() = default;
  // Throws, naming the first parameter that a live engine holds; then
  // nothing is claimed.
  ParamClaim(const std::vector<at::Tensor>& params, const std::vector<std::string>& names);
  ~ParamClaim();
  ParamClaim(ParamClaim&& other) noexcept : held_(std::move(other.held_)) { other.held_.clear(); }
  ParamClaim& operator=(ParamClaim&& other) noexcept;
  ParamClaim(const ParamClaim&) = delete;
  ParamClaim& operator=(const ParamClaim&) = delete;

 private:
  void release() noexcept;
  std::vector<const void*> held_;
};

}  // namespace zero::detail
