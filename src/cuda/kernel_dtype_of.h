// zerocpp's DType as the fused kernels' plain enums (kernel_dtypes.h), for
// the C++ side of their launchers (device_adam.cpp, device_lion.cpp).
#pragma once

#include "kernel_dtypes.h"
#include "zero/core/dtype.h"

namespace zero::cuda::detail {

inline GradKind grad_kind(DType t) {
  switch (t) {
    case DType::kFloat32: return GradKind::kFloat32;
    case DType::kBFloat16: return GradKind::kBFloat16;
    case DType::kFloat16: return GradKind::kFloat16;
  }
  return GradKind::kFloat32;
}

inline HalfOutKind half_kind(const void* half_out, DType t) {
  if (half_out == nullptr) return HalfOutKind::kNone;
  return t == DType::kFloat16 ? HalfOutKind::kFloat16 : HalfOutKind::kBFloat16;
}

}  // namespace zero::cuda::detail
