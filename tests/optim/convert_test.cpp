// convert() on every supported SIMD target, bit for bit against core/half.h.
#include "zero/optim/convert.h"

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "zero/core/half.h"
#include "zero/optim/simd_target.h"
#include "zero/optim/thread_pool.h"

namespace zero::optim {
namespace {

// fp32 inputs that exercise both roundings: every sign/exponent/top-7-mantissa
// pattern (all upper 16 bits, so every bf16 neighbourhood, every fp16
// exponent including subnormals, inf and NaN), each with low halves at and
// around every possible tie position (0x?000, 0x?001, 0x?FFF).
std::vector<std::uint32_t> narrowing_inputs() {
  std::vector<std::uint32_t> out;
  out.reserve(65536 * 48 + 1);
  for (std::uint32_t hi = 0; hi < 65536; ++hi) {
    for (std::uint32_t nibble = 0; nibble < 16; ++nibble) {
      out.push_back(hi << 16 | nibble << 12);
      out.push_back(hi << 16 | nibble << 12 | 0x001u);
      out.push_back(hi << 16 | nibble << 12 | 0xFFFu);
    }
  }
  out.push_back(0x12345u);  // an odd count, so the last vector is a tail
  return out;
}

std::vector<std::uint16_t> every_16bit_value() {
  std::vector<std::uint16_t> out(65536);
  for (std::uint32_t h = 0; h < 65536; ++h) out[h] = static_cast<std::uint16_t>(h);
  return out;
}

std::uint16_t scalar_narrow(float f, DType t) {
  return t == DType::kBFloat16 ? float_to_bf16(f) : float_to_fp16(f);
}
float scalar_widen(std::uint16_t h, DType t) {
  return t == DType::kBFloat16 ? bf16_to_float(h) : fp16_to_float(h);
}

class ConvertTarget : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { force_simd_target(GetParam()); }
  void TearDown() override { force_simd_target(""); }
};

TEST_P(ConvertTarget, NarrowingEqualsScalarRoundingBitForBit) {
  const std::vector<std::uint32_t> in = narrowing_inputs();
  // Offset by one element so neither side is vector aligned.
  std::vector<float> src(in.size() + 1);
  std::memcpy(src.data() + 1, in.data(), in.size() * 4);
  ThreadPool pool(3);
  for (DType to : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<std::uint16_t> dst(in.size() + 1);
    convert(src.data() + 1, DType::kFloat32, dst.data() + 1, to, in.size(), &pool);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const std::uint16_t want = scalar_narrow(float_from_bits(in[i]), to);
      if (dst[i + 1] != want && bad++ < 5) {
        ADD_FAILURE() << dtype_name(to) << ": input 0x" << std::hex << in[i] << " got 0x"
                      << dst[i + 1] << " want 0x" << want;
      }
    }
    EXPECT_EQ(bad, 0u) << dtype_name(to);
  }
}

TEST_P(ConvertTarget, WideningEveryValueEqualsScalar) {
  const std::vector<std::uint16_t> in = every_16bit_value();
  for (DType from : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> dst(in.size());
    convert(in.data(), from, dst.data(), DType::kFloat32, in.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const float want = scalar_widen(in[i], from);
      if (float_bits(dst[i]) != float_bits(want) && bad++ < 5) {
        ADD_FAILURE() << dtype_name(from) << ": input 0x" << std::hex << in[i] << " got 0x"
                      << float_bits(dst[i]) << " want 0x" << float_bits(want);
      }
    }
    EXPECT_EQ(bad, 0u) << dtype_name(from);
  }
}

TEST_P(ConvertTarget, HalfToHalfGoesThroughFp32) {
  const std::vector<std::uint16_t> in = every_16bit_value();
  for (DType from : {DType::kBFloat16, DType::kFloat16}) {
    const DType to = from == DType::kBFloat16 ? DType::kFloat16 : DType::kBFloat16;
    std::vector<std::uint16_t> dst(in.size() - 3);  // a tail, from an odd start
    convert(in.data() + 3, from, dst.data(), to, dst.size());
    for (std::size_t i = 0; i < dst.size(); ++i) {
      ASSERT_EQ(dst[i], scalar_narrow(scalar_widen(in[i + 3], from), to))
          << dtype_name(from) << " 0x" << std::hex << in[i + 3];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EverySupportedTarget, ConvertTarget,
                         ::testing::ValuesIn(available_simd_targets()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(Convert, SameDtypeCopiesAndSizesAroundVectorWidths) {
  ThreadPool pool(2);
  for (std::size_t n : {0, 1, 7, 15, 16, 17, 100003}) {
    std::vector<float> src(n), dst(n, -1.0f);
    for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.5f;
    convert(src.data(), DType::kFloat32, dst.data(), DType::kFloat32, n, &pool);
    EXPECT_EQ(src, dst);
    std::vector<std::uint16_t> half(n);
    convert(src.data(), DType::kFloat32, half.data(), DType::kBFloat16, n, &pool);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(half[i], float_to_bf16(src[i])) << i;
  }
}

}  // namespace
}  // namespace zero::optim
