#include "checkpoint_save.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <thread>

#include <ATen/ops/empty.h>

#include "zero/ckpt/shard_io.h"

namespace zero::detail {

CheckpointSave::CheckpointSave(std::filesystem::path dir, std::string tag, std::filesystem::path file, int rank,
                               std::vector<SaveSection> sections, ckpt::Manifest manifest, bool async,
                               memory::MemoryLedger::Registration snapshot)
    : dir_(std::move(dir)),
      tag_(std::move(tag)),
      file_(std::move(file)),
      rank_(rank),
      sections_(std::move(sections)),
      manifest_(std::move(manifest)),
      snapshot_(std::move(snapshot)) {
  if (async) {
    worker_ = std::make_unique<offload::BackgroundWorker>();
    // Tests: ZERO_TEST_CKPT_WRITE_DELAY_MS holds the write back, so that the
    // training steps taken meanwhile would show in a file that was written
    // from the live state instead of the snapshot (docs/testing.md).
    const char* delay = std::getenv("ZERO_TEST_CKPT_WRITE_DELAY_MS");
    const long delay_ms = delay != nullptr ? std::strtol(delay, nullptr, 10) : 0;
    worker_->submit([this, delay_ms] {
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      write();
    });
  } else {
    write();
  }
}

CheckpointSave::~CheckpointSave() {
  if (worker_) {
    try {
      worker_->wait();
    } catch (...) {  // write() keeps its own errors in record_
    }
  }
}

void CheckpointSave::write() {
  const auto began = std::chrono::steady_clock::now();
  try {
    ckpt::ShardWriter w(file_);
    at::Tensor bounce;  // device pieces come down through it, a block at a time
    for (const SaveSection& s : sections_) {
      w.begin_section(s.name, s.dtype, s.shape);
      for (const at::Tensor& t : s.pieces) {
        if (t.device().is_cpu()) {
          w.write(t.data_ptr(), t.nbytes());
          continue;
        }
        const at::Tensor bytes = t.reshape({-1}).view(at::kByte);
        const std::int64_t block = static_cast<std::int64_t>(ckpt::kIoBlock);
        if (!bounce.defined()) bounce = at::empty({std::min(block, bytes.numel())}, at::kByte);
        for (std::int64_t off = 0; off < bytes.numel(); off += block) {
          const std::int64_t n = std::min(block, bytes.numel() - off);
          if (n > bounce.numel()) bounce = at::empty({n}, at::kByte);
          bounce.narrow(0, 0, n).copy_(bytes.narrow(0, off, n));
          w.write(bounce.data_ptr(), static_cast<std::size_t>(n));
        }
      }
      w.end_section();
    }
    const ckpt::FileRecord rec = w.finish(rank_);
    bytes_ = rec.bytes;
    record_ = ckpt::file_record_to_json(rec).dump();
  } catch (const std::exception& e) {
    record_ = std::string("error: ") + e.what();
  }
  write_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
}

bool CheckpointSave::written() const { return !worker_ || !worker_->busy(); }

std::string CheckpointSave::result() {
  if (worker_) worker_->wait();
  // The host copy is no longer needed (released here, on the thread that
  // owns the ledger).
  sections_.clear();
  snapshot_.release();
  return record_;
}

}  // namespace zero::detail
