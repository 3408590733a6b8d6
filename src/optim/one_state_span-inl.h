// The loop of the one-state CPU kernels (Adagrad, Lion), per SIMD target: an
// `update` of one vector at element i of (params, grads, state, half_out),
// run over [begin, end) of a span of n with software prefetch as in
// adam_kernel.cpp, and on the tail over zero-padded copies, so that the
// tail's results are bit for bit what a full vector gives (the padding
// lanes are discarded). Included once per target inside Highway's
// foreach_target loop, hence the toggle guard.
//
// grads and half_out are not restrict: half_out may be grads itself (adam.h's
// contract, shared by adagrad.h and lion.h); `update` reads a vector's grads
// before it stores its half values.
#if defined(ZERO_OPTIM_ONE_STATE_SPAN_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ZERO_OPTIM_ONE_STATE_SPAN_INL_H_
#undef ZERO_OPTIM_ONE_STATE_SPAN_INL_H_
#else
#define ZERO_OPTIM_ONE_STATE_SPAN_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "zero/core/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace zero::optim::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// As in adam_kernel.cpp: prefetch 1 KiB of each fp32 stream ahead, once per line.
constexpr std::size_t kOneStatePrefetchElements = 256;
constexpr std::size_t kOneStateLineElements = 64 / sizeof(float);

template <DType kGrad, bool kHalfOut, class Update>
HWY_INLINE void OneStateSpan(float* HWY_RESTRICT params, const void* grads, float* HWY_RESTRICT state,
                             void* half_out, std::size_t n, std::size_t begin, std::size_t end,
                             const Update& update) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  const std::size_t last = n - 1;
  const std::size_t grad_bytes = element_size(kGrad);
  const std::size_t step = std::max(kOneStateLineElements, lanes);
  std::size_t i = begin;
  for (; i + step <= end; i += step) {
    const std::size_t ahead = std::min(i + kOneStatePrefetchElements, last);
    hwy::Prefetch(params + ahead);
    hwy::Prefetch(static_cast<const unsigned char*>(grads) + ahead * grad_bytes);
    hwy::Prefetch(state + ahead);
    for (std::size_t j = i; j < i + step; j += lanes) update(params, grads, state, half_out, j);
  }
  for (; i + lanes <= end; i += lanes) update(params, grads, state, half_out, i);
  if (i == end) return;

  constexpr std::size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);
  const std::size_t r = end - i;
  alignas(64) float p[kMaxLanes] = {};
  alignas(64) float s[kMaxLanes] = {};
  alignas(64) unsigned char g[kMaxLanes * sizeof(float)] = {};
  alignas(64) std::uint16_t h[kMaxLanes] = {};
  std::memcpy(p, params + i, r * sizeof(float));
  std::memcpy(g, static_cast<const unsigned char*>(grads) + i * grad_bytes, r * grad_bytes);
  std::memcpy(s, state + i, r * sizeof(float));
  update(p, g, s, h, 0);
  std::memcpy(params + i, p, r * sizeof(float));
  std::memcpy(state + i, s, r * sizeof(float));
  if constexpr (kHalfOut) {
    std::memcpy(static_cast<std::uint16_t*>(half_out) + i, h, r * sizeof(std::uint16_t));
  }
}

}  // namespace zero::optim::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
