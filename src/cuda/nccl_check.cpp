#include <nccl.h>

#include <string>

#include "cuda_check.h"
#include "zero/core/error.h"

namespace zero::cuda::detail {

void throw_nccl_error(int status, const char* call, const char* file, int line) {
  std::string text = std::string("NCCL call failed: ") + call + " at " + file + ":" +
                     std::to_string(line) + ": " +
                     ncclGetErrorString(static_cast<ncclResult_t>(status));
  // NCCL's last error message of this thread often names the cause.
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') text += std::string(" (") + last + ")";
  text += "; NCCL_DEBUG=WARN in the environment makes NCCL say more";
  throw Error(text);
}

}  // namespace zero::cuda::detail
