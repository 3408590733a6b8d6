#include "zero/optim/device_adam_registry.h"

#include <atomic>

namespace zero::optim {
namespace {

// A function-local static: registrars run during static initialisation of
// other translation units, in an order nothing guarantees.
std::atomic<DeviceAdamFn>& slot() {
  static std::atomic<DeviceAdamFn> fn{nullptr};
  return fn;
}

}  // namespace

void register_device_adam(DeviceAdamFn fn) { slot().store(fn); }
DeviceAdamFn device_adam() { return slot().load(); }

}  // namespace zero::optim
