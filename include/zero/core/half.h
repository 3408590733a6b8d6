// Scalar conversions between fp32 and the two 16-bit float formats.
//
// Both narrowing conversions round to nearest, ties to even, and keep NaN a
// NaN (a quiet NaN with the input's sign); overflow goes to +-inf as IEEE
// says. These are the reference the SIMD paths are tested against. They rely
// on the default floating-point environment: never build with -ffast-math.
#pragma once

#include <cstdint>
#include <cstring>

namespace zero {

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bf16 is the top half of an fp32: widening is a shift.
inline float bf16_to_float(std::uint16_t h) { return float_from_bits(std::uint32_t{h} << 16); }

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet the NaN
  }
  // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// IEEE binary16 <-> binary32, after the branch-free method of M. Dukhan's FP16
// library: the float unit does the rounding, so ties go to even.
inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t w = std::uint32_t{h} << 16;
  const std::uint32_t sign = w & 0x80000000u;
  const std::uint32_t two_w = w + w;
  const std::uint32_t exp_offset = 0xE0u << 23;
  const float normalized = float_from_bits((two_w >> 4) + exp_offset) * 0x1.0p-112f;
  const float denormalized = float_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  const std::uint32_t denormalized_cutoff = 1u << 27;
  return float_from_bits(sign | (two_w < denormalized_cutoff ? float_bits(denormalized)
                                                             : float_bits(normalized)));
}

inline std::uint16_t float_to_fp16(float f) {
  float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const std::uint32_t w = float_bits(f);
  const std::uint32_t shl1_w = w + w;
  const std::uint32_t sign = w & 0x80000000u;
  std::uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = float_from_bits((bias >> 1) + 0x07800000u) + base;
  const std::uint32_t bits = float_bits(base);
  const std::uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const std::uint32_t mantissa_bits = bits & 0x00000FFFu;
  const std::uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<std::uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

}  // namespace zero
