// TrackedWork: the Work every Communicator op returns. It wraps the backend's
// Work, marks the op's flight-recorder entry when it completes, and makes a
// wait() without a timeout wait at most comm_timeout (then CollectiveTimeout)
// or until another rank announces that it failed (then RemoteFailure).
#pragma once

#include <atomic>
#include <exception>
#include <memory>

#include "comm_monitor.h"
#include "zero/comm/work.h"

namespace zero::comm::detail {

class TrackedWork final : public Work {
 public:
  TrackedWork(WorkPtr inner, std::uint64_t seq, std::shared_ptr<CommMonitor> monitor);
  ~TrackedWork() override;

  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override;
  // The backend's; the op stays pending in the flight recorder until a
  // wait() or is_completed() sees it done.
  bool wait_on_device(void* stream) override { return inner_->wait_on_device(stream); }
  Work* wrapped() override { return inner_.get(); }

 private:
  void finish(OpState state);

  WorkPtr inner_;
  std::uint64_t seq_;
  std::shared_ptr<CommMonitor> monitor_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;  // a timeout or another rank's failure, rethrown by every wait()
};

}  // namespace zero::comm::detail
