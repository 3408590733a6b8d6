// CPU Adam/AdamW: the SIMD kernel, compiled once per target (Highway
// foreach_target.h), and adam_step(), which picks the target and spreads the
// tiles over the thread pool. Maths and buffer contract: zero/optim/adam.h.
//
// Memory, not arithmetic, bounds this kernel: each element costs 28 bytes of
// traffic (read p, g, m, v; write p, m, v) against ~15 flops. So it makes one
// pass, loads and stores each stream once, fuses the grad widening and the
// half copy-out into that pass, and uses plain (cached) stores: the update is
// in place, so non-temporal stores would only evict lines we just read.
//
// Every step below is a separate IEEE operation in the reference's order (no
// FMA contraction: the library builds with -ffp-contract=off), so each target
// computes the same bits as adam_step_reference.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optim/adam_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>
#include <cstring>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "optim/half_simd-inl.h"
#include "zero/optim/detail/step_scalars.h"
#include "zero/optim/adam.h"

HWY_BEFORE_NAMESPACE();
namespace zero::optim::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Software prefetch distance, in elements (1 KiB of each fp32 stream), issued
// once per 64-byte line. The hardware prefetchers alone leave a single core
// short of the bandwidth ceiling once the arithmetic fills the out-of-order
// window; measured on a 2-core EPYC (Zen 3) VM at 64 Mi params: +10-15%
// with one thread, also above the ceiling kernel without prefetch, which is
// why the benchmark's ceiling kernel prefetches too (docs/PERFORMANCE.md).
constexpr std::size_t kPrefetchElements = 256;
constexpr std::size_t kLineElements = 64 / sizeof(float);

// Elements per chunk of the half copy-out: the chunk's updated params are
// rounded right after the chunk, while they are still in L1 (2 KiB of fp32),
// so the copy costs no extra memory traffic; and the long dependency chain of
// the update (sqrt, divide) and that of the rounding are not in one loop body,
// which lets the out-of-order core overlap more iterations of each.
constexpr std::size_t kHalfChunk = 512;

template <DType kGrad, bool kL2, bool kHalfOut, DType kHalf>
void AdamSpan(const detail::AdamScalars& s, const AdamBuffers& b, std::size_t begin,
              std::size_t end) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  const auto grad_scale = hn::Set(d, s.grad_scale);
  const auto l2 = hn::Set(d, s.l2);
  const auto decay = hn::Set(d, s.decay);
  const auto beta1 = hn::Set(d, s.beta1);
  const auto one_minus_beta1 = hn::Set(d, s.one_minus_beta1);
  const auto beta2 = hn::Set(d, s.beta2);
  const auto one_minus_beta2 = hn::Set(d, s.one_minus_beta2);
  const auto inv_sqrt_bc2 = hn::Set(d, s.inv_sqrt_bc2);
  const auto eps = hn::Set(d, s.eps);
  const auto step_size = hn::Set(d, s.step_size);

  // One vector of elements [i, i + lanes) of the given streams.
  const auto update = [&](float* HWY_RESTRICT params, const void* HWY_RESTRICT grads,
                          float* HWY_RESTRICT exp_avg, float* HWY_RESTRICT exp_avg_sq,
                          std::size_t i) HWY_ATTR {
    auto p = hn::LoadU(d, params + i);
    auto g = hn::Mul(LoadWidened<kGrad>(d, grads, i), grad_scale);   // g = grad * grad_scale
    if constexpr (kL2) {
      g = hn::Add(g, hn::Mul(l2, p));                                  // g += wd * p  (Adam)
    } else {
      p = hn::Mul(p, decay);                                           // p *= 1 - lr*wd (AdamW)
    }
    auto m = hn::LoadU(d, exp_avg + i);
    auto v = hn::LoadU(d, exp_avg_sq + i);
    m = hn::Add(hn::Mul(m, beta1), hn::Mul(one_minus_beta1, g));       // m = b1*m + (1-b1)*g
    v = hn::Add(hn::Mul(v, beta2), hn::Mul(hn::Mul(one_minus_beta2, g), g));  // v = b2*v + (1-b2)*g*g
    const auto denom = hn::Add(hn::Mul(hn::Sqrt(v), inv_sqrt_bc2), eps);  // sqrt(v)/sqrt(bc2) + eps
    p = hn::Sub(p, hn::Div(hn::Mul(step_size, m), denom));             // p -= (lr/bc1 * m) / denom
    hn::StoreU(p, d, params + i);
    hn::StoreU(m, d, exp_avg + i);
    hn::StoreU(v, d, exp_avg_sq + i);
  };

  // Local copies of the pointers: stores through them cannot then alias `b`,
  // so the compiler keeps them in registers.
  // grads and half_out are not restrict: half_out may be grads itself
  // (adam.h). The per-vector update (whose arguments are restrict) never
  // touches half_out, and each chunk's grads are read before its half values
  // are stored.
  float* HWY_RESTRICT params = b.params;
  const void* grads = b.grads;
  float* HWY_RESTRICT exp_avg = b.exp_avg;
  float* HWY_RESTRICT exp_avg_sq = b.exp_avg_sq;
  void* half_out = b.half_out;

  // Updates [from, to) (whole vectors), prefetching every stream
  // kPrefetchElements ahead once per line. The prefetch address stays inside
  // the buffers (clamped to the last element).
  const std::size_t last = b.n - 1;
  const std::size_t grad_bytes = element_size(kGrad);
  const auto update_range = [&](std::size_t from, std::size_t to) HWY_ATTR {
    const std::size_t step = std::max(kLineElements, lanes);
    std::size_t i = from;
    for (; i + step <= to; i += step) {
      const std::size_t ahead = std::min(i + kPrefetchElements, last);
      hwy::Prefetch(params + ahead);
      hwy::Prefetch(static_cast<const unsigned char*>(grads) + ahead * grad_bytes);
      hwy::Prefetch(exp_avg + ahead);
      hwy::Prefetch(exp_avg_sq + ahead);
      for (std::size_t j = i; j < i + step; j += lanes) {
        update(params, grads, exp_avg, exp_avg_sq, j);
      }
    }
    for (; i < to; i += lanes) update(params, grads, exp_avg, exp_avg_sq, i);
  };

  const std::size_t full_end = begin + (end - begin) / lanes * lanes;
  for (std::size_t chunk = begin; chunk < full_end; chunk += kHalfChunk) {
    const std::size_t chunk_end = std::min(full_end, chunk + kHalfChunk);
    update_range(chunk, chunk_end);
    if constexpr (kHalfOut) {
      for (std::size_t i = chunk; i < chunk_end; i += lanes) {
        StoreNarrowed<kHalf>(d, hn::LoadU(d, params + i), half_out, i);
      }
    }
  }
  if (full_end == end) return;

  // The tail (fewer than `lanes` elements): run the same vector code on
  // copies, so the tail's results are bit for bit what a full vector gives.
  // The padding lanes are zero (g = m = v = 0 gives m/denom = 0/eps = 0).
  constexpr std::size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);
  const std::size_t i = full_end;
  const std::size_t r = end - i;
  alignas(64) float p[kMaxLanes] = {};
  alignas(64) float m[kMaxLanes] = {};
  alignas(64) float v[kMaxLanes] = {};
  alignas(64) unsigned char g[kMaxLanes * sizeof(float)] = {};
  std::memcpy(p, params + i, r * sizeof(float));
  std::memcpy(g, static_cast<const unsigned char*>(grads) + i * grad_bytes, r * grad_bytes);
  std::memcpy(m, exp_avg + i, r * sizeof(float));
  std::memcpy(v, exp_avg_sq + i, r * sizeof(float));
  update(p, g, m, v, 0);
  std::memcpy(params + i, p, r * sizeof(float));
  std::memcpy(exp_avg + i, m, r * sizeof(float));
  std::memcpy(exp_avg_sq + i, v, r * sizeof(float));
  if constexpr (kHalfOut) {
    alignas(64) std::uint16_t h[kMaxLanes] = {};
    StoreNarrowed<kHalf>(d, hn::Load(d, p), h, 0);
    std::memcpy(static_cast<std::uint16_t*>(half_out) + i, h, r * sizeof(std::uint16_t));
  }
}

