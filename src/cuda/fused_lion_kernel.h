// The launcher of the fused Lion kernel (fused_lion_kernel.cu), called by
// fused_lion_device (device_lion.cpp), which checks the arguments and derives
// the per-step scalars with optim's own code. Plain C++17, as
// fused_adam_kernel.h.
#pragma once

#include <cstddef>

#include "kernel_dtypes.h"

namespace zero::cuda::detail {

struct FusedLionArgs {
  float* params = nullptr;
  const void* grads = nullptr;
  GradKind grad_kind = GradKind::kFloat32;
  float* exp_avg = nullptr;
  std::size_t n = 0;
  void* half_out = nullptr;
  HalfOutKind half_kind = HalfOutKind::kNone;
  // optim::detail::LionScalars (zero/optim/detail/step_scalars.h), field for field.
  float grad_scale = 1.0f;
  float lr = 0.0f;
  float decay = 1.0f;
  float beta1 = 0.0f;
  float one_minus_beta1 = 0.0f;
  float beta2 = 0.0f;
  float one_minus_beta2 = 0.0f;
};

// Enqueues the kernel on `stream` (a cudaStream_t) and returns the launch's
// cudaError_t as an int (0: enqueued). args.n must be > 0.
int launch_fused_lion(const FusedLionArgs& args, void* stream);

}  // namespace zero::cuda::detail
