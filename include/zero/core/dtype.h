// Element types of the flat buffers zerocpp moves and updates. The lower
// layers (comm/, optim/) work on raw memory plus one of these tags, so they
// need no LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zero {

enum class DType : std::uint8_t { kFloat32, kBFloat16, kFloat16 };

constexpr std::size_t element_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "fp32";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
  }
  return "?";
}

}  // namespace zero
