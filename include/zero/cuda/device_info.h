// The CUDA devices this process sees, and the calling thread's current one.
//
// zero_cuda (this folder) is the only place in zerocpp that talks to CUDA; its
// headers include no CUDA header, and streams are passed as void* (a
// cudaStream_t; nullptr is the legacy default stream). See docs/gpu.md.
#pragma once

namespace zero::cuda {

// How many CUDA devices the process can use: 0 when there is no driver, no
// device, or the runtime fails to initialise. Never throws, and clears the
// error it may leave behind, so it is safe as a "should I skip?" probe.
int cuda_device_count() noexcept;

// cudaSetDevice / cudaGetDevice for the calling thread. Throw zero::Error.
void set_cuda_device(int device);
int current_cuda_device();

// Blocks until every stream of the current device is idle (cudaDeviceSynchronize).
void cuda_device_synchronize();

}  // namespace zero::cuda
