// Where zero-train trains (--device) and the communicator its engine uses.
#pragma once

#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "zero/comm/communicator.h"

namespace zero::train {

struct TrainDevice {
  c10::Device device{c10::kCPU};
  // The engine's communicator on a GPU with several ranks (NCCL over the
  // host communicator); null when the engine uses the host communicator.
  std::unique_ptr<comm::Communicator> device_comm;
  std::string reason;  // one line: what was chosen and why
};

// choice: "cpu", "cuda", or "auto" (a GPU of its own for every rank on the
// node when there is one, else the CPU; all ranks agree). Collective over
// `host`. Throws zero::Error naming the fix when "cuda" cannot be honoured.
TrainDevice choose_device(const std::string& choice, comm::Communicator& host);

}  // namespace zero::train
