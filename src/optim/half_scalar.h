// One element at a time: reading a grad of any dtype as fp32 and writing the
// rounded half copy. Used by the scalar references.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/core/dtype.h"
#include "zero/core/half.h"

namespace zero::optim::detail {

inline float load_as_float(const void* base, DType type, std::size_t i) {
  switch (type) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kBFloat16: return bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::kFloat16: return fp16_to_float(static_cast<const std::uint16_t*>(base)[i]);
  }
  return 0.0f;
}

inline void store_from_float(void* base, DType type, std::size_t i, float value) {
  switch (type) {
    case DType::kFloat32: static_cast<float*>(base)[i] = value; return;
    case DType::kBFloat16: static_cast<std::uint16_t*>(base)[i] = float_to_bf16(value); return;
    case DType::kFloat16: static_cast<std::uint16_t*>(base)[i] = float_to_fp16(value); return;
  }
}

}  // namespace zero::optim::detail
