// LibTorch's autocast state of one device type, set for a scope and restored
// after it: what Python's `with torch.autocast(device_type, dtype, enabled)`
// does, for C++ training loops and for the GPT's checkpoint recomputation.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace zero::models {

class AutocastScope {
 public:
  AutocastScope(c10::DeviceType type, bool enabled, at::ScalarType dtype)
      : type_(type),
        prev_enabled_(at::autocast::is_autocast_enabled(type)),
        prev_dtype_(at::autocast::get_autocast_dtype(type)) {
    at::autocast::set_autocast_enabled(type_, enabled);
    at::autocast::set_autocast_dtype(type_, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    // Leaving the outermost region drops the cached casts of the weights.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, prev_enabled_);
    at::autocast::set_autocast_dtype(type_, prev_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType type_;
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
};

}  // namespace zero::models
