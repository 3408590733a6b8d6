// CPU Adagrad: the SIMD kernel, compiled once per target, and adagrad_step().
// One pass with software prefetch and the tail on copies (the loop of
// one_state_span-inl.h, shared with Lion), no FMA contraction so every target
// equals adagrad_step_reference bit for bit. The half copy is rounded in the same loop body: Adagrad's
// chain is short (one sqrt, one divide), so it needs no chunking.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optim/adagrad_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "optim/half_simd-inl.h"
#include "optim/one_state_span-inl.h"
#include "zero/optim/detail/step_scalars.h"
#include "zero/optim/adagrad.h"

HWY_BEFORE_NAMESPACE();
namespace zero::optim::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <DType kGrad, bool kL2, bool kHalfOut, DType kHalf>
void AdagradSpan(const detail::AdagradScalars& s, const AdagradBuffers& b, std::size_t begin,
                 std::size_t end) {
  const hn::ScalableTag<float> d;
  const auto grad_scale = hn::Set(d, s.grad_scale);
  const auto l2 = hn::Set(d, s.l2);
  const auto clr = hn::Set(d, s.clr);
  const auto eps = hn::Set(d, s.eps);

  // One vector at element i (grads and half_out may be one buffer: see
  // one_state_span-inl.h).
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

  OneStateSpan<kGrad, kHalfOut>(b.params, b.grads, b.state_sum, b.half_out, b.n, begin, end, update);
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
