// zero-train's per-step files in --out: metrics.jsonl (one JSON object per
// step), loss.dat and val.dat (gnuplot's: the step first). A run resumed at
// step S into the same folder keeps the lines of steps up to S (those of a
// run that went further than its checkpoint are dropped) and appends, so that
// the plot and the metrics cover the whole training, preemptions included.
// Files whose lines stop short of step S are not this run's (another run's
// --out, or lines lost): they are moved aside (`metrics.jsonl.old`, ...)
// and said, not spliced before the resumed run's steps.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace zero::train {

struct RunFiles {
  std::ofstream metrics, loss, val;
  bool val_points = false;  // val.dat has a point (kept or written)
  // Opens the three files in `dir`: new (first_step 0), or trimmed to the
  // steps <= first_step and appended to. Throws zero::Error naming the
  // folder when they cannot be written.
  // Returns what was moved aside, for the caller to say ("" when nothing).
  std::string open(const std::filesystem::path& dir, std::int64_t first_step);
  // Writes out what step `step` added. The first write that fails (a full
  // disk, the folder removed) is kept in failure(); returns true then, once,
  // so that the caller warns once. Training goes on: the files are its log.
  bool flush(std::int64_t step);
  // Closes the files, and checks that metrics.jsonl is still in the folder
  // (a folder removed during the run takes the files with it).
  void close();
  // "" while every line reached the files; else what was lost and why.
  const std::string& failure() const { return failure_; }

 private:
  bool note_failure(const std::string& what);
  std::filesystem::path dir_;
  std::string failure_;
};

}  // namespace zero::train
