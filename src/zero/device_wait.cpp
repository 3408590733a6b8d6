#include "zero/zero/device_wait.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace zero {

void* current_stream_handle(const c10::Device& device) {
  if (device.is_cpu()) return nullptr;
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device).native_handle();
}

}  // namespace zero
