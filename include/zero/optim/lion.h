// CPU Lion over one contiguous partition of fp32 master weights: the sign
// of an interpolated momentum (Chen et al. 2023, "Symbolic Discovery of
// Optimization Algorithms", Program 1; DeepSpeed's "Lion"):
//
//   g  = grad * grad_scale                      (grad widened to fp32 first)
//   c  = beta1 * m + (1 - beta1) * g
//   p  = p * (1 - lr * weight_decay) - lr * sign(c)     (decoupled decay)
//   m  = beta2 * m + (1 - beta2) * g
//
// One moment (m) instead of Adam's two: 4 bytes of optimizer state per
// parameter fewer, in host memory when the optimizer is offloaded. No bias
// correction, no eps. sign(0) = 0, as torch.sign, so an element whose
// gradient and momentum are both zero (padding, an unused parameter) moves
// only by its weight decay. A non-finite c (a NaN or infinite gradient, or a
// momentum an earlier one made infinite) makes its parameter NaN, as Adam's
// kernel does: torch.sign would step it by +-lr and keep an infinite
// momentum that goes on stepping it silently.
//
// The per-step scalars (1 - lr*wd, 1 - beta) are computed once in double and
// rounded to float, as LibTorch does with its double options; the
// per-element work is fp32. Buffer contract as for AdamBuffers (adam.h),
// with exp_avg the one state: half_out may be grads itself.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/core/dtype.h"

namespace zero::optim {

class ThreadPool;  // zero/optim/thread_pool.h

// DeepSpeed's defaults (DeepSpeedCPULion, FusedLion). The paper suggests
// betas (0.9, 0.99) and a rate 3-10x below AdamW's, with a weight decay as
// much larger.
struct LionHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float weight_decay = 0.0f;
};

struct LionBuffers {
  float* params = nullptr;       // n fp32, updated in place
  const void* grads = nullptr;   // n of grad_dtype, read only
  DType grad_dtype = DType::kFloat32;
  float* exp_avg = nullptr;      // n fp32 (m), updated in place
  std::size_t n = 0;
  float grad_scale = 1.0f;       // every grad is multiplied by this first
  void* half_out = nullptr;      // optional: n of half_dtype, the updated params rounded
  DType half_dtype = DType::kBFloat16;  // kBFloat16 or kFloat16
};

// One Lion step on the fastest SIMD target, spread over `pool` in tiles of
// kTileElements (nullptr: the calling thread). Throws zero::Error on an
// invalid argument (a null buffer with n > 0, half_dtype kFloat32).
void lion_step(const LionHyper& hyper, const LionBuffers& buffers, ThreadPool* pool = nullptr);

// The scalar reference: the same maths, one element at a time, in the same
// order of operations. Tests compare every SIMD target to it bit for bit.
void lion_step_reference(const LionHyper& hyper, const LionBuffers& buffers);

}  // namespace zero::optim
