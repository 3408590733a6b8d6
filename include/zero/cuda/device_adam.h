// Adam / AdamW on the GPU: one fused kernel over one contiguous partition of
// fp32 master weights in device memory.
//
// The maths is optim::adam_step_reference's (zero/optim/adam.h: torch.optim's
// bias corrections, eps outside the square root), with the per-step scalars
// derived by the same code, and every floating-point operation written as an
// explicitly rounded one (no FMA contraction), in the reference's order. The
// result is meant to be bit-identical to the CPU reference on the same
// inputs; tests/cuda checks it within 1e-6 relative over 20 steps.
//
//   grads       fp32, bf16 or fp16 (grad_dtype), widened to fp32, times grad_scale
//   half_out    optional: the updated params rounded to nearest even (NaN kept
//               a NaN), bf16 or fp16 (half_dtype), bit for bit
//               zero::float_to_bf16 / float_to_fp16 - in the same pass
//
// Buffer contract: params, exp_avg, exp_avg_sq and (if set) half_out hold n
// elements each, in device memory (or managed memory), aligned to their
// element size, and are updated in place; grads holds n elements of
// grad_dtype and is only read. No two buffers may overlap. They belong to the
// kernel until `cuda_stream` has passed it.
//
// Asynchronous: the kernel is enqueued on `cuda_stream` (a cudaStream_t as
// void*; nullptr is the legacy default stream) on the current device, and the
// call returns. Throws zero::Error before enqueuing anything on an invalid
// argument (as optim::adam_step: null buffer with n > 0, step < 1, half_dtype
// fp32 with half_out set), or if the launch fails; a fault inside the kernel
// shows at the next synchronisation of the stream. n == 0 does nothing (and
// makes no CUDA call).
#pragma once

#include <cstddef>

#include "zero/core/dtype.h"
#include "zero/optim/adam.h"

namespace zero::cuda {

void fused_adam_device(const optim::AdamHyper& hyper, float* params, const void* grads,
                       DType grad_dtype, float* exp_avg, float* exp_avg_sq, std::size_t n,
                       float grad_scale, void* half_out, DType half_dtype, void* cuda_stream);

}  // namespace zero::cuda
