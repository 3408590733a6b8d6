// What the fused optimizer kernels share (included by fused_adam_kernel.cu
// and fused_lion_kernel.cu only): device-side reads of a gradient of any
// GradKind as fp32 and rounded writes of the half copy, their grid, and the
// dispatch from the run-time kinds to a kernel's template.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernel_dtypes.h"

namespace zero::cuda::detail {

// Ports of zero/core/half.h, exact to the bit (NaN payloads included).
__device__ __forceinline__ float bf16_to_float(std::uint16_t h) {
  return __uint_as_float(static_cast<std::uint32_t>(h) << 16);
}

__device__ __forceinline__ std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet the NaN
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<std::uint16_t>(u >> 16);
}

__device__ __forceinline__ float fp16_to_float(std::uint16_t h) {
  const std::uint32_t w = static_cast<std::uint32_t>(h) << 16;
  const std::uint32_t sign = w & 0x80000000u;
  const std::uint32_t two_w = w + w;
  const std::uint32_t exp_offset = 0xE0u << 23;
  const float normalized = __fmul_rn(__uint_as_float((two_w >> 4) + exp_offset), 0x1.0p-112f);
  const float denormalized = __fsub_rn(__uint_as_float((two_w >> 17) | (126u << 23)), 0.5f);
  const std::uint32_t denormalized_cutoff = 1u << 27;
  return __uint_as_float(sign | (two_w < denormalized_cutoff ? __float_as_uint(denormalized)
                                                             : __float_as_uint(normalized)));
}

__device__ __forceinline__ std::uint16_t float_to_fp16(float f) {
  // The float unit rounds (to nearest even) in the __fadd_rn below.
  float base = __fmul_rn(__fmul_rn(fabsf(f), 0x1.0p+112f), 0x1.0p-110f);
  const std::uint32_t w = __float_as_uint(f);
  const std::uint32_t shl1_w = w + w;
  const std::uint32_t sign = w & 0x80000000u;
  std::uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = __fadd_rn(__uint_as_float((bias >> 1) + 0x07800000u), base);
  const std::uint32_t bits = __float_as_uint(base);
  const std::uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const std::uint32_t mantissa_bits = bits & 0x00000FFFu;
  const std::uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<std::uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

template <GradKind kGrad>
__device__ __forceinline__ float load_grad(const void* grads, std::size_t i) {
  if constexpr (kGrad == GradKind::kFloat32) {
    return static_cast<const float*>(grads)[i];
  } else if constexpr (kGrad == GradKind::kBFloat16) {
    return bf16_to_float(static_cast<const std::uint16_t*>(grads)[i]);
  } else {
    return fp16_to_float(static_cast<const std::uint16_t*>(grads)[i]);
  }
}

template <HalfOutKind kHalf>
__device__ __forceinline__ void store_half(void* out, std::size_t i, float p) {
  if constexpr (kHalf == HalfOutKind::kBFloat16) {
    static_cast<std::uint16_t*>(out)[i] = float_to_bf16(p);
  } else if constexpr (kHalf == HalfOutKind::kFloat16) {
    static_cast<std::uint16_t*>(out)[i] = float_to_fp16(p);
  }
}

// One element per thread in a grid-stride loop, kFusedThreads to a block;
// past kFusedMaxBlocks (more than an H100 holds at once, 132 SMs x 8 blocks
// of 256, many times over) the loop strides: the cap only bounds gridDim.
constexpr int kFusedThreads = 256;
constexpr std::size_t kFusedMaxBlocks = 1u << 16;

inline unsigned fused_blocks(std::size_t n) {
  const std::size_t blocks = (n + kFusedThreads - 1) / kFusedThreads;
  return static_cast<unsigned>(blocks < kFusedMaxBlocks ? blocks : kFusedMaxBlocks);
}

// Calls launch(grad, half) with the run-time kinds as
// std::integral_constant<GradKind, ...> and std::integral_constant<HalfOutKind, ...>,
// so that it can name the kernel's template for them.
template <class Launch>
void dispatch_kinds(GradKind grad, HalfOutKind half, Launch&& launch) {
  const auto with_half = [&](auto g) {
    switch (half) {
      case HalfOutKind::kNone: return launch(g, std::integral_constant<HalfOutKind, HalfOutKind::kNone>{});
      case HalfOutKind::kBFloat16: return launch(g, std::integral_constant<HalfOutKind, HalfOutKind::kBFloat16>{});
      case HalfOutKind::kFloat16: return launch(g, std::integral_constant<HalfOutKind, HalfOutKind::kFloat16>{});
    }
  };
  switch (grad) {
    case GradKind::kFloat32: return with_half(std::integral_constant<GradKind, GradKind::kFloat32>{});
    case GradKind::kBFloat16: return with_half(std::integral_constant<GradKind, GradKind::kBFloat16>{});
    case GradKind::kFloat16: return with_half(std::integral_constant<GradKind, GradKind::kFloat16>{});
  }
}

}  // namespace zero::cuda::detail
