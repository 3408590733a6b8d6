// The fused Adam/AdamW kernel: one pass over params, grads, m, v (and the
// optional half copy), one element per thread in a grid-stride loop.
//
// Bit-for-bit the CPU reference (src/optim/adam_reference.cpp): the same
// operations in the same order, each written as an explicitly rounded
// intrinsic (__fmul_rn, __fadd_rn, ...). nvcc contracts a * b + c into an FMA
// by default (--fmad=true), which rounds once instead of twice; zero_optim,
// where the reference lives, builds with -ffp-contract=off. The _rn
// intrinsics are never contracted, whatever the flags. Denormals are kept
// (nvcc's default -ftz=false), as on the CPU.
#include <cuda_runtime.h>

#include <cstdint>

#include "fused_adam_kernel.h"
#include "half_device.cuh"

namespace zero::cuda::detail {
namespace {

template <GradKind kGrad, HalfOutKind kHalf>
__global__ void __launch_bounds__(kFusedThreads) fused_adam_kernel(const FusedAdamArgs a) {
  const bool l2 = a.l2 != 0.0f;  // torch.optim.Adam adds wd * p only when wd != 0
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n;
       i += stride) {
    float p = a.params[i];
    float g = __fmul_rn(load_grad<kGrad>(a.grads, i), a.grad_scale);
    if (l2) {
      g = __fadd_rn(g, __fmul_rn(a.l2, p));  // Adam (L2)
    } else {
      p = __fmul_rn(p, a.decay);             // AdamW: p *= 1 - lr * wd
    }
    const float m = __fadd_rn(__fmul_rn(a.exp_avg[i], a.beta1), __fmul_rn(a.one_minus_beta1, g));
    const float v = __fadd_rn(__fmul_rn(a.exp_avg_sq[i], a.beta2),
                              __fmul_rn(__fmul_rn(a.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), a.inv_sqrt_bc2), a.eps);
    p = __fsub_rn(p, __fdiv_rn(__fmul_rn(a.step_size, m), denom));  // LibTorch's addcdiv order
    a.params[i] = p;
    a.exp_avg[i] = m;
    a.exp_avg_sq[i] = v;
    store_half<kHalf>(a.half_out, i, p);
  }
}

}  // namespace

int launch_fused_adam(const FusedAdamArgs& args, void* stream_handle) {
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  dispatch_kinds(args.grad_kind, args.half_kind, [&](auto grad, auto half) {
    fused_adam_kernel<decltype(grad)::value, decltype(half)::value><<<fused_blocks(args.n), kFusedThreads, 0, stream>>>(args);
  });
  // A launch reports its configuration errors here, not by a return value.
  return static_cast<int>(cudaGetLastError());
}

}  // namespace zero::cuda::detail
