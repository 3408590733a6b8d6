#include "zero/comm/reduce_op.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "zero/core/error.h"
#include "zero/core/half.h"

namespace zero::comm {
namespace {

// max with the guarantees written in reduce_op.h: symmetric in its operands
// (MPI pairs ranks differently on different ranks) and NaN-propagating.
// Branch-free so that the block loop below vectorises.
inline float max_of(float a, float b) {
  const bool nan = (a != a) | (b != b);
  const float larger = a > b ? a : b;
  // Equal operands differ at most in the sign of a zero; AND-ing the bits
  // keeps +0 whichever side it came from.
  const float equal = float_from_bits(float_bits(a) & float_bits(b));
  const float m = a == b ? equal : larger;
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

// Works through fixed-size blocks copied to local arrays: MPI hands us
// buffers of any alignment, and a constant trip count over local arrays is
// what lets the compiler vectorise widen-combine-narrow.
template <typename T, typename Widen, typename Narrow, typename Combine>
void reduce_elements(const void* in, void* inout, std::size_t count, Widen widen, Narrow narrow,
                     Combine combine) {
  constexpr std::size_t kBlock = 256;
  const auto* src = static_cast<const unsigned char*>(in);
  auto* dst = static_cast<unsigned char*>(inout);
  for (std::size_t offset = 0; offset < count; offset += kBlock) {
    const std::size_t n = std::min(kBlock, count - offset);
    T a[kBlock], b[kBlock];
    std::memcpy(a, src + offset * sizeof(T), n * sizeof(T));
    std::memcpy(b, dst + offset * sizeof(T), n * sizeof(T));
    if (n == kBlock) {
      for (std::size_t i = 0; i < kBlock; ++i) b[i] = narrow(combine(widen(a[i]), widen(b[i])));
    } else {
      for (std::size_t i = 0; i < n; ++i) b[i] = narrow(combine(widen(a[i]), widen(b[i])));
    }
    std::memcpy(dst + offset * sizeof(T), b, n * sizeof(T));
  }
}

template <typename Combine>
void reduce_typed(DType dtype, const void* in, void* inout, std::size_t count, Combine combine) {
  switch (dtype) {
    case DType::kFloat32:
      reduce_elements<float>(
          in, inout, count, [](float x) { return x; }, [](float x) { return x; }, combine);
      return;
    case DType::kBFloat16:
      reduce_elements<std::uint16_t>(
          in, inout, count, [](std::uint16_t h) { return bf16_to_float(h); },
          [](float x) { return float_to_bf16(x); }, combine);
      return;
    case DType::kFloat16:
      reduce_elements<std::uint16_t>(
          in, inout, count, [](std::uint16_t h) { return fp16_to_float(h); },
          [](float x) { return float_to_fp16(x); }, combine);
      return;
  }
  ZERO_INTERNAL_ASSERT(false, "unknown dtype ", static_cast<int>(dtype));
}

}  // namespace

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

void reduce_into(ReduceOp op, DType dtype, const void* in, void* inout, std::size_t count) {
  switch (op) {
    case ReduceOp::kSum:
      reduce_typed(dtype, in, inout, count, [](float a, float b) { return a + b; });
      return;
    case ReduceOp::kMax:
      reduce_typed(dtype, in, inout, count, [](float a, float b) { return max_of(a, b); });
      return;
  }
  ZERO_INTERNAL_ASSERT(false, "unknown reduce op ", static_cast<int>(op));
}

}  // namespace zero::comm
