#include "zero/core/half.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace {

using zero::bf16_to_float;
using zero::float_to_bf16;
using zero::float_to_fp16;
using zero::fp16_to_float;

TEST(Half, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly half-way between two bf16 values (1 and 1 + 2^-7):
  // ties go to the even one, 1.
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3*2^-8 is half-way between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above half-way rounds up.
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
}

TEST(Half, Bf16KeepsNaNAndInf) {
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling NaN whose payload sits in the low bits must not become inf.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(zero::float_from_bits(0x7f800001u)))));
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
}

TEST(Half, Fp16RoundTripsEveryValue) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    float f = fp16_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f))));
    } else {
      ASSERT_EQ(float_to_fp16(f), h) << "h=" << h << " f=" << f;
    }
  }
}

TEST(Half, Fp16RoundsToNearestEvenAndOverflows) {
  EXPECT_EQ(float_to_fp16(1.0f + 0x1p-11f), 0x3c00);      // tie -> even (1.0)
  EXPECT_EQ(float_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie -> even (1 + 2^-9)
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);             // rounds past 65504: inf
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);             // tie between 0 and min subnormal
  EXPECT_EQ(float_to_fp16(0x1p-24f), 0x0001);
}

}  // namespace
