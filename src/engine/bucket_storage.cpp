#include "bucket_storage.h"

#include <ATen/ops/from_blob.h>
#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>

#include "zero/core/error.h"

namespace zero::detail {

BucketStorage::BucketStorage(at::Tensor t) : t_(std::move(t)), nbytes_(t_.nbytes()) {
  ZERO_INTERNAL_ASSERT(t_.is_contiguous() && t_.storage_offset() == 0 && t_.storage().nbytes() == nbytes_);
}

void BucketStorage::release() {
  if (!held_) return;
  c10::StorageImpl* s = t_.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
  held_ = false;
}

void BucketStorage::refill() {
  if (held_) return;
  c10::StorageImpl* s = t_.storage().unsafeGetStorageImpl();
  ZERO_INTERNAL_ASSERT(s->allocator() != nullptr);
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes_));
  s->set_nbytes(nbytes_);
  held_ = true;
}

at::Tensor BucketStorage::raw(std::size_t offset, std::size_t n) const {
  ZERO_INTERNAL_ASSERT(held_ && (offset + n) * t_.element_size() <= nbytes_);
  auto* p = static_cast<char*>(t_.storage().mutable_data()) + offset * t_.element_size();
  return at::from_blob(p, {static_cast<std::int64_t>(n)}, t_.options());
}

}  // namespace zero::detail
