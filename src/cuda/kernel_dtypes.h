// The element types the fused device kernels take, as plain enums: shared
// by the launchers' headers (fused_adam_kernel.h, fused_lion_kernel.h), which
// nvcc compiles in C++17 with no other zerocpp include.
#pragma once

namespace zero::cuda::detail {

enum class GradKind : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };
enum class HalfOutKind : int { kNone = 0, kBFloat16 = 1, kFloat16 = 2 };

}  // namespace zero::cuda::detail
