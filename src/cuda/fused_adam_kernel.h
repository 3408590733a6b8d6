// The launcher of the fused Adam kernel (fused_adam_kernel.cu), called by
// fused_adam_device (device_adam.cpp), which checks the arguments and derives
// the per-step scalars with optim's own code.
//
// Plain C++17 with no zerocpp include: nvcc compiles the .cu that includes
// this, in C++17 (CMake 3.25 knows no CUDA C++20 dialect), and must not depend
// on what the C++20 headers of the rest of zerocpp may use.
#pragma once

#include <cstddef>

#include "kernel_dtypes.h"

namespace zero::cuda::detail {

struct FusedAdamArgs {
  float* params = nullptr;
  const void* grads = nullptr;
  GradKind grad_kind = GradKind::kFloat32;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  std::size_t n = 0;
  void* half_out = nullptr;
  HalfOutKind half_kind = HalfOutKind::kNone;
  // optim::detail::AdamScalars (zero/optim/detail/step_scalars.h), field for field.
  float grad_scale = 1.0f;
  float l2 = 0.0f;
  float decay = 1.0f;
  float beta1 = 0.0f;
  float one_minus_beta1 = 0.0f;
  float beta2 = 0.0f;
  float one_minus_beta2 = 0.0f;
  float inv_sqrt_bc2 = 1.0f;
  float eps = 0.0f;
  float step_size = 0.0f;
};

// Enqueues the kernel on `stream` (a cudaStream_t) and returns the launch's
// cudaError_t as an int (0: enqueued). args.n must be > 0.
int launch_fused_adam(const FusedAdamArgs& args, void* stream);

}  // namespace zero::cuda::detail
