// Mapping between LibTorch scalar types and zerocpp's DType.
#pragma once

#include <c10/core/ScalarType.h>

#include "zero/core/dtype.h"
#include "zero/core/error.h"

namespace zero {

inline DType to_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return DType::kFloat32;
    case c10::ScalarType::BFloat16: return DType::kBFloat16;
    case c10::ScalarType::Half: return DType::kFloat16;
    default: break;
  }
  ZERO_CHECK(false, "unsupported tensor dtype ", c10::toString(t),
             ": zerocpp trains fp32, bf16 or fp16 parameters");
  return DType::kFloat32;
}

inline c10::ScalarType to_scalar_type(DType t) {
  switch (t) {
    case DType::kFloat32: return c10::ScalarType::Float;
    case DType::kBFloat16: return c10::ScalarType::BFloat16;
    case DType::kFloat16: return c10::ScalarType::Half;
  }
  return c10::ScalarType::Float;
}

}  // namespace zero