template <DType kGrad, bool kL2>
void AdamSpanOut(const detail::AdamScalars& s, const AdamBuffers& b, std::size_t begin,
                 std::size_t end) {
  if (b.half_out == nullptr) {
    AdamSpan<kGrad, kL2, false, DType::kBFloat16>(s, b, begin, end);
  } else if (b.half_dtype == DType::kBFloat16) {
    AdamSpan<kGrad, kL2, true, DType::kBFloat16>(s, b, begin, end);
  } else {
    AdamSpan<kGrad, kL2, true, DType::kFloat16>(s, b, begin, end);
  }
}

template <DType kGrad>
void AdamSpanGrad(const detail::AdamScalars& s, const AdamBuffers& b, std::size_t begin,
                  std::size_t end) {
  // torch.optim.Adam adds wd * p only when wd != 0 (0 * inf would be NaN).
  if (s.l2 != 0.0f) {
    AdamSpanOut<kGrad, true>(s, b, begin, end);
  } else {
    AdamSpanOut<kGrad, false>(s, b, begin, end);
  }
}

// Elements [begin, end) of one step; the variant is chosen once per tile.
void AdamTile(const detail::AdamScalars& s, const AdamBuffers& b, std::size_t begin,
              std::size_t end) {
  switch (b.grad_dtype) {
    case DType::kFloat32: return AdamSpanGrad<DType::kFloat32>(s, b, begin, end);
    case DType::kBFloat16: return AdamSpanGrad<DType::kBFloat16>(s, b, begin, end);
    case DType::kFloat16: return AdamSpanGrad<DType::kFloat16>(s, b, begin, end);
  }
}

}  // namespace zero::optim::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "optim/simd_dispatch.h"
#include "optim/tiled_run.h"

namespace zero::optim {

HWY_EXPORT(AdamTile);

void adam_step(const AdamHyper& hyper, const AdamBuffers& buffers, ThreadPool* pool) {
  const detail::AdamScalars s = detail::adam_scalars(hyper, buffers);
  if (buffers.n == 0) return;
  const auto tile_fn = detail::pick(HWY_DISPATCH_TABLE(AdamTile));
  detail::run_tiled(pool, buffers.n, kTileElements,
                    [&](std::size_t begin, std::size_t end) { tile_fn(s, buffers, begin, end); });
}

}  // namespace zero::optim
#endif  // HWY_ONCE
