#include "cuda_check.h"

#include <cuda_runtime_api.h>

#include <string>

#include "zero/core/error.h"

namespace zero::cuda::detail {

void throw_cuda_error(int status, const char* call, const char* file, int line) {
  const auto error = static_cast<cudaError_t>(status);
  (void)cudaGetLastError();  // clear a non-sticky error (see the header)
  throw Error(std::string("CUDA call failed: ") + call + " at " + file + ":" +
              std::to_string(line) + ": " + cudaGetErrorName(error) + ": " +
              cudaGetErrorString(error));
}

}  // namespace zero::cuda::detail
