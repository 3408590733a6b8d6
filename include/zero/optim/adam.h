// CPU Adam and AdamW over one contiguous partition of fp32 master weights.
//
// The maths is torch.optim's, step for step (bias corrections, eps outside
// the square root):
//
//   g   = grad * grad_scale                     (grad widened to fp32 first)
//   Adam (L2):  g += weight_decay * p   (if wd != 0)      (torch.optim.Adam)
//   AdamW:      p *= 1 - lr * weight_decay                (torch.optim.AdamW)
//   m   = beta1 * m + (1 - beta1) * g
//   v   = beta2 * v + (1 - beta2) * g * g
//   bc1 = 1 - beta1^step,  bc2 = 1 - beta2^step
//   p  -= (lr / bc1 * m) / (sqrt(v) / sqrt(bc2) + eps)
//
// The per-step scalars (1 - lr*wd, 1 - beta, lr/bc1, 1/sqrt(bc2)) are computed
// once in double and rounded to float, as LibTorch does with its double
// options; the per-element work is fp32. sqrt(v) / sqrt(bc2) is computed as
// sqrt(v) * (1/sqrt(bc2)) (one division per element fewer; within an ulp or
// so of LibTorch's division), and the last line keeps LibTorch's addcdiv
// order, (value * m) / denom. See docs/optim.md.
//
// Buffer contract: params, exp_avg and exp_avg_sq hold n fp32 elements each
// and are updated in place; grads holds n elements of grad_dtype and is only
// read; half_out (if set) holds n elements of half_dtype and is only written. Pointers need no alignment. No two of the
// buffers may overlap, with one exception: half_out may be grads itself
// (the same n elements, grad_dtype == half_dtype), each gradient then
// replaced by its updated parameter (the engine's GPU offload does this to
// keep one host buffer per step for both directions). Each element is updated
// independently, so a NaN or inf grad poisons only its own element.
//
// One step is one pass over memory: each stream is read once and written once
// (28 bytes per parameter with fp32 grads; see docs/PERFORMANCE.md), so the
// kernel runs at the memory-bandwidth ceiling rather than at the FPU's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/core/dtype.h"

namespace zero::optim {

class ThreadPool;  // zero/optim/thread_pool.h; kTileElements is there too

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  // true: AdamW (torch.optim.AdamW, decoupled decay);
  // false: Adam with L2 (torch.optim.Adam, weight_decay * p added to the grad).
  bool decoupled_weight_decay = true;
  // Divide the moments by (1 - beta^t) (torch's Adam always does; DeepSpeed's
  // bias_correction: false does not).
  bool bias_correction = true;
  // The step number AFTER increment (1 for the first step), per parameter
  // group; the bias corrections use it. Must be >= 1.
  std::int64_t step = 1;
};

// One contiguous partition. All pointers may be unaligned.
struct AdamBuffers {
  float* params = nullptr;          // n fp32, updated in place
  const void* grads = nullptr;      // n of grad_dtype, read only
  DType grad_dtype = DType::kFloat32;
  float* exp_avg = nullptr;         // n fp32 (m), updated in place
  float* exp_avg_sq = nullptr;      // n fp32 (v), updated in place
  std::size_t n = 0;
  // Every grad is multiplied by this before use (the engine folds 1/loss_scale,
  // 1/world and the clip coefficient into it).
  float grad_scale = 1.0f;
  // Optional: also write the updated params, rounded to nearest even with NaN
  // kept a NaN (zero::float_to_bf16 / zero::float_to_fp16 bit for bit), to
  // this buffer of n half_dtype elements, in the same pass.
  void* half_out = nullptr;
  DType half_dtype = DType::kBFloat16;  // kBFloat16 or kFloat16
};

// One Adam/AdamW step on the fastest SIMD target (see simd_target.h), spread
// over `pool` in tiles of kTileElements; nullptr runs on the calling thread.
// Throws zero::Error on an invalid argument (null buffer with n > 0, step < 1,
// half_dtype kFloat32).
void adam_step(const AdamHyper& hyper, const AdamBuffers& buffers, ThreadPool* pool = nullptr);

// The scalar reference: the same maths, one element at a time, on the calling
// thread. Tests compare every SIMD target to it.
void adam_step_reference(const AdamHyper& hyper, const AdamBuffers& buffers);

}  // namespace zero::optim
