#include "device_context.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "zero/core/pinned_host_allocator.h"

namespace zero::detail {

c10::Stream DeviceContext::current_stream() const {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

c10::Stream DeviceContext::side_stream() const {
  return c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device);
}

std::shared_ptr<c10::Event> DeviceContext::record_on(const c10::Stream& stream) const {
  auto ev = std::make_shared<c10::Event>(device.type());
  ev->record(stream);
  return ev;
}

at::Tensor DeviceContext::host_tensor(std::size_t n, c10::ScalarType dtype) const {
  const auto opts = at::TensorOptions().dtype(dtype);
  const auto len = static_cast<std::int64_t>(n);
  if (!on_accelerator()) return at::empty({len}, opts);
  if (const PinnedHostAllocator* a = pinned_host_allocator()) {
    void* ptr = a->allocate(n * c10::elementSize(dtype));
    auto release = a->release;
    return at::from_blob(ptr, {len}, [release](void* q) { release(q); }, opts);
  }
  return at::empty({len}, opts.pinned_memory(true));
}

}  // namespace zero::detail
