// One background thread that runs one job at a time: the delayed parameter
// update runs the CPU optimizer step of step t here while the main thread
// runs the forward and backward of step t+1.
//
// submit() hands over a job (the previous one must have been waited for);
// wait() blocks until it is done and rethrows what it threw. The job must not
// issue collectives: only the main thread talks to the communicator, so the
// collective order stays the same on every rank.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace zero::offload {

class BackgroundWorker {
 public:
  BackgroundWorker();
  ~BackgroundWorker();
  BackgroundWorker(const BackgroundWorker&) = delete;
  BackgroundWorker& operator=(const BackgroundWorker&) = delete;

  void submit(std::function<void()> job);
  void wait();
  bool busy() const;

 private:
  void run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool has_job_ = false;
  bool done_ = true;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace zero::offload
