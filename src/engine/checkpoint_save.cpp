#include "checkpoint_save.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <optional>
#include <thread>

#include <ATen/ops/empty.h>

#include "zero/ckpt/shard_io.h"
#include "zero/comm/launcher_env.h"
#include "zero/core/error.h"
#include "zero/core/host_memory.h"

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
    for (const SaveSection& s : sections_) {
      if (s.stream) ++streamed_left_;
      if (!s.live) continue;
      for (const at::Tensor& t : s.pieces) {
        if (!t.device().is_cpu()) continue;
        LivePiece p;
        p.t = t;
        live_.push_back(std::move(p));
      }
    }
    worker_ = std::make_unique<offload::BackgroundWorker>();
    // Tests: ZERO_TEST_CKPT_WRITE_DELAY_MS holds the write back, so that the
    // training steps taken meanwhile would show in a file that was written
    // from the live state instead of the snapshot (docs/testing.md).
    const char* delay = std::getenv("ZERO_TEST_CKPT_WRITE_DELAY_MS");
    const long delay_ms = delay != nullptr ? std::strtol(delay, nullptr, 10) : 0;
    // ZERO_TEST_CKPT_LIVE_BLOCK=BYTES:MS writes the live sections in blocks
    // of BYTES, each followed by a pause of MS, so that the next step's
    // fence lands in the middle of a piece.
    if (const char* b = std::getenv("ZERO_TEST_CKPT_LIVE_BLOCK")) {
      char* rest = nullptr;
      const unsigned long long bytes = std::strtoull(b, &rest, 10);
      if (bytes > 0) live_block_ = bytes;
      if (rest != nullptr && *rest == ':') live_pause_ms_ = std::strtol(rest + 1, nullptr, 10);
    }
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
    std::size_t next_live = 0;
    for (const SaveSection& s : sections_) {
      w.begin_section(s.name, s.dtype, s.shape);
      if (s.stream) {
        write_streamed(w, s);
        w.end_section();
        const std::lock_guard<std::mutex> lock(live_mu_);
        if (streamed_left_ > 0) --streamed_left_;
        live_cv_.notify_all();
        continue;
      }
      for (const at::Tensor& t : s.pieces) {
        if (s.live && worker_ && t.device().is_cpu()) {
          write_live(w, next_live++);
          continue;
        }
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
  stream_buffer_ = at::Tensor();
  write_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  {
    const std::lock_guard<std::mutex> lock(live_mu_);
    writer_ended_ = true;
  }
  live_cv_.notify_all();
}

void CheckpointSave::write_streamed(ckpt::ShardWriter& w, const SaveSection& s) {
  if (s.stream_bytes == 0) return;
  if (!stream_buffer_.defined()) stream_buffer_ = at::empty({static_cast<std::int64_t>(kStreamBufferBytes)}, at::kByte);
  char* base = static_cast<char*>(stream_buffer_.data_ptr());
  char* first = base + (kStreamAlign - reinterpret_cast<std::uintptr_t>(base) % kStreamAlign) % kStreamAlign;
  char* const buffers[2] = {first, first + kStreamBlockBytes};
  // Block k + 1 is read on a thread of its own while block k is copied into
  // the file's ring (whose own threads write it): the read and the write
  // overlap.
  std::pair<const char*, std::size_t> got[2];
  offload::BackgroundWorker reader;  // (after what its job uses: joined first)
  auto read = [&](int k, std::uint64_t off) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(ckpt::kIoBlock, s.stream_bytes - off));
    reader.submit([&s, &got, &buffers, k, off, n] { got[k] = s.stream(off, n, buffers[k], kStreamBlockBytes); });
  };
  read(0, 0);
  int k = 0;
  for (std::uint64_t off = 0; off < s.stream_bytes; k = 1 - k) {
    reader.wait();  // (rethrows the read's error)
    const auto [data, n] = got[k];
    ZERO_INTERNAL_ASSERT(n > 0, "checkpoint section ", s.name, ": its source gave no bytes at ", off);
    off += n;
    if (off < s.stream_bytes) read(1 - k, off);
    w.write(data, n);
  }
}

