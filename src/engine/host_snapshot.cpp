#include "host_snapshot.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include <ATen/ops/from_blob.h>

#include "zero/core/error.h"

namespace zero::detail {

at::Tensor host_snapshot(const at::Tensor& t) {
  const at::Tensor src = t.contiguous();
  const std::size_t bytes = src.nbytes();
  if (bytes < (std::size_t{2} << 20)) return src.device().is_cpu() ? src.clone() : src.to(at::kCPU);
  // MAP_POPULATE: the pages faulted in by the kernel in one go.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  const int e = errno;
  ZERO_CHECK(p != MAP_FAILED, "out of host memory for the checkpoint snapshot (", bytes, " bytes): ", std::strerror(e),
             "; save synchronously (async=false) or free host memory");
  at::Tensor out = at::from_blob(
      p, src.sizes(), [bytes](void* q) { ::munmap(q, bytes); }, at::TensorOptions().dtype(src.scalar_type()));
  out.copy_(src);
  return out;
}

}  // namespace zero::detail
