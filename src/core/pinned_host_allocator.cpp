#include "zero/core/pinned_host_allocator.h"

#include <atomic>

namespace zero {
namespace {

struct Slot {
  PinnedHostAllocator allocator{};
  std::atomic<bool> set{false};
};

Slot& slot() {
  static Slot s;  // function-local: registrars run during static initialisation
  return s;
}

}  // namespace

PinnedHostOutOfMemory::PinnedHostOutOfMemory(std::size_t bytes)
    : bytes_(bytes),
      what_("out of pinned host memory: tried to allocate " + std::to_string(bytes) + " bytes of page-locked memory") {}

void register_pinned_host_allocator(PinnedHostAllocator allocator) {
  slot().allocator = allocator;  // registrations happen before main(), on one thread
  slot().set.store(true);
}

const PinnedHostAllocator* pinned_host_allocator() {
  return slot().set.load() ? &slot().allocator : nullptr;
}

}  // namespace zero
