// Per-target loads and stores of fp32 vectors from and to fp32, bf16 and fp16
// memory, shared by the kernel files (included once per SIMD target, inside
// Highway's foreach_target loop; hence the toggle guard instead of #pragma once).
//
// Narrowing must equal zero::float_to_bf16 / zero::float_to_fp16 (core/half.h)
// bit for bit on every target: round to nearest even, NaN stays a (quiet) NaN,
// overflow goes to inf. Highway 1.0.3's own DemoteTo does not promise that:
// to bf16 it truncates, and to fp16 without F16C (SSSE3, SSE4, SCALAR) it
// truncates and turns inf/NaN into finite values. So the roundings below are
// the scalar reference's integer/float recipes, one lane per element, and the
// F16C instructions are used only where they are exact (see each function).
#if defined(ZERO_OPTIM_HALF_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ZERO_OPTIM_HALF_SIMD_INL_H_
#undef ZERO_OPTIM_HALF_SIMD_INL_H_
#else
#define ZERO_OPTIM_HALF_SIMD_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include <hwy/highway.h>

#include "zero/core/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace zero::optim::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// x86 targets from AVX2 up have F16C (Highway requires it for AVX2), whose
// vcvtph2ps is exact and whose vcvtps2ph with imm 0 rounds to nearest even.
#undef ZERO_OPTIM_HAVE_F16C
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define ZERO_OPTIM_HAVE_F16C 1
#else
#define ZERO_OPTIM_HAVE_F16C 0
#endif

// fp16 bits (in u32 lanes) -> fp32, as zero::fp16_to_float (M. Dukhan's
// branch-free method; every step is exact, so it equals F16C bit for bit).
template <class DF, class VU>
HWY_INLINE hn::Vec<DF> Fp16BitsToFloat(DF df, VU h) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto w = hn::ShiftLeft<16>(h);                          // w = h << 16
  const auto sign = hn::And(w, hn::Set(du, 0x80000000u));       // w & 0x80000000
  const auto two_w = hn::Add(w, w);                             // w + w
  // normalized = as_float((two_w >> 4) + (0xE0 << 23)) * 0x1.0p-112f
  const auto normalized = hn::Mul(
      hn::BitCast(df, hn::Add(hn::ShiftRight<4>(two_w), hn::Set(du, 0xE0u << 23))),
      hn::Set(df, 0x1.0p-112f));
  // denormalized = as_float((two_w >> 17) | (126 << 23)) - 0.5f
  const auto denormalized =
      hn::Sub(hn::BitCast(df, hn::Or(hn::ShiftRight<17>(two_w), hn::Set(du, 126u << 23))),
              hn::Set(df, 0.5f));
  // two_w < (1 << 27)  <=>  (two_w >> 17) < 0x400: a zero fp16 exponent. The
  // shifted form fits a signed compare, which every target has.
  const auto is_denormal =
      hn::Lt(hn::BitCast(di, hn::ShiftRight<17>(two_w)), hn::Set(di, 0x400));
  const auto magnitude = hn::IfThenElse(hn::RebindMask(du, is_denormal),
                                        hn::BitCast(du, denormalized), hn::BitCast(du, normalized));
  return hn::BitCast(df, hn::Or(sign, magnitude));
}

// fp32 -> fp16 bits (in u32 lanes, < 0x10000), as zero::float_to_fp16.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> FloatToFp16Bits(DF df, hn::Vec<DF> f) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto w = hn::BitCast(du, f);
  // base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f: the FPU rounds the
  // mantissa to 10 bits (to even) when the bias below is added.
  auto base = hn::Mul(hn::Mul(hn::Abs(f), hn::Set(df, 0x1.0p+112f)), hn::Set(df, 0x1.0p-110f));
  const auto sign = hn::And(w, hn::Set(du, 0x80000000u));
  // bias = max((w + w) & 0xFF000000, 0x71000000); we keep bias >> 1, which is
  // w's exponent field and fits a signed max: max(w & 0x7F800000, 0x38800000).
  const auto half_bias = hn::BitCast(
      du, hn::Max(hn::BitCast(di, hn::And(w, hn::Set(du, 0x7F800000u))), hn::Set(di, 0x38800000)));
  // base = as_float((bias >> 1) + 0x07800000) + base
  base = hn::Add(hn::BitCast(df, hn::Add(half_bias, hn::Set(du, 0x07800000u))), base);
  const auto bits = hn::BitCast(du, base);
  // nonsign = ((bits >> 13) & 0x7C00) + (bits & 0x0FFF)
  const auto nonsign = hn::Add(hn::And(hn::ShiftRight<13>(bits), hn::Set(du, 0x7C00u)),
                               hn::And(bits, hn::Set(du, 0x0FFFu)));
  // NaN (w + w > 0xFF000000  <=>  (w & 0x7FFFFFFF) > 0x7F800000) -> 0x7E00.
  const auto is_nan = hn::Gt(hn::BitCast(di, hn::And(w, hn::Set(du, 0x7FFFFFFFu))),
                             hn::Set(di, 0x7F800000));
  const auto magnitude = hn::IfThenElse(hn::RebindMask(du, is_nan), hn::Set(du, 0x7E00u), nonsign);
  return hn::Or(hn::ShiftRight<16>(sign), magnitude);
}

