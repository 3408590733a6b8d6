// zero-train's per-step files in --out: metrics.jsonl (one JSON object per
// step), loss.dat and val.dat (gnuplot's: the step first). A run resumed at
// step S into the same folder keeps the lines of steps up to S (those of a
// run that went further than its checkpoint are dropped) and appends, so that
// the plot and the metrics cover the whole training, preemptions included.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>

namespace zero::train {

struct RunFiles {
  std::ofstream metrics, loss, val;
  bool val_points = false;  // val.dat has a point (kept or written)
  // Opens the three files in `dir`: new (first_step 0), or trimmed to the
  // steps <= first_step and appended to. Throws zero::Error naming the
  // folder when they cannot be written.
  void open(const std::filesystem::path& dir, std::int64_t first_step);
  void flush();
  void close();
};

}  // namespace zero::train
