// Stage 3's trick for one bucket of parameters: the parameters are views of
// one tensor whose storage is freed when the bucket is released and
// refilled when it is gathered again. Views, autograd's saved tensors and
// the module's parameters all keep pointing at the same StorageImpl, so
// they stay valid; the bytes are written through raw pointers, so no
// version counter moves and backward does not see "modified by an inplace
// operation" (PLATFORM.md). Private to zero_engine.
#pragma once

#include <cstddef>

#include <ATen/Tensor.h>

namespace zero::detail {

class BucketStorage {
 public:
  BucketStorage() = default;
  // `t`: the bucket's tensor (contiguous, owns its storage from offset 0).
  explicit BucketStorage(at::Tensor t);

  const at::Tensor& tensor() const { return t_; }
  bool held() const { return held_; }
  std::size_t nbytes() const { return nbytes_; }
  // Frees the bytes (the storage keeps its identity, with none).
  void release();
  // Allocates them again (uninitialised) from the storage's allocator.
  void refill();
  // A tensor over `n` elements from element `offset` that autograd does not
  // track (its own version counter): where collectives and copies write.
  at::Tensor raw(std::size_t offset, std::size_t n) const;

 private:
  at::Tensor t_;
  std::size_t nbytes_ = 0;
  bool held_ = true;
};

}  // namespace zero::detail
