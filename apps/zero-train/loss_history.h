// The losses zero-train keeps for its --report: each step's training loss and
// each evaluation's validation loss, held as plain numbers in storage reserved
// when the run starts.
//
// Why reserved and plain: a JSON object appended per evaluation (and a vector
// doubling under it) interleaves small long-lived blocks with the step's
// temporaries, and glibc's heap then grows without bound though the live
// bytes do not: 47 KB of resident memory per evaluation, measured with
// --eval-every 1 (docs/PERFORMANCE.md, "zero-train's memory over a long
// run"). A run without --report keeps nothing but the count.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace zero::train {

class LossHistory {
 public:
  // keep: whether the losses are kept (a --report asks for them); steps: the
  // steps this process will train at most; eval_every: 0 for none.
  LossHistory(bool keep, std::int64_t steps, std::int64_t eval_every);

  void add_step(double loss);
  void add_validation(std::int64_t step, double loss);

  // Steps added, kept or not.
  std::int64_t steps() const { return steps_; }
  // [loss, ...] and [{"step": s, "loss": l}, ...], the report's form.
  nlohmann::json losses_json() const;
  nlohmann::json validation_json() const;

 private:
  bool keep_;
  std::int64_t steps_ = 0;
  std::vector<double> losses_;
  std::vector<std::pair<std::int64_t, double>> validation_;
};

}  // namespace zero::train
