// CPU Lion: the SIMD kernel, compiled once per target, and lion_step().
// The loop of one_state_span-inl.h, shared with Adagrad (one pass with
// software prefetch, the tail on copies), no FMA contraction so every target
// equals lion_step_reference bit for bit. Lion moves 4 bytes of state per
// element fewer than Adam, and its arithmetic is a handful of multiplies and
// a sign: bandwidth-bound.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optim/lion_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <limits>

#include <hwy/highway.h>

#include "optim/half_simd-inl.h"
#include "optim/one_state_span-inl.h"
#include "zero/optim/detail/step_scalars.h"
#include "zero/optim/lion.h"

HWY_BEFORE_NAMESPACE();
namespace zero::optim::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <DType kGrad, bool kHalfOut, DType kHalf>
void LionSpan(const detail::LionScalars& s, const LionBuffers& b, std::size_t begin, std::size_t end) {
  const hn::ScalableTag<float> d;
  const auto grad_scale = hn::Set(d, s.grad_scale);
  const auto lr = hn::Set(d, s.lr);
  const auto decay = hn::Set(d, s.decay);
  const auto beta1 = hn::Set(d, s.beta1);
  const auto one_minus_beta1 = hn::Set(d, s.one_minus_beta1);
  const auto beta2 = hn::Set(d, s.beta2);
  const auto one_minus_beta2 = hn::Set(d, s.one_minus_beta2);
  const auto zero = hn::Zero(d);
  const auto one = hn::Set(d, 1.0f);
  const auto nan = hn::Set(d, std::numeric_limits<float>::quiet_NaN());

  // One vector at element i (grads and half_out may be one buffer: see
  // one_state_span-inl.h).
  const auto update = [&](float* HWY_RESTRICT params, const void* grads,
                          float* HWY_RESTRICT exp_avg, void* half_out,
                          std::size_t i) HWY_ATTR {
    const auto g = hn::Mul(LoadWidened<kGrad>(d, grads, i), grad_scale);  // g = grad * grad_scale
    const auto m = hn::LoadU(d, exp_avg + i);
    const auto c = hn::Add(hn::Mul(beta1, m), hn::Mul(one_minus_beta1, g));  // c = b1*m + (1-b1)*g
    // sign(c): 0 at +-0, NaN where c is not finite (see lion.h).
    const auto sign = hn::IfThenElse(hn::IsFinite(c), hn::IfThenElseZero(hn::Ne(c, zero), hn::CopySign(one, c)), nan);
    const auto p = hn::Sub(hn::Mul(hn::LoadU(d, params + i), decay), hn::Mul(lr, sign));  // p*decay - lr*sign
    hn::StoreU(p, d, params + i);
    hn::StoreU(hn::Add(hn::Mul(beta2, m), hn::Mul(one_minus_beta2, g)), d, exp_avg + i);  // m = b2*m + (1-b2)*g
    if constexpr (kHalfOut) StoreNarrowed<kHalf>(d, p, half_out, i);
  };

  OneStateSpan<kGrad, kHalfOut>(b.params, b.grads, b.exp_avg, b.half_out, b.n, begin, end, update);
}

template <DType kGrad>
void LionSpanOut(const detail::LionScalars& s, const LionBuffers& b, std::size_t begin, std::size_t end) {
  if (b.half_out == nullptr) {
    LionSpan<kGrad, false, DType::kBFloat16>(s, b, begin, end);
  } else if (b.half_dtype == DType::kBFloat16) {
    LionSpan<kGrad, true, DType::kBFloat16>(s, b, begin, end);
  } else {
    LionSpan<kGrad, true, DType::kFloat16>(s, b, begin, end);
  }
}

void LionTile(const detail::LionScalars& s, const LionBuffers& b, std::size_t begin, std::size_t end) {
  switch (b.grad_dtype) {
    case DType::kFloat32: return LionSpanOut<DType::kFloat32>(s, b, begin, end);
    case DType::kBFloat16: return LionSpanOut<DType::kBFloat16>(s, b, begin, end);
    case DType::kFloat16: return LionSpanOut<DType::kFloat16>(s, b, begin, end);
  }
}

}  // namespace zero::optim::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "optim/simd_dispatch.h"
#include "optim/tiled_run.h"

namespace zero::optim {

HWY_EXPORT(LionTile);

void lion_step(const LionHyper& hyper, const LionBuffers& buffers, ThreadPool* pool) {
  const detail::LionScalars s = detail::lion_scalars(hyper, buffers);
  if (buffers.n == 0) return;
  const auto tile_fn = detail::pick(HWY_DISPATCH_TABLE(LionTile));
  detail::run_tiled(pool, buffers.n, kTileElements,
                    [&](std::size_t begin, std::size_t end) { tile_fn(s, buffers, begin, end); });
}

}  // namespace zero::optim
#endif  // HWY_ONCE
