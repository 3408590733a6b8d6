// CPU Adagrad: the SIMD kernel, compiled once per target, and adagrad_step().
// Same structure as adam_kernel.cpp (one pass with software prefetch, tail on
// copies, no FMA contraction so every target equals adagrad_step_reference
// bit for bit). The half copy is rounded in the same loop body: Adagrad's
// chain is short (one sqrt, one divide), so it needs no chunking.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optim/adagrad_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>
#include <cstring>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "optim/half_simd-inl.h"
#include "zero/optim/detail/step_scalars.h"
#include "zero/optim/adagrad.h"

HWY_BEFORE_NAMESPACE();
namespace zero::optim::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// As in adam_kernel.cpp: prefetch 1 KiB of each fp32 stream ahead, once per line.
constexpr std::size_t kPrefetchElements = 256;
constexpr std::size_t kLineElements = 64 / sizeof(float);

template <DType kGrad, bool kL2, bool kHalfOut, DType kHalf>
void AdagradSpan(const detail::AdagradScalars& s, const AdagradBuffers& b, std::size_t begin,
                 std::size_t end) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  const auto grad_scale = hn::Set(d, s.grad_scale);
  const auto l2 = hn::Set(d, s.l2);
  const auto clr = hn::Set(d, s.clr);
  const auto eps = hn::Set(d, s.eps);

  // grads and half_out are not restrict: half_out may be grads itself (as
  // in adam.h); each vector's grads are read before its half values are
  // stored.
  const auto update = [&](float* HWY_RESTRICT params, const void* grads,
                          float* HWY_RESTRICT state_sum, void* half_out,
                          std::size_t i) HWY_ATTR {
    auto p = hn::LoadU(d, params + i);
    auto g = hn::Mul(LoadWidened<kGrad>(d, grads, i), grad_scale);   // g = grad * grad_scale
    if constexpr (kL2) g = hn::Add(g, hn::Mul(l2, p));               // g += wd * p
    const auto sum = hn::Add(hn::LoadU(d, state_sum + i), hn::Mul(g, g));  // sum += g*g
    const auto std_dev = hn::Add(hn::Sqrt(sum), eps);                // sqrt(sum) + eps
    p = hn::Sub(p, hn::Div(hn::Mul(clr, g), std_dev));               // p -= (clr * g) / std
    hn::StoreU(p, d, params + i);
    hn::StoreU(sum, d, state_sum + i);
    if constexpr (kHalfOut) StoreNarrowed<kHalf>(d, p, half_out, i);
  };

  // Local pointer copies (stores cannot alias `b`, so they stay in
  // registers), and software prefetch as in adam_kernel.cpp.
  float* HWY_RESTRICT params = b.params;
  const void* grads = b.grads;
  float* HWY_RESTRICT state_sum = b.state_sum;
  void* half_out = b.half_out;
  const std::size_t last = b.n - 1;
  const std::size_t grad_bytes = element_size(kGrad);
  const std::size_t step = std::max(kLineElements, lanes);
  std::size_t i = begin;
  for (; i + step <= end; i += step) {
    const std::size_t ahead = std::min(i + kPrefetchElements, last);
    hwy::Prefetch(params + ahead);
    hwy::Prefetch(static_cast<const unsigned char*>(grads) + ahead * grad_bytes);
    hwy::Prefetch(state_sum + ahead);
    for (std::size_t j = i; j < i + step; j += lanes) update(params, grads, state_sum, half_out, j);
  }
  for (; i + lanes <= end; i += lanes) update(params, grads, state_sum, half_out, i);
  if (i == end) return;

  // Tail on zero-padded copies (g = 0 gives p -= clr * 0/eps = 0).
  constexpr std::size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);
  const std::size_t r = end - i;
  alignas(64) float p[kMaxLanes] = {};
  alignas(64) float sum[kMaxLanes] = {};
  alignas(64) unsigned char g[kMaxLanes * sizeof(float)] = {};
  alignas(64) std::uint16_t h[kMaxLanes] = {};
  std::memcpy(p, params + i, r * sizeof(float));
  std::memcpy(g, static_cast<const unsigned char*>(grads) + i * grad_bytes, r * grad_bytes);
  std::memcpy(sum, state_sum + i, r * sizeof(float));
  update(p, g, sum, h, 0);
  std::memcpy(params + i, p, r * sizeof(float));
  std::memcpy(state_sum + i, sum, r * sizeof(float));
  if constexpr (kHalfOut) {
    std::memcpy(static_cast<std::uint16_t*>(half_out) + i, h, r * sizeof(std::uint16_t));
  }
}

template <DType kGrad, bool kL2>
void AdagradSpanOut(const detail::AdagradScalars& s, const AdagradBuffers& b, std::size_t begin,
                    std::size_t end) {
  if (b.half_out == nullptr) {
    AdagradSpan<kGrad, kL2, false, DType::kBFloat16>(s, b, begin, end);
  } else if (b.half_dtype == DType::kBFloat16) {
    AdagradSpan<kGrad, kL2, true, DType::kBFloat16>(s, b, begin, end);
  } else {
    AdagradSpan<kGrad, kL2, true, DType::kFloat16>(s, b, begin, end);
  }
}

template <DType kGrad>
void AdagradSpanGrad(const detail::AdagradScalars& s, const AdagradBuffers& b, std::size_t begin,
                     std::size_t end) {
  if (s.l2 != 0.0f) {
    AdagradSpanOut<kGrad, true>(s, b, begin, end);
  } else {
    AdagradSpanOut<kGrad, false>(s, b, begin, end);
  }
}

void AdagradTile(const detail::AdagradScalars& s, const AdagradBuffers& b, std::size_t begin,
                 std::size_t end) {
  switch (b.grad_dtype) {
    case DType::kFloat32: return AdagradSpanGrad<DType::kFloat32>(s, b, begin, end);
    case DType::kBFloat16: return AdagradSpanGrad<DType::kBFloat16>(s, b, begin, end);
    case DType::kFloat16: return AdagradSpanGrad<DType::kFloat16>(s, b, begin, end);
  }
}

}  // namespace zero::optim::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "optim/simd_dispatch.h"
#include "optim/tiled_run.h"

namespace zero::optim {

HWY_EXPORT(AdagradTile);

void adagrad_step(const AdagradHyper& hyper, const AdagradBuffers& buffers, ThreadPool* pool) {
  const detail::AdagradScalars s = detail::adagrad_scalars(hyper, buffers);
  if (buffers.n == 0) return;
  const auto tile_fn = detail::pick(HWY_DISPATCH_TABLE(AdagradTile));
  detail::run_tiled(pool, buffers.n, kTileElements,
                    [&](std::size_t begin, std::size_t end) { tile_fn(s, buffers, begin, end); });
}

}  // namespace zero::optim
#endif  // HWY_ONCE
