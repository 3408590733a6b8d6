// zero-train's answer to a scheduler's signals: a preempted or timed-out job
// saves where it stands and stops, instead of losing the steps since its last
// checkpoint.
//
//   SIGTERM, SIGINT, SIGUSR2, finish the step in progress, save a checkpoint
//   SIGHUP                    (with --save-dir), write the report, exit 75
//                             (SIGHUP: a closed terminal; left ignored where
//                             it was, under nohup; SIGINT too, for a job a
//                             script started in the background)
//   SIGUSR1                   save a checkpoint after the step in progress,
//                             and train on
//
// A second SIGTERM, SIGINT or SIGHUP ends the process at once (a save being written
// is then left uncommitted: `latest` keeps naming the earlier checkpoint).
//
// A signal may reach one rank only (a `kill` of one process): every step the
// ranks sum what each received since the step before (counts(), carried by
// the loss all-reduce that zero-train does anyway, so no extra collective)
// and all act on the sum, at the same step.
#pragma once

#include <array>
#include <cstddef>
#include <string>

namespace zero::train {

// The exit status of a run stopped by a signal: EX_TEMPFAIL (sysexits.h),
// "try again later", which a requeue script can tell from a failure (1) and
// from a finished run (0).
constexpr int kStoppedBySignalStatus = 75;

// One per process: installs the handlers, and puts the earlier ones back on
// destruction.
class StopSignals {
 public:
  // SIGTERM, SIGINT, SIGUSR2, SIGUSR1, SIGHUP: the order of take_counts().
  static constexpr std::size_t kCount = 5;

  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // How many times each signal arrived since the last call (as floats,
  // to travel in the loss all-reduce); the counts start again from zero.
  std::array<float, kCount> take_counts();
  // The earlier handlers back now (idempotent): from here the signals end
  // the process as they would without zero-train's handlers.
  void restore();
  // restore(), then what arrived since the last take_counts() (after the
  // ranks' last agreement, before the handlers went) acts as it would have
  // a moment later: a stop signal is raised again (the process ends as
  // its default action says), unless `stop_agreed` (the ranks stopped
  // already: a signal mpirun forwarded to every rank reaches some before
  // their last agreement and others after it, and is one request, done);
  // a SIGUSR1 is returned by name ("" when none) for the caller to say
  // that nothing more is saved.
  std::string restore_and_raise_late(bool stop_agreed);

 private:
  bool installed_ = true;
};

// What the ranks' summed counts ask for.
struct SignalVerdict {
  bool stop = false;       // a stop signal reached some rank
  bool save = false;       // a save was asked for (a stop asks for one too)
  std::string stop_names;  // the stop signals received: "SIGTERM", "SIGINT and SIGUSR2", ... ("" when none)
  std::string save_names;  // "SIGUSR1" when it was received ("" when not)
  // Both verdicts' asks (the same signal in both is named once).
  void merge(const SignalVerdict& other);
};
SignalVerdict signal_verdict(const std::array<float, StopSignals::kCount>& summed);

}  // namespace zero::train
