// Stage 3 with offload_param.device "nvme" (ZeRO-Infinity's parameter tier):
// the rank's partition of the training-precision parameters lives in a swap
// file (zero/offload/swap_file.h), one region per bucket's chunk rounded up
// to 4096 bytes, and goes through a few host buffers ("slots") that hold one
// chunk each:
//  - a gather takes its bucket's chunk from a slot (chunk()), read then or
//    ahead: the reads of one pass (the gathers between two publishes) follow
//    the order of the last pass, as far ahead as there are free slots;
//  - a publish writes the step's update into slots, piece by piece, and a
//    slot is written to the file once its chunk is whole; flush() waits for
//    the writes, after which the slots keep the chunks they wrote (the
//    publish's own gathers of the buckets of no unit read no file);
//  - checkpoints read and write whole chunks, or stream the partition's
//    bytes from and to the file (read_bytes(), write_bytes()).
// Used from one thread (the engine's); the file's I/O threads are its own.
// Private to zero_engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "zero/offload/swap_file.h"
#include "zero/offload/swap_stream.h"
#include "zero/zero/flat_layout.h"

namespace zero::detail {

class ParamSwap {
 public:
  struct Counters {
    std::uint64_t reads = 0;        // chunks read from the file
    std::uint64_t read_ahead = 0;   // of which read before their gather asked
    std::uint64_t waited = 0;       // gathers that waited for their read (started then, or ahead but not done)
    std::uint64_t writes = 0;       // chunks written
  };
  // `slots`: host bytes (the plan's kParamSwapBuffers; pinned on a GPU),
  // as many slots of the largest bucket's region as fit after its first
  // 4096-aligned byte. Makes the file (SwapFile's errors: the folder, the
  // space, the lock).
  ParamSwap(const FlatLayout& layout, c10::ScalarType dtype, at::Tensor slots, const std::filesystem::path& file,
            offload::SwapFile::Options io);
  ~ParamSwap();
  ParamSwap(const ParamSwap&) = delete;
  ParamSwap& operator=(const ParamSwap&) = delete;

  // Bucket b's chunk (b.chunk elements, training precision, host): read now
  // or ahead. Valid until done_with(b) and the next call that takes a slot.
  at::Tensor chunk(int b);
  // The caller has copied the chunk out, or queued the copy: then
  // `wait_copy` blocks until it is done, and runs before the slot is
  // written again. The slot keeps the chunk until it is needed.
  void done_with(int b, std::function<void()> wait_copy = {});

  // Elements [offset, offset + n) of bucket b's chunk from `values`
  // (n elements, any floating dtype, any device; converted). A chunk is
  // written to the file once each of its elements has been given once.
  void write(int b, std::size_t offset, const at::Tensor& values);
  // Waits for the chunks' writes; every chunk begun since the last flush
  // must be whole (an internal error otherwise). A new pass of reads begins.
  void flush();
  // Drops the chunks begun and not whole (a publish that failed part-way:
  // the file keeps their values from before it).
  void discard_partial();

  // Checkpoints: bucket b's chunk read now into a new host tensor (not
  // counted, and not part of the gathers' order).
  at::Tensor read_copy(int b);

  // Checkpoints, streamed: the partition as bytes (the buckets' chunks one
  // after another, as ParamStore's partition has them), straight from and
  // to the file.
  // The file as the last publish left it: a write under way waited for, a
  // chunk begun and not whole dropped. Then read_bytes() may run on another
  // thread, beside gathers, until the next write().
  void settle_writes();
  // Up to `n` bytes from partition byte `offset` into `buf` (aligned, `cap`
  // bytes, at least 4096): where they are in it and how many (fewer where
  // a chunk ends or the buffer is full).
  std::pair<const char*, std::size_t> read_bytes(std::uint64_t offset, std::size_t n, char* buf,
                                                 std::size_t cap) const;
  // `n` bytes at partition byte `offset` (the bytes around them kept). The
  // first call empties the slots (their chunks would be stale) and writes
  // through two of them; nothing else may use the slots until
  // finish_writes(), which waits for the writes (rethrows the first error).
  void write_bytes(std::uint64_t offset, const void* src, std::size_t n);
  void finish_writes();

  // Counted since the last call.
  Counters take_counters() { return std::exchange(counters_, Counters{}); }
  std::size_t file_bytes() const { return swap_->size(); }
  const std::filesystem::path& path() const { return swap_->path(); }

 private:
  enum class State : std::uint8_t {
    kFree,      // holds nothing
    kReading,   // a read of `bucket` under way (ticket)
    kReady,     // holds `bucket`'s chunk as the file has it
    kFilling,   // `bucket`'s chunk being written into by write(), `filled` elements so far
    kWriting,   // `bucket`'s whole chunk going to the file (ticket); then kReady
  };
  struct Slot {
    State state = State::kFree;
    int bucket = -1;
    offload::SwapFile::Ticket ticket = 0;
    std::size_t filled = 0;
    std::function<void()> wait_copy;  // a copy out of it may still be queued: wait for it before writing it
    bool in_use = false;   // handed out by chunk(), not done_with() yet
    bool ahead = false;    // read ahead, not asked for yet
    std::uint64_t used = 0;  // when it was last handed out or written (least recently used goes first)
  };
  char* slot_data(std::size_t s) const;
  at::Tensor slot_tensor(std::size_t s, int b) const;
  std::size_t region_bytes(int b) const;
  // The slot holding bucket b (any state), or -1.
  int find(int b) const;
  // A slot to take: a free one, else the least recently used one that is
  // not in use and not filling (waiting for its write or read). -1: none.
  int take(bool wait);
  // Slot s, done with its read or write (waits), now kReady. `drop_read`:
  // the chunk read is not wanted (it is evicted or overwritten), and a
  // failed read leaves the slot free instead of throwing.
  void settle_slot(std::size_t s, bool drop_read = false);
  // Slot s about to be written: its reads, writes and copies out done.
  void quiesce(std::size_t s);
  void start_read(std::size_t s, int b, bool ahead, bool count = true);
  // The pass so far becomes the one the next reads follow.
  void new_pass();
  // After the gather of b: reads ahead the buckets the last pass gathered next.
  void read_ahead(int b);
  // Where partition bytes from `offset` on are in the file: from byte
  // `pos`, `n` of them (at most the n asked for; one chunk at most).
  struct FileRun {
    std::size_t pos, n;
  };
  FileRun file_run(std::uint64_t offset, std::size_t n) const;

  const FlatLayout& layout_;
  c10::ScalarType dtype_;
  std::size_t es_;
  at::Tensor slots_mem_;
  std::size_t slot_bytes_ = 0;  // one slot: the largest bucket's region
  std::vector<std::size_t> region_;  // each bucket's region in the file
  std::unique_ptr<offload::SwapFile> swap_;
  std::unique_ptr<offload::SwapStreamWriter> writer_;  // write_bytes() until finish_writes() (after swap_: goes first)
  std::vector<Slot> slots_;
  std::uint64_t clock_ = 0;
  // The gathers' order: the last pass's, and this one's so far.
  std::vector<int> last_pass_, this_pass_;
  std::size_t expect_ = 0;  // where in last_pass_ this pass is
  Counters counters_;
};

}  // namespace zero::detail