void CheckpointSave::write_live(ckpt::ShardWriter& w, std::size_t i) {
  LivePiece& p = live_[i];
  ZERO_INTERNAL_ASSERT(p.t.device().is_cpu() && p.t.is_contiguous(), "a live checkpoint piece must be contiguous host memory");
  const std::uint64_t total = p.t.nbytes();
  const std::uint64_t block = live_block_;
  while (true) {
    const char* from = nullptr;
    std::uint64_t n = 0;
    {
      const std::lock_guard<std::mutex> lock(live_mu_);
      ZERO_CHECK(abandoned_.empty(), abandoned_);
      if (p.written >= total) break;
      n = std::min(block, total - p.written);
      if (p.copy.defined()) {
        from = static_cast<const char*>(p.copy.data_ptr()) + (p.written - p.copied_from);
      } else {
        from = static_cast<const char*>(p.t.data_ptr()) + p.written;
        in_block_ = true;
      }
    }
    struct EndBlock {  // on return and on throw
      CheckpointSave* self;
      ~EndBlock() {
        {
          const std::lock_guard<std::mutex> lock(self->live_mu_);
          self->in_block_ = false;
        }
        self->live_cv_.notify_all();
      }
    };
    {
      const EndBlock end{this};
      w.write(from, static_cast<std::size_t>(n));
    }
    {
      const std::lock_guard<std::mutex> lock(live_mu_);
      p.written += n;
    }
    if (live_pause_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(live_pause_ms_));
  }
}

CheckpointSave::Fenced CheckpointSave::fence(memory::MemoryLedger& ledger) {
  Fenced out;
  if (!worker_) return out;
  std::unique_lock<std::mutex> lock(live_mu_);
  if (streamed_left_ > 0 && !writer_ended_) {
    out.waited = true;
    live_cv_.wait(lock, [&] { return streamed_left_ == 0 || writer_ended_; });
  }
  if (live_.empty() || fenced_) return out;
  if (writer_ended_) {  // written, or failed: it reads nothing more
    fenced_ = true;
    return out;
  }
  std::uint64_t rest = 0;
  for (const LivePiece& p : live_) rest += p.t.nbytes() - std::min<std::uint64_t>(p.written, p.t.nbytes());
  // The copy of the rest needs host memory, at the moment every rank on the
  // node makes its own: where there is not enough (or the copy fails), the
  // save is abandoned (the writer stops at its next block and the commit
  // reports why) and training goes on; the live memory is never left to a
  // writer that would read it while the step changes it.
  std::string why;
  std::uint64_t copied = 0;
  try {
    if (rest > 0) {
      const int local = comm::launcher_local_size().value_or(1);
      const std::optional<std::int64_t> available = host_memory_available();
      if (available && static_cast<std::int64_t>(rest) * local > *available) {
        why = "the next optimizer step had to copy the " + memory::format_bytes(static_cast<std::int64_t>(rest)) +
              " this rank had not written yet (" + std::to_string(local) + " rank(s) per node), and only " +
              memory::format_bytes(*available) + " of host memory is available (" + host_memory_source() + ")";
      }
    }
    if (why.empty()) {
      for (LivePiece& p : live_) {
        const std::uint64_t total = p.t.nbytes();
        if (p.written >= total) continue;
        // From the start of the block being written (if any) to the end: the
        // writer may be reading it now; reading it here too is safe, and the
        // live memory changes only after this returns.
        const at::Tensor bytes = p.t.reshape({-1}).view(at::kByte);
        p.copy = bytes.narrow(0, static_cast<std::int64_t>(p.written), static_cast<std::int64_t>(total - p.written))
                     .clone();
        p.copied_from = p.written;
        copied += total - p.written;
      }
    }
  } catch (const std::exception& e) {
    why = std::string("the next optimizer step could not copy what this rank had not written yet: ") + e.what();
  }
  if (!why.empty()) {
    abandoned_ = why + "; the save was abandoned and training went on. Make room on the host, save less often "
                 "(a write that ends within forward and backward needs no copy), or save synchronously";
    for (LivePiece& p : live_) p.copy = at::Tensor();
    copied = 0;
  }
  fenced_ = true;
  live_cv_.wait(lock, [&] { return !in_block_; });
  lock.unlock();
  if (copied > 0) {
    fence_copies_.push_back(ledger.add(memory::Tier::kHost, memory::Kind::kStaging, static_cast<std::int64_t>(copied),
                                       "checkpoint snapshot (the rest, at the next step)", false));
  }
  out.copied = copied;
  return out;
}

bool CheckpointSave::written() const { return !worker_ || !worker_->busy(); }

std::string CheckpointSave::result() {
  if (worker_) worker_->wait();
  // The host copy is no longer needed (released here, on the thread that
  // owns the ledger).
  sections_.clear();
  live_.clear();
  snapshot_.release();
  for (auto& r : fence_copies_) r.release();
  fence_copies_.clear();
  return record_;
}

}  // namespace zero::detail
