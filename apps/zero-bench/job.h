// How zero-bench's commands that run on several ranks (step, ckpt) run: on
// the job's communicator, and on an error through comm::fail_job, so that it
// is printed once, by the rank that raised it, and the job ends instead of
// each rank printing it or the others waiting for ever.
#pragma once

#include <exception>
#include <functional>
#include <memory>

#include "zero/comm/communicator.h"
#include "zero/comm/fail_job.h"

namespace zero::bench {

inline void run_as_job(const char* program, const std::function<void(comm::Communicator&)>& body) {
  std::unique_ptr<comm::Communicator> job;
  try {
    job = comm::make_communicator();
    body(*job);
  } catch (const std::exception& e) {
    comm::fail_job(job.get(), e, program);
  }
}

}  // namespace zero::bench
