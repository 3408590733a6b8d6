// One rank's part of a save under way: what it writes (tensors, one section
// after another, into its file in <dir>/<tag>.partial; device tensors come
// down a block at a time) and the
// thread that writes them while training goes on (asynchronous save), or
// nothing but the write itself (synchronous). The commit, a collective,
// is the engine's (engine_checkpoint.cpp).
//
// An asynchronous save writes "live" sections (host memory that only the
// next optimizer step changes: the partition's master, moments, parameters
// and pending update) from the engine's own buffers, without a copy; the
// engine calls fence() before it changes them, which copies what is not
// written yet and waits for the block being written. A write that ends
// within the forward and backward after the save costs no copy at all.
//
// A "streamed" section (the optimizer state on NVMe) is read from its
// source a block at a time by the writer, through two I/O blocks of host
// memory: the state is never held whole on the host. The next step waits in
// fence() until the streamed sections are written (their source is what the
// step rewrites, and copying them to the host is what streaming avoids).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <filesystem>
#include <functional>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "zero/ckpt/manifest.h"
#include "zero/ckpt/shard_io.h"
#include "zero/memory/memory_ledger.h"
#include "zero/offload/background_worker.h"

namespace zero::detail {

struct SaveSection {
  std::string name, dtype;          // dtype in the manifest's names (fp32, bf16, u8, ...)
  std::vector<std::int64_t> shape;  // module tensors
  std::vector<at::Tensor> pieces;   // contiguous tensors, written in order
  bool live = false;                // async: host pieces written in place until fence()
  bool copies = false;              // the pieces are host copies of the save's own (async: no snapshot of them)
  // Streamed (no pieces): `stream_bytes` bytes that stream(offset, n, buf,
  // cap) reads into `buf` (aligned to kStreamAlign, cap bytes), returning
  // where they begin and how many (at least one, at most n).
  using StreamFn = std::function<std::pair<const char*, std::size_t>(std::uint64_t, std::size_t, char*, std::size_t)>;
  StreamFn stream = {};
  std::uint64_t stream_bytes = 0;
};

// The streamed sections' buffers: two blocks (the next one is read while
// the last one goes into the file's ring), aligned; kStreamBufferBytes is
// the host memory a save with streamed sections holds besides its copies.
inline constexpr std::size_t kStreamAlign = 4096;
inline constexpr std::size_t kStreamBlockBytes = ckpt::kIoBlock + kStreamAlign;
inline constexpr std::size_t kStreamBufferBytes = 2 * kStreamBlockBytes + kStreamAlign;

class CheckpointSave {
 public:
  // Writes `sections` to `file`: on a worker thread (async: the pieces must
  // be host copies that nothing else writes, or host memory of live
  // sections that nothing writes before fence()), or before returning. `manifest` (rank 0's, without the files) and the rest are
  // kept for the commit.
  CheckpointSave(std::filesystem::path dir, std::string tag, std::filesystem::path file, int rank,
                 std::vector<SaveSection> sections, ckpt::Manifest manifest, bool async,
                 memory::MemoryLedger::Registration snapshot);
  ~CheckpointSave();
  CheckpointSave(const CheckpointSave&) = delete;
  CheckpointSave& operator=(const CheckpointSave&) = delete;

  // Whether the file is written (or its write failed).
  bool written() const;
  // The live sections' memory is about to change: what the writer has not
  // written of it yet is copied (registered in `ledger` until result()),
  // and the block it is writing is waited for. Returns the bytes copied.
  // Where the host has no room for the copy (host_memory_available(), for
  // every rank on the node) or it fails, the save is abandoned instead: the
  // writer stops before its next block and result() says why; this does not
  // throw. Idempotent; nothing to do for a synchronous or finished save.
  // With streamed sections it first waits until they are written
  // (`waited` says it did).
  struct Fenced {
    std::uint64_t copied = 0;
    bool waited = false;
  };
  Fenced fence(memory::MemoryLedger& ledger);
  // Waits for the file; its record as JSON, or "error: <message>".
  std::string result();

  const std::filesystem::path& dir() const { return dir_; }
  const std::string& tag() const { return tag_; }
  const std::filesystem::path& file() const { return file_; }
  ckpt::Manifest& manifest() { return manifest_; }
  std::uint64_t bytes() const { return bytes_; }
  double write_seconds() const { return write_seconds_; }
  bool async() const { return worker_ != nullptr; }

 private:
  void write();
  // Writes live piece `i` (of `live_`) a block at a time, each block from
  // the piece itself or, after a fence, from its copy.
  void write_live(ckpt::ShardWriter& w, std::size_t i);
  void write_streamed(ckpt::ShardWriter& w, const SaveSection& s);

  // A live piece: its memory, how much of it is written, and after a fence
  // the copy of its bytes from `copied_from` on.
  struct LivePiece {
    at::Tensor t;
    std::uint64_t written = 0;
    at::Tensor copy;
    std::uint64_t copied_from = 0;
  };
  std::vector<LivePiece> live_;
  at::Tensor stream_buffer_;  // the streamed sections' (kStreamBufferBytes), allocated by the writer
  std::mutex live_mu_;
  std::condition_variable live_cv_;
  bool in_block_ = false;  // the writer is reading a live block now
  std::uint64_t live_block_ = ckpt::kIoBlock;  // tests: smaller, with a pause after each
  long live_pause_ms_ = 0;
  bool fenced_ = false;
  std::size_t streamed_left_ = 0;  // async: streamed sections not written yet (the fence waits for them)
  bool writer_ended_ = false;  // write() returned (done or failed): a fence copies nothing
  std::string abandoned_;  // why the fence could not copy the rest: the writer stops with it
  std::vector<memory::MemoryLedger::Registration> fence_copies_;

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