// fp32 -> bf16 bits (in u32 lanes, < 0x10000), as zero::float_to_bf16.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> FloatToBf16Bits(DF df, hn::Vec<DF> f) {
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::BitCast(du, f);
  const auto high = hn::ShiftRight<16>(u);
  // u += 0x7fff + ((u >> 16) & 1): round to nearest, ties to even.
  const auto rounded = hn::ShiftRight<16>(
      hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), hn::And(high, hn::Set(du, 1u)))));
  // NaN (f != f) -> (u >> 16) | 0x0040: quieted, sign and top payload kept
  // (rounding could carry a NaN into inf).
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(f)), hn::Or(high, hn::Set(du, 0x0040u)),
                        rounded);
}

// Loads Lanes(df) elements of type kType from base[i...], widened to fp32.
template <DType kType, class DF>
HWY_INLINE hn::Vec<DF> LoadWidened(DF df, const void* base, std::size_t i) {
  if constexpr (kType == DType::kFloat32) {
    return hn::LoadU(df, static_cast<const float*>(base) + i);
  } else {
    const hn::Rebind<std::uint16_t, DF> du16;
    const hn::RebindToUnsigned<DF> du;
    const auto h = hn::LoadU(du16, static_cast<const std::uint16_t*>(base) + i);
    if constexpr (kType == DType::kBFloat16) {
      return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, h)));  // bf16 << 16
    } else {
#if ZERO_OPTIM_HAVE_F16C
      const hn::Rebind<hwy::float16_t, DF> df16;
      return hn::PromoteTo(df, hn::BitCast(df16, h));  // vcvtph2ps, exact
#else
      return Fp16BitsToFloat(df, hn::PromoteTo(du, h));
#endif
    }
  }
}

// Stores Lanes(df) fp32 values to base[i...] as kType (RNE, NaN kept).
template <DType kType, class DF>
HWY_INLINE void StoreNarrowed(DF df, hn::Vec<DF> v, void* base, std::size_t i) {
  if constexpr (kType == DType::kFloat32) {
    hn::StoreU(v, df, static_cast<float*>(base) + i);
  } else {
    const hn::Rebind<std::uint16_t, DF> du16;
    const hn::RebindToSigned<DF> di;
    std::uint16_t* out = static_cast<std::uint16_t*>(base) + i;
    if constexpr (kType == DType::kBFloat16) {
      // Values < 0x10000, so the saturating i32 -> u16 demotion is exact.
      hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, FloatToBf16Bits(df, v))), du16, out);
    } else {
#if ZERO_OPTIM_HAVE_F16C
      // vcvtps2ph rounds to nearest even and overflows to inf like the
      // reference, but keeps a NaN's payload where the reference writes
      // sign | 0x7E00; a NaN replaced by sign | quiet-NaN converts to exactly that.
      const hn::RebindToUnsigned<DF> du;
      const hn::Rebind<hwy::float16_t, DF> df16;
      const auto u = hn::BitCast(du, v);
      const auto quiet = hn::BitCast(df, hn::Or(hn::And(u, hn::Set(du, 0x80000000u)),
                                                hn::Set(du, 0x7FC00000u)));
      const auto clean = hn::IfThenElse(hn::IsNaN(v), quiet, v);
      hn::StoreU(hn::BitCast(du16, hn::DemoteTo(df16, clean)), du16, out);
#else
      hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, FloatToFp16Bits(df, v))), du16, out);
#endif
    }
  }
}

}  // namespace zero::optim::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
