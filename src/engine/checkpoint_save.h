// One rank's part of a save under way: what it writes (tensors, one section
// after another, into its file in <dir>/<tag>.partial; device tensors come
// down a block at a time) and the
// thread that writes them while training goes on (asynchronous save), or
// nothing but the write itself (synchronous). The commit, a collective,
// is the engine's (engine_checkpoint.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "zero/ckpt/manifest.h"
#include "zero/memory/memory_ledger.h"
#include "zero/offload/background_worker.h"

namespace zero::detail {

struct SaveSection {
  std::string name, dtype;          // dtype in the manifest's names (fp32, bf16, u8, ...)
  std::vector<std::int64_t> shape;  // module tensors
  std::vector<at::Tensor> pieces;   // contiguous tensors, written in order
};

class CheckpointSave {
 public:
  // Writes `sections` to `file`: on a worker thread (async: the pieces must
  // be host copies that nothing else writes), or before returning. `manifest` (rank 0's, without the files) and the rest are
  // kept for the commit.
  CheckpointSave(std::filesystem::path dir, std::string tag, std::filesystem::path file, int rank,
                 std::vector<SaveSection> sections, ckpt::Manifest manifest, bool async,
                 memory::MemoryLedger::Registration snapshot);
  ~CheckpointSave();
  CheckpointSave(const CheckpointSave&) = delete;
  CheckpointSave& operator=(const CheckpointSave&) = delete;

  // Whether the file is written (or its write failed).
  bool written() const;
  // Waits for the file; its record as JSON, or "error: <message>".
  std::string result();

  const std::filesystem::path& dir() const { return dir_; }
  const std::string& tag() const { return tag_; }
  ckpt::Manifest& manifest() { return manifest_; }
  std::uint64_t bytes() const { return bytes_; }
  double write_seconds() const { return write_seconds_; }
  bool async() const { return worker_ != nullptr; }

 private:
  void write();

  std::filesystem::path dir_;
  std::string tag_;
  std::filesystem::path file_;
  int rank_;
  std::vector<SaveSection> sections_;
  ckpt::Manifest manifest_;
  memory::MemoryLedger::Registration snapshot_;  // the host copy, while it lives
  std::string record_;                            // the result
  std::uint64_t bytes_ = 0;
  double write_seconds_ = 0.0;
  // Last, so destroyed first: the thread is joined before what it reads goes.
  std::unique_ptr<offload::BackgroundWorker> worker_;
};

}  // namespace zero::detail
