// The CUDA devices this process sees, and the calling thread's current one.
//
// zero_cuda (this folder) is the only place in zerocpp that talks to CUDA; its
// headers include no CUDA header, and streams are passed as void* (a
// cudaStream_t; nullptr is the legacy default stream). See docs/gpu.md.
#pragma once

#include <string>

namespace zero::cuda {

// How many CUDA devices the process can use: 0 when there is no driver, no
// device, or the runtime fails to initialise. Never throws, and clears the
// error it may leave behind, so it is safe as a "should I skip?" probe.
int cuda_device_count() noexcept;

// Why cuda_device_count() is 0: "" when CUDA answered (no device), else the
// error cudaGetDeviceCount returned, by name and text (e.g.
// "cudaErrorInsufficientDriver: CUDA driver version is insufficient ...").
// Tests use it to tell "no GPU here" from "a GPU whose driver fails".
std::string cuda_device_count_error();

// Whether this machine has an NVIDIA kernel driver loaded (its device node
// or /proc entry exists), whatever CUDA says.
bool nvidia_driver_present();

// cudaSetDevice / cudaGetDevice for the calling thread. Throw zero::Error.
void set_cuda_device(int device);
int current_cuda_device();

// Blocks until every stream of the current device is idle (cudaDeviceSynchronize).
void cuda_device_synchronize();

}  // namespace zero::cuda
