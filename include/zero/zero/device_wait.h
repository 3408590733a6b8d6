// Waiting for a collective where its results are used: on a device backend
// (NCCL) the stream that uses them waits on the device, and the host waits
// later, once, for failures and timeouts (comm::Work::wait_on_device).
#pragma once

#include <utility>

#include <c10/core/Device.h>

#include "zero/comm/work.h"

namespace zero {

// The native handle of `device`'s current stream (a cudaStream_t as void*
// on CUDA); nullptr on the CPU, which has no streams.
void* current_stream_handle(const c10::Device& device);

// Makes `device`'s current stream wait for `work` on the device and returns
// true; false where the backend cannot (a host backend): wait() then.
inline bool wait_on_current_stream(comm::Work& work, const c10::Device& device) {
  return work.wait_on_device(current_stream_handle(device));
}

// Before the result of `work` is used on `device`: the current stream waits
// on the device and `work` joins `unconfirmed` (its owner waits for those on
// the host later, once), or the host waits now.
template <class Works>
void wait_for_use(comm::WorkPtr work, const c10::Device& device, Works& unconfirmed) {
  if (wait_on_current_stream(*work, device)) {
    unconfirmed.push_back(std::move(work));
  } else {
    work->wait();
  }
}

}  // namespace zero
