// CUDA_CHECK(call) / NCCL_CHECK(call): run a CUDA runtime or NCCL call that
// returns a status and, unless it is success (0 for both), throw zero::Error
// naming the call, file:line and the library's error name and text, e.g.
//
//   CUDA call failed: cudaMalloc(&ptr_, bytes) at src/cuda/device_buffer.cpp:12:
//   cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA
//   runtime version
//
// Internal to zero_cuda (llm.c's cudaCheck/ncclCheck, but throwing: errors
// become exceptions at the library boundary, STYLE.md item 4). The macros
// compare the status as an int, so this header includes no CUDA header.
#pragma once

namespace zero::cuda::detail {

// Also reads (and so clears) CUDA's last error, so that a later
// cudaGetLastError() after a kernel launch does not report this one again.
// A sticky error (a kernel fault) cannot be cleared: every later call fails.
[[noreturn]] void throw_cuda_error(int status, const char* call, const char* file, int line);
// Defined only when zero_cuda is built with NCCL (nccl_check.cpp).
[[noreturn]] void throw_nccl_error(int status, const char* call, const char* file, int line);

}  // namespace zero::cuda::detail

#define CUDA_CHECK(call)                                                                        \
  do {                                                                                          \
    const int zero_cuda_check_rc_ = static_cast<int>(call);                                     \
    if (__builtin_expect(zero_cuda_check_rc_ != 0, 0)) {                                        \
      ::zero::cuda::detail::throw_cuda_error(zero_cuda_check_rc_, #call, __FILE__, __LINE__);   \
    }                                                                                           \
  } while (0)

#define NCCL_CHECK(call)                                                                        \
  do {                                                                                          \
    const int zero_nccl_check_rc_ = static_cast<int>(call);                                     \
    if (__builtin_expect(zero_nccl_check_rc_ != 0, 0)) {                                        \
      ::zero::cuda::detail::throw_nccl_error(zero_nccl_check_rc_, #call, __FILE__, __LINE__);   \
    }                                                                                           \
  } while (0)
