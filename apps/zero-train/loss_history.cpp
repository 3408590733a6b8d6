#include "loss_history.h"

#include <algorithm>

namespace zero::train {
namespace {

// Reserving more than this (8 bytes each) up front would ask for memory a
// run with an absurd --steps never uses; past it the vector grows as usual.
constexpr std::int64_t kMostReserved = std::int64_t{1} << 22;

std::size_t reserved(std::int64_t n) { return static_cast<std::size_t>(std::clamp<std::int64_t>(n, 0, kMostReserved)); }

}  // namespace

LossHistory::LossHistory(bool keep, std::int64_t steps, std::int64_t eval_every) : keep_(keep) {
  if (!keep_) return;
  losses_.reserve(reserved(steps));
  // An evaluation every eval_every steps and one at the last step.
  if (eval_every > 0) validation_.reserve(reserved(steps / eval_every + 1));
}

void LossHistory::add_step(double loss) {
  ++steps_;
  if (keep_) losses_.push_back(loss);
}

void LossHistory::add_validation(std::int64_t step, double loss) {
  if (keep_) validation_.emplace_back(step, loss);
}

nlohmann::json LossHistory::losses_json() const { return losses_; }

nlohmann::json LossHistory::validation_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [step, loss] : validation_) out.push_back({{"step", step}, {"loss", loss}});
  return out;
}

}  // namespace zero::train
