#include "step_timeline.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace zero::detail {

void StepTimeline::set(bool on) {
  const std::lock_guard<std::mutex> lock(mu_);
  pending_.clear();
  on_ = on;
  ref_.reset();
  if (!on) return;
  if (ctx_.on_accelerator()) {
    // The reference event completes with everything before it: its time on
    // the host clock is the moment synchronize() returns (to within the
    // wake-up latency, tens of microseconds).
    c10::impl::getDeviceGuardImpl(ctx_.device.type())->synchronizeDevice(ctx_.device.index());
    ref_ = std::make_shared<c10::Event>(ctx_.device.type(), c10::EventFlag::BACKEND_DEFAULT);
    ref_->record(ctx_.current_stream());
    ref_->synchronize();
  }
  t0_ = Clock::now();
}

StepTimeline::Mark StepTimeline::mark(const c10::Stream& stream) const {
  Mark m;
  if (!on_) return m;
  if (ctx_.on_accelerator()) {
    m.event = std::make_shared<c10::Event>(ctx_.device.type(), c10::EventFlag::BACKEND_DEFAULT);
    m.event->record(stream);
  } else {
    m.host = Clock::now();
  }
  return m;
}

void StepTimeline::device_interval(std::string lane, std::string what, Mark begin, Mark end) {
  if (!on_) return;
  const std::lock_guard<std::mutex> lock(mu_);
  Pending p;
  p.iv.lane = std::move(lane);
  p.iv.what = std::move(what);
  p.iv.step = step_;
  p.marked = true;
  p.begin = std::move(begin);
  p.end = std::move(end);
  pending_.push_back(std::move(p));
}

void StepTimeline::host_interval(std::string lane, std::string what, Clock::time_point begin,
                                 Clock::time_point end, std::int64_t step) {
  if (!on_) return;
  const std::lock_guard<std::mutex> lock(mu_);
  Pending p;
  p.iv.lane = std::move(lane);
  p.iv.what = std::move(what);
  p.iv.step = step >= 0 ? step : step_;
  p.iv.start_ms = host_ms(begin);
  p.iv.end_ms = host_ms(end);
  pending_.push_back(std::move(p));
}

std::vector<TimelineInterval> StepTimeline::take() {
  const std::lock_guard<std::mutex> lock(mu_);
  std::vector<TimelineInterval> out;
  out.reserve(pending_.size());
  auto at = [&](const Mark& m) {
    if (!m.event) return host_ms(m.host);
    m.event->synchronize();
    return ref_->elapsedTime(*m.event);
  };
  for (Pending& p : pending_) {
    if (p.marked) {
      p.iv.start_ms = at(p.begin);
      p.iv.end_ms = at(p.end);
    }
    out.push_back(std::move(p.iv));
  }
  pending_.clear();
  return out;
}

}  // namespace zero::detail
