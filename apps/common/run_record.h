// zero-train's record of a run in a checkpoint's client_state (the step, the
// seed, the GPT's shape, ...), as zero-train and zero-ckpt read it back.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace zero::tools {

// Throws zero::Error when a field zero-train writes is there with a value it
// never writes (a step below 0, a shape of 0 heads, a number as text): the
// manifest was edited, or written by another program. Fields that are not
// there pass (older checkpoints lack some; a library user's client_state
// has its own). `folder`: the checkpoint, named in the message.
void check_run_record(const nlohmann::json& client_state, const std::string& folder);

}  // namespace zero::tools
