// convert(): fp32/bf16/fp16 spans to one another, compiled once per SIMD
// target. Widening is exact; narrowing rounds as core/half.h does (see
// half_simd-inl.h), so every target equals the scalar functions bit for bit.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optim/convert_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <cstring>

#include <hwy/highway.h>

#include "optim/half_simd-inl.h"
#include "zero/optim/convert.h"

HWY_BEFORE_NAMESPACE();
namespace zero::optim::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <DType kFrom, DType kTo>
void ConvertSpan(const void* src, void* dst, std::size_t begin, std::size_t end) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = begin;
  for (; i + lanes <= end; i += lanes) {
    StoreNarrowed<kTo>(d, LoadWidened<kFrom>(d, src, i), dst, i);
  }
  if (i == end) return;
  // The tail on copies, through the same vector code.
  constexpr std::size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);
  alignas(64) unsigned char in[kMaxLanes * sizeof(float)] = {};
  alignas(64) unsigned char out[kMaxLanes * sizeof(float)] = {};
  const std::size_t r = end - i;
  std::memcpy(in, static_cast<const unsigned char*>(src) + i * element_size(kFrom),
              r * element_size(kFrom));
  StoreNarrowed<kTo>(d, LoadWidened<kFrom>(d, in, 0), out, 0);
  std::memcpy(static_cast<unsigned char*>(dst) + i * element_size(kTo), out,
              r * element_size(kTo));
}

template <DType kFrom>
void ConvertFrom(DType to, const void* src, void* dst, std::size_t begin, std::size_t end) {
  switch (to) {
    case DType::kFloat32: return ConvertSpan<kFrom, DType::kFloat32>(src, dst, begin, end);
    case DType::kBFloat16: return ConvertSpan<kFrom, DType::kBFloat16>(src, dst, begin, end);
    case DType::kFloat16: return ConvertSpan<kFrom, DType::kFloat16>(src, dst, begin, end);
  }
}

// Elements [begin, end); src_dtype != dst_dtype (equal dtypes are a memcpy).
void ConvertTile(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t begin,
                 std::size_t end) {
  switch (src_dtype) {
    case DType::kFloat32: return ConvertFrom<DType::kFloat32>(dst_dtype, src, dst, begin, end);
    case DType::kBFloat16: return ConvertFrom<DType::kBFloat16>(dst_dtype, src, dst, begin, end);
    case DType::kFloat16: return ConvertFrom<DType::kFloat16>(dst_dtype, src, dst, begin, end);
  }
}

}  // namespace zero::optim::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "optim/simd_dispatch.h"
#include "optim/tiled_run.h"

namespace zero::optim {

HWY_EXPORT(ConvertTile);

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n,
             ThreadPool* pool) {
  if (n == 0) return;
  ZERO_CHECK(src != nullptr && dst != nullptr, "convert: src and dst must be set when n > 0 (n=",
             n, ")");
  // Tiles of 64 KiB of the wider side, as for the optimizer kernels.
  if (src_dtype == dst_dtype) {
    const std::size_t bytes = element_size(src_dtype);
    detail::run_tiled(pool, n, kTileElements, [&](std::size_t begin, std::size_t end) {
      std::memcpy(static_cast<unsigned char*>(dst) + begin * bytes,
                  static_cast<const unsigned char*>(src) + begin * bytes, (end - begin) * bytes);
    });
    return;
  }
  const auto tile_fn = detail::pick(HWY_DISPATCH_TABLE(ConvertTile));
  detail::run_tiled(pool, n, kTileElements, [&](std::size_t begin, std::size_t end) {
    tile_fn(src, src_dtype, dst, dst_dtype, begin, end);
  });
}

}  // namespace zero::optim
#endif  // HWY_ONCE
