// The engine's tracer behind Engine::trace() (zero/engine/timeline.h): parts
// mark device intervals with timing events on a stream, or host intervals
// with the host clock (from any thread); take() turns the events into times
// on the host's clock. When off, every call returns at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include "device_context.h"
#include "zero/engine/timeline.h"

namespace zero::detail {

class StepTimeline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StepTimeline(const DeviceContext& ctx) : ctx_(ctx) {}

  // On: drops what was recorded and starts the clock (synchronises the
  // device once, to align its events with the host clock).
  void set(bool on);
  bool on() const { return on_; }
  // The optimizer steps taken, stamped on the intervals that begin now.
  void set_step(std::int64_t step) { step_ = step; }

  // A point on `stream`'s timeline (a timing event; the host clock on the CPU).
  struct Mark {
    std::shared_ptr<c10::Event> event;
    Clock::time_point host;
  };
  Mark mark(const c10::Stream& stream) const;
  Mark mark_current() const { return mark(ctx_.current_stream()); }
  void device_interval(std::string lane, std::string what, Mark begin, Mark end);
  // step: the step stamped on it (-1: the one set_step() set), for work on
  // another thread whose step the main thread may have left.
  void host_interval(std::string lane, std::string what, Clock::time_point begin, Clock::time_point end,
                     std::int64_t step = -1);

  // Runs `enqueue` (work it puts on `stream`) between two marks, recorded as
  // the device interval "<kind> <index>" of `lane` when `t` is tracing; with
  // no timeline, or tracing off, just runs it (the label is never built).
  template <class Enqueue>
  static void on_stream(StepTimeline* t, const c10::Stream& stream, const char* lane, const char* kind,
                        std::size_t index, Enqueue&& enqueue) {
    if (t == nullptr || !t->on()) {
      enqueue();
      return;
    }
    Mark begin = t->mark(stream);
    enqueue();
    t->device_interval(lane, std::string(kind) + " " + std::to_string(index), std::move(begin), t->mark(stream));
  }

  // Everything recorded since set(true), in recording order; clears it.
  std::vector<TimelineInterval> take();

 private:
  struct Pending {
    TimelineInterval iv;
    bool marked = false;  // a device interval: its times come from the marks
    Mark begin, end;
  };
  double host_ms(Clock::time_point t) const {
    return std::chrono::duration<double, std::milli>(t - t0_).count();
  }

  const DeviceContext& ctx_;
  bool on_ = false;
  std::int64_t step_ = 0;
  Clock::time_point t0_;
  std::shared_ptr<c10::Event> ref_;  // completed at t0_ (on a GPU)
  std::mutex mu_;
  std::vector<Pending> pending_;
};

}  // namespace zero::detail
