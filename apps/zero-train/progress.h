// Progress output of zero-train: a one-line bar redrawn in place on a
// terminal (fitted to its width), plain lines every `every` steps otherwise
// (logs, CI); both end with the time the run took and the time it has left.
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

// The line redrawn on a terminal of `columns` columns: at most columns - 1
// characters (a longer one wraps, and \r redraws only its last row). Where
// the whole line does not fit, its parts give way in this order: the bytes
// held, TFLOP/s, lr/scale/skipped, the bar, tokens/s, the times; the step,
// the loss and the validation loss stay (then cut at the edge).
std::string terminal_line(const ProgressLine& p, const std::string& time, int columns);

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
