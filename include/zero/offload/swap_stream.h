// Byte ranges of a SwapFile at any position, through aligned host buffers:
// what a checkpoint streams out of a swap file and into one (the file's own
// requests must be aligned to SwapFile::kAlign; a checkpoint's ranges are
// not).
//  - read_span() reads the aligned blocks that hold the range's first bytes
//    into a buffer and says where in it they are;
//  - SwapStreamWriter writes ranges one after another: ranges that follow
//    each other gather in a buffer and go to the file as one request when it
//    is full or the next range does not follow; the blocks at a request's
//    unaligned ends keep the file's bytes around it (read, or for a head
//    block that the last request ended in, taken from that request's
//    buffer); with two buffers one request is under way while the next one
//    fills.
// The caller keeps every range, rounded out to whole blocks, inside bytes of
// the file that nobody else writes meanwhile.
#pragma once

#include <array>
#include <cstddef>
#include <utility>

#include "zero/offload/swap_file.h"

namespace zero::offload {

// Up to `n` bytes of the file from byte `pos` into `buf` (aligned, `cap`
// bytes, at least one block): returns where they are in `buf` and how many
// were read (fewer than n when the buffer holds fewer; call again from
// there). The aligned blocks read must lie inside the file.
std::pair<const char*, std::size_t> read_span(SwapFile& file, std::size_t pos, std::size_t n, char* buf,
                                              std::size_t cap);

class SwapStreamWriter {
 public:
  // `buffers`: one or two aligned buffers of `buffer_bytes` each (at least
  // one block); the writer owns their contents until finish().
  SwapStreamWriter(SwapFile& file, std::array<char*, 2> buffers, std::size_t buffer_bytes);
  // Waits for the writes under way (their errors are finish()'s to say).
  ~SwapStreamWriter();
  SwapStreamWriter(const SwapStreamWriter&) = delete;
  SwapStreamWriter& operator=(const SwapStreamWriter&) = delete;

  // Bytes [pos, pos + n) of the file from `src` (n > 0): returns how many
  // were taken (what the buffer had room for: call again with the rest).
  // They reach the file by finish() at the latest.
  std::size_t write(std::size_t pos, const void* src, std::size_t n);
  // Writes what the buffer gathered and waits for every write; rethrows
  // the first failure. The writer can be used again after it.
  void finish();

 private:
  struct Write {
    SwapFile::Ticket ticket = 0;
    std::size_t begin = 0, end = 0;  // the bytes of the file it writes
  };
  // No write under way may change bytes [begin, end) of the file while they
  // are read.
  void settle(std::size_t begin, std::size_t end);
  // The gathered buffer to the file (its last block completed from the file).
  void submit();

  SwapFile& file_;
  std::array<char*, 2> buffers_;
  std::size_t count_, cap_;
  std::array<Write, 2> writes_{};
  std::size_t next_ = 0;           // the buffer the next request fills
  bool open_ = false;              // buffer next_ gathers bytes from file byte open_at_ (aligned) on
  std::size_t open_at_ = 0, open_len_ = 0;  // (open_len_: its bytes so far, the head block's lead included)
  bool head_read_ = false;         // its first block holds the file's bytes (a range began inside it)
  std::size_t tail_at_ = 0;        // the last request's last block: where it is in the file
  const char* tail_ = nullptr;     // and in its buffer
  char* scratch_ = nullptr;        // one block: a request's last block as the file has it
};

}  // namespace zero::offload
