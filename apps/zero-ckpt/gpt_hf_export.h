// A zero::models::Gpt checkpoint as a Hugging Face GPT-2 model folder:
// config.json and model.safetensors under GPT2LMHeadModel's names
// (transformers' Conv1D weights are the transposes of our Linear weights;
// the LM head is tied to wte, as in GPT-2).
#pragma once

#include <cstdint>
#include <filesystem>

#include "common/interrupt_cleanup.h"
#include "zero/ckpt/consolidate.h"

namespace zero::tools {

// n_head: 0 takes it from the checkpoint's client state (zero-train saves
// the GPT's dimensions there); another value must agree with that record.
// Both files are written as temporaries in out_dir, fsync'd, and only then
// renamed over an earlier export's: a failure leaves that export as it was
// (and no temporaries, nor folders it created); an interrupt likewise
// (through `cleanup`), and one during the two renames waits for both. Every
// parameter's shape is checked against the GPT's before anything is
// written. Returns the number of tensors written.
std::size_t export_gpt_to_hf(const ckpt::OpenCheckpoint& c, const std::filesystem::path& out_dir, std::int64_t n_head,
                             InterruptCleanup& cleanup);

}  // namespace zero::tools
