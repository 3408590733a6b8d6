#include "zero/memory/memory_ledger.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "zero/core/error.h"

namespace zero::memory {

std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kNvme: return "nvme";
  }
  return "?";
}

std::string_view kind_name(Kind k) {
  switch (k) {
    case Kind::kHalfParams: return "params";
    case Kind::kGrads: return "grads";
    case Kind::kFp32Master: return "fp32_master";
    case Kind::kMoments: return "moments";
    case Kind::kBuckets: return "buckets";
    case Kind::kPadding: return "padding";
    case Kind::kStaging: return "staging";
    case Kind::kWorkspace: return "workspace";
    case Kind::kFrozen: return "frozen";
  }
  return "?";
}

std::int64_t LedgerSnapshot::model_state_bytes(Tier t) const {
  const auto& c = current[int(t)];
  return c[int(Kind::kHalfParams)] + c[int(Kind::kGrads)] + c[int(Kind::kFp32Master)] +
         c[int(Kind::kMoments)];
}

std::string format_bytes(std::int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (std::int64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
  } else if (bytes >= (1 << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
  } else if (bytes >= (1 << 10)) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / (1 << 10));
  } else {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  }
  return buf;
}

MemoryLedger::Registration& MemoryLedger::Registration::operator=(Registration&& o) noexcept {
  if (this != &o) {
    release();
    ledger_ = o.ledger_;
    tier_ = o.tier_;
    kind_ = o.kind_;
    bytes_ = o.bytes_;
    o.ledger_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void MemoryLedger::Registration::release() {
  if (ledger_ != nullptr) ledger_->remove(tier_, kind_, bytes_);
  ledger_ = nullptr;
  bytes_ = 0;
}

MemoryLedger::Registration MemoryLedger::add(Tier tier, Kind kind, std::int64_t bytes,
                                             std::string_view what, bool check_budget) {
  ZERO_INTERNAL_ASSERT(bytes >= 0);
  std::lock_guard<std::mutex> lock(mu_);
  const int t = int(tier), k = int(kind);
  if (check_budget && tier == Tier::kDevice && device_limit_ > 0) {
    const std::int64_t held = s_.tier_current[t];
    // Rounded for reading, exact bytes for the setting (and for tests).
    auto both = [](std::int64_t b) { return format_bytes(b) + " = " + std::to_string(b) + " bytes"; };
    ZERO_CHECK(held + bytes <= device_limit_, "device memory budget exceeded: allocating ", what,
               " needs ", both(bytes), " but ", both(held), " of the ", both(device_limit_),
               " device_memory_limit are already held (it would need a limit of at least ",
               both(held + bytes),
               "). Raise device_memory_limit, or move state off the device: a higher "
               "zero_optimization.stage partitions more, offload_optimizer.device=\"cpu\" keeps "
               "master weights, moments and gradients on the host, a smaller reduce_bucket_size "
               "shrinks the buckets.");
  }
  s_.current[t][k] += bytes;
  s_.peak[t][k] = std::max(s_.peak[t][k], s_.current[t][k]);
  s_.tier_current[t] += bytes;
  s_.tier_peak[t] = std::max(s_.tier_peak[t], s_.tier_current[t]);
  return Registration(this, tier, kind, bytes);
}

void MemoryLedger::remove(Tier tier, Kind kind, std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.current[int(tier)][int(kind)] -= bytes;
  s_.tier_current[int(tier)] -= bytes;
}

LedgerSnapshot MemoryLedger::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}

void MemoryLedger::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  s_.peak = s_.current;
  s_.tier_peak = s_.tier_current;
}

}  // namespace zero::memory
