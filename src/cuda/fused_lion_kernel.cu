// The fused Lion kernel: one pass over params, grads and m (and the optional
// half copy), one element per thread in a grid-stride loop.
//
// Bit-for-bit the CPU reference (src/optim/lion_reference.cpp), NaN payloads
// aside (the device writes its own NaN): the same operations in the same
// order, each an explicitly rounded intrinsic that nvcc never contracts into
// an FMA (see fused_adam_kernel.cu).
#include <cuda_runtime.h>

#include <cstdint>

#include "fused_lion_kernel.h"
#include "half_device.cuh"

namespace zero::cuda::detail {
namespace {

// sign(c) as lion.h defines it: 0 at +-0, NaN where c is not finite.
__device__ __forceinline__ float lion_sign(float c) {
  if (!isfinite(c)) return __int_as_float(0x7fc00000);
  return c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
}

template <GradKind kGrad, HalfOutKind kHalf>
__global__ void __launch_bounds__(kFusedThreads) fused_lion_kernel(const FusedLionArgs a) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n;
       i += stride) {
    const float g = __fmul_rn(load_grad<kGrad>(a.grads, i), a.grad_scale);
    const float m = a.exp_avg[i];
    const float c = __fadd_rn(__fmul_rn(a.beta1, m), __fmul_rn(a.one_minus_beta1, g));
    const float p = __fsub_rn(__fmul_rn(a.params[i], a.decay), __fmul_rn(a.lr, lion_sign(c)));
    a.params[i] = p;
    a.exp_avg[i] = __fadd_rn(__fmul_rn(a.beta2, m), __fmul_rn(a.one_minus_beta2, g));
    store_half<kHalf>(a.half_out, i, p);
  }
}

}  // namespace

int launch_fused_lion(const FusedLionArgs& args, void* stream_handle) {
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  dispatch_kinds(args.grad_kind, args.half_kind, [&](auto grad, auto half) {
    fused_lion_kernel<decltype(grad)::value, decltype(half)::value><<<fused_blocks(args.n), kFusedThreads, 0, stream>>>(args);
  });
  // A launch reports its configuration errors here, not by a return value.
  return static_cast<int>(cudaGetLastError());
}

}  // namespace zero::cuda::detail
