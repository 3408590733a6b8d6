// Which compiled SIMD target the kernels run on (see simd_target.h and
// simd_dispatch.h).
#include "zero/optim/simd_target.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include <hwy/highway.h>
#include <hwy/targets.h>

#include "simd_dispatch.h"
#include "zero/core/error.h"

namespace zero::optim {
namespace {

// Compiled and supported targets, best first (on every architecture Highway
// gives better targets lower bits).
std::vector<std::int64_t> usable_targets() {
  std::vector<std::int64_t> out;
  for (std::int64_t bits = hwy::SupportedTargets() & HWY_TARGETS; bits != 0; bits &= bits - 1) {
    out.push_back(bits & -bits);
  }
  return out;
}

std::string valid_names() {
  std::string s;
  for (std::int64_t t : usable_targets()) {
    if (!s.empty()) s += ", ";
    s += hwy::TargetName(t);
  }
  return s;
}

std::int64_t target_by_name(const std::string& name, const char* origin) {
  for (std::int64_t t : usable_targets()) {
    if (name == hwy::TargetName(t)) return t;
  }
  ZERO_CHECK(false, origin, "'", name, "' is not a SIMD target compiled into zerocpp and supported ",
             "by this CPU; valid: ", valid_names(), " (or empty for the best)");
  return 0;
}

std::int64_t best_target() {
  const std::vector<std::int64_t> targets = usable_targets();
  ZERO_INTERNAL_ASSERT(!targets.empty(), "Highway reports no usable SIMD target");
  return targets.front();
}

// 0 until resolved; then the target bit every kernel call uses.
std::atomic<std::int64_t> g_active{0};
std::mutex g_resolve_mutex;

}  // namespace

namespace detail {

std::int64_t active_target() {
  std::int64_t t = g_active.load(std::memory_order_acquire);
  if (t != 0) return t;
  std::lock_guard<std::mutex> lock(g_resolve_mutex);
  t = g_active.load(std::memory_order_relaxed);
  if (t != 0) return t;
  // ZERO_SIMD_TARGET is read once; a bad value throws here (and again at the
  // next call, since nothing was resolved), naming the valid targets.
  const char* env = std::getenv("ZERO_SIMD_TARGET");
  t = (env != nullptr && *env != '\0') ? target_by_name(env, "ZERO_SIMD_TARGET=") : best_target();
  g_active.store(t, std::memory_order_release);
  return t;
}

}  // namespace detail

std::vector<std::string> available_simd_targets() {
  std::vector<std::string> names;
  for (std::int64_t t : usable_targets()) names.emplace_back(hwy::TargetName(t));
  return names;
}

std::string active_simd_target() { return hwy::TargetName(detail::active_target()); }

void force_simd_target(const std::string& name) {
  const std::int64_t t = name.empty() ? best_target() : target_by_name(name, "SIMD target ");
  std::lock_guard<std::mutex> lock(g_resolve_mutex);
  g_active.store(t, std::memory_order_release);
}

}  // namespace zero::optim
