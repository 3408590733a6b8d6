// Progress output of zero-train: a one-line bar redrawn in place on a
// terminal, plain lines every `every` steps otherwise (logs, CI); both end
// with the time the run took and the time it has left.
#pragma once

#include <cstdint>
#include <string>

#include "eta.h"

namespace zero::train {

struct ProgressLine {
  std::int64_t step = 0, steps = 0;
  double loss = 0, val_loss = -1, tokens_per_s = 0, tflops = 0, lr = 0, loss_scale = 1;
  std::int64_t skipped = 0;
  std::int64_t device_bytes = 0, host_bytes = 0;
  double elapsed_s = 0;  // since the run's first step began
};

class Progress {
 public:
  explicit Progress(std::int64_t every);
  void update(const ProgressLine& p);
  void finish();

 private:
  bool tty_;
  std::int64_t every_;
  bool drawn_ = false;
  RemainingTime remaining_;
};

}  // namespace zero::train
