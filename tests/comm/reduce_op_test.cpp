#include "zero/comm/reduce_op.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "zero/core/half.h"

namespace {

using zero::DType;
using zero::comm::reduce_into;
using zero::comm::ReduceOp;

std::uint16_t combine16(ReduceOp op, DType dtype, std::uint16_t a, std::uint16_t b) {
  reduce_into(op, dtype, &a, &b, 1);
  return b;
}

TEST(ReduceOp, Bf16SumRoundsOnceToNearestEven) {
  const std::uint16_t one = zero::float_to_bf16(1.0f);
  const std::uint16_t tiny = zero::float_to_bf16(0x1p-8f);  // half an ulp of 1
  // 1 + 2^-8 is a tie between 1 (even) and 1 + 2^-7: stays 1.
  EXPECT_EQ(combine16(ReduceOp::kSum, DType::kBFloat16, one, tiny), one);
  // (1 + 2^-7) + 2^-8 is a tie between 1 + 2^-7 (odd) and 1 + 2^-6: goes up.
  const std::uint16_t odd = zero::float_to_bf16(1.0f + 0x1p-7f);
  EXPECT_EQ(combine16(ReduceOp::kSum, DType::kBFloat16, odd, tiny),
            zero::float_to_bf16(1.0f + 0x1p-6f));
}

TEST(ReduceOp, Fp16SumRoundsOnceToNearestEven) {
  const std::uint16_t one = zero::float_to_fp16(1.0f);
  const std::uint16_t tiny = zero::float_to_fp16(0x1p-11f);  // half an ulp of 1
  EXPECT_EQ(combine16(ReduceOp::kSum, DType::kFloat16, one, tiny), one);
  const std::uint16_t odd = zero::float_to_fp16(1.0f + 0x1p-10f);
  EXPECT_EQ(combine16(ReduceOp::kSum, DType::kFloat16, odd, tiny),
            zero::float_to_fp16(1.0f + 0x1p-9f));
  // Overflow goes to inf, as IEEE says.
  const std::uint16_t big = zero::float_to_fp16(60000.0f);
  EXPECT_TRUE(
      std::isinf(zero::fp16_to_float(combine16(ReduceOp::kSum, DType::kFloat16, big, big))));
}

// Every 16-bit sum and max equals the fp32 operation rounded once, over many
// random operand pairs (NaN results only need to be NaN).
TEST(ReduceOp, SixteenBitMatchesWidenCombineRound) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const auto widen = dtype == DType::kBFloat16 ? zero::bf16_to_float : zero::fp16_to_float;
    const auto narrow = dtype == DType::kBFloat16 ? zero::float_to_bf16 : zero::float_to_fp16;
    constexpr std::size_t n = 20000;
    std::vector<std::uint16_t> a(n), b(n);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = static_cast<std::uint16_t>(bits(rng));
      b[i] = static_cast<std::uint16_t>(bits(rng));
    }
    std::vector<std::uint16_t> sum = b, max = b;
    reduce_into(ReduceOp::kSum, dtype, a.data(), sum.data(), n);
    reduce_into(ReduceOp::kMax, dtype, a.data(), max.data(), n);
    for (std::size_t i = 0; i < n; ++i) {
      const float x = widen(a[i]), y = widen(b[i]);
      const std::uint16_t want_sum = narrow(x + y);
      if (std::isnan(widen(want_sum))) {
        EXPECT_TRUE(std::isnan(widen(sum[i])));
      } else {
        ASSERT_EQ(sum[i], want_sum) << zero::dtype_name(dtype) << " " << x << " + " << y;
      }
      if (std::isnan(x) || std::isnan(y)) {
        EXPECT_TRUE(std::isnan(widen(max[i])));
      } else if (x != y) {
        ASSERT_EQ(widen(max[i]), std::max(x, y)) << x << " " << y;
      }
    }
  }
}

TEST(ReduceOp, Fp32Sum) {
  std::vector<float> a = {1.0f, -2.5f, 1e30f}, b = {2.0f, 0.5f, 1e30f};
  reduce_into(ReduceOp::kSum, DType::kFloat32, a.data(), b.data(), a.size());
  EXPECT_EQ(b[0], 3.0f);
  EXPECT_EQ(b[1], -2.0f);
  EXPECT_EQ(b[2], 2e30f);
}

// MPI pairs ranks differently on different ranks, so max must give the same
// bits whichever operand comes first, NaN and signed zeros included.
TEST(ReduceOp, MaxIsSymmetricAndPropagatesNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<float, float>> cases = {{nan, 1.0f},   {-inf, nan},  {0.0f, -0.0f},
                                                      {-3.0f, -inf}, {2.0f, 5.0f}, {inf, 1.0f}};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (auto [x, y] : cases) {
      std::uint32_t r1 = 0, r2 = 0;
      if (dtype == DType::kFloat32) {
        float a = x, b = y;
        reduce_into(ReduceOp::kMax, dtype, &a, &b, 1);
        float c = y, d = x;
        reduce_into(ReduceOp::kMax, dtype, &c, &d, 1);
        r1 = zero::float_bits(b);
        r2 = zero::float_bits(d);
        if (std::isnan(x) || std::isnan(y)) {
          EXPECT_TRUE(std::isnan(b));
        } else {
          EXPECT_EQ(b, std::max(x, y));
        }
        if (x == 0.0f && y == 0.0f) {
          EXPECT_FALSE(std::signbit(b));
        }
      } else {
        const auto narrow = dtype == DType::kBFloat16 ? zero::float_to_bf16 : zero::float_to_fp16;
        const auto widen = dtype == DType::kBFloat16 ? zero::bf16_to_float : zero::fp16_to_float;
        r1 = combine16(ReduceOp::kMax, dtype, narrow(x), narrow(y));
        r2 = combine16(ReduceOp::kMax, dtype, narrow(y), narrow(x));
        const float got = widen(static_cast<std::uint16_t>(r1));
        if (std::isnan(x) || std::isnan(y)) {
          EXPECT_TRUE(std::isnan(got));
        } else {
          EXPECT_EQ(got, std::max(x, y));
        }
        if (x == 0.0f && y == 0.0f) {
          EXPECT_FALSE(std::signbit(got));
        }
      }
      EXPECT_EQ(r1, r2) << zero::dtype_name(dtype) << " max(" << x << ", " << y << ")";
    }
  }
}

TEST(ReduceOp, Names) {
  EXPECT_EQ(zero::comm::reduce_op_name(ReduceOp::kSum), "sum");
  EXPECT_EQ(zero::comm::reduce_op_name(ReduceOp::kMax), "max");
}

}  // namespace
