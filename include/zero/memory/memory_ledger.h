// Accounting of every buffer zerocpp owns, by tier and kind, current and peak.
//
// A buffer registers its bytes when it is allocated and unregisters them when
// it is freed (MemoryLedger::Registration is the RAII handle). The ledger is
// what the tools print and what the formula tests compare with docs/design.md's
// table. The device tier may carry a budget (config device_memory_limit):
// registering past it throws a zero::Error that says what was asked, what is
// held, and which setting would fit.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace zero::memory {

enum class Tier : std::uint8_t { kDevice, kHost, kNvme };
inline constexpr int kNumTiers = 3;

enum class Kind : std::uint8_t {
  kHalfParams,   // the model's parameters in the training precision (bf16/fp16, or fp32 without mixed precision)
  kGrads,        // gradients (full or the rank's partition)
  kFp32Master,   // fp32 master weights (the rank's partition)
  kMoments,      // optimizer state (Adam m and v, Adagrad sum, Lion m)
  kBuckets,      // communication buckets (constant size, ZeRO-R)
  kPadding,      // padding that makes partitions equal and aligned
  kStaging,      // copy buffers between tiers (offload)
  kWorkspace,    // an optimizer step's scratch (Muon: its whole matrices, gather windows, Newton-Schulz products)
  kFrozen,       // the frozen parameters and the module's buffers: whole on every rank, at every stage
};
inline constexpr int kNumKinds = 9;

std::string_view tier_name(Tier t);
std::string_view kind_name(Kind k);

struct LedgerSnapshot {
  std::array<std::array<std::int64_t, kNumKinds>, kNumTiers> current{};
  std::array<std::array<std::int64_t, kNumKinds>, kNumTiers> peak{};  // per tier and kind
  std::array<std::int64_t, kNumTiers> tier_current{};
  std::array<std::int64_t, kNumTiers> tier_peak{};  // peak of the tier's total
  std::int64_t bytes(Tier t, Kind k) const { return current[int(t)][int(k)]; }
  // Model-state bytes: everything but buckets, padding and staging (docs/design.md's table).
  std::int64_t model_state_bytes(Tier t) const;
};

class MemoryLedger {
 public:
  class Registration {
   public:
    Registration() = default;
    Registration(MemoryLedger* ledger, Tier tier, Kind kind, std::int64_t bytes)
        : ledger_(ledger), tier_(tier), kind_(kind), bytes_(bytes) {}
    Registration(Registration&& o) noexcept { *this = std::move(o); }
    Registration& operator=(Registration&& o) noexcept;
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    ~Registration() { release(); }
    void release();
    std::int64_t bytes() const { return bytes_; }

   private:
    MemoryLedger* ledger_ = nullptr;
    Tier tier_ = Tier::kDevice;
    Kind kind_ = Kind::kHalfParams;
    std::int64_t bytes_ = 0;
  };

  // `what` names the buffer in the error message if the device budget is
  // exceeded. check_budget false: counted, never refused (for allocations
  // whose bound was checked beforehand, where a refusal on one rank would
  // leave the others waiting in a collective).
  [[nodiscard]] Registration add(Tier tier, Kind kind, std::int64_t bytes, std::string_view what,
                                 bool check_budget = true);

  // 0 = no budget. Only the device tier has one.
  void set_device_limit(std::int64_t bytes) { device_limit_ = bytes; }
  std::int64_t device_limit() const { return device_limit_; }

  LedgerSnapshot snapshot() const;
  void reset_peaks();

 private:
  void remove(Tier tier, Kind kind, std::int64_t bytes);

  mutable std::mutex mu_;
  LedgerSnapshot s_;
  std::int64_t device_limit_ = 0;
};

// "1.50 GiB", "12.0 MiB", "512 B".
std::string format_bytes(std::int64_t bytes);

}  // namespace zero::memory
