// Lion on the GPU: one fused kernel over one contiguous partition of fp32
// master weights in device memory.
//
// The maths, the per-step scalars and the buffer contract are
// optim::lion_step_reference's (zero/optim/lion.h), every floating-point
// operation an explicitly rounded one in the reference's order: meant to be
// bit-identical to the CPU reference on the same inputs, NaN payloads aside
// (tests/cuda checks it). Every buffer in device (or managed) memory, aligned to its element
// size; half_out may be grads itself, as on the CPU.
//
// Asynchronous, as fused_adam_device (device_adam.h): enqueued on
// `cuda_stream` (a cudaStream_t as void*) on the current device. Throws
// zero::Error before enqueuing anything on an invalid argument (as
// optim::lion_step), or if the launch fails. n == 0 does nothing.
#pragma once

#include "zero/optim/lion.h"

namespace zero::cuda {

void fused_lion_device(const optim::LionHyper& hyper, const optim::LionBuffers& buffers, void* cuda_stream);

}  // namespace zero::cuda
