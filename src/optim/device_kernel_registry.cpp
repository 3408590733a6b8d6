#include "zero/optim/device_kernel_registry.h"

#include <atomic>

namespace zero::optim {
namespace {

// Function-local statics: registrars run during static initialisation of
// other translation units, in an order nothing guarantees.
std::atomic<DeviceAdamFn>& adam_slot() {
  static std::atomic<DeviceAdamFn> fn{nullptr};
  return fn;
}
std::atomic<DeviceLionFn>& lion_slot() {
  static std::atomic<DeviceLionFn> fn{nullptr};
  return fn;
}

}  // namespace

void register_device_adam(DeviceAdamFn fn) { adam_slot().store(fn); }
void register_device_lion(DeviceLionFn fn) { lion_slot().store(fn); }
DeviceAdamFn device_adam() { return adam_slot().load(); }
DeviceLionFn device_lion() { return lion_slot().load(); }

}  // namespace zero::optim
