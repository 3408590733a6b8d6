#include "zero/offload/swap_stream.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <cstdint>
#include <cstring>
#include <exception>

#include "zero/core/error.h"

namespace zero::offload {

namespace {
constexpr std::size_t kAlign = SwapFile::kAlign;

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kAlign == 0; }
}  // namespace

std::pair<const char*, std::size_t> read_span(SwapFile& file, std::size_t pos, std::size_t n, char* buf,
                                              std::size_t cap) {
  ZERO_INTERNAL_ASSERT(aligned(buf) && cap >= kAlign && n > 0, "read_span: the buffer must be aligned and hold a "
                       "block of ", kAlign, " bytes");
  const std::size_t at = pos / kAlign * kAlign, lead = pos - at;
  const std::size_t take = std::min(n, cap / kAlign * kAlign - lead);
  file.wait(file.read(at, buf, SwapFile::align_up(lead + take)));
  return {buf + lead, take};
}

SwapStreamWriter::SwapStreamWriter(SwapFile& file, std::array<char*, 2> buffers, std::size_t buffer_bytes)
    : file_(file), buffers_(buffers), count_(buffers[1] ? 2 : 1), cap_(buffer_bytes / kAlign * kAlign) {
  ZERO_INTERNAL_ASSERT(buffers[0] && aligned(buffers[0]) && (!buffers[1] || aligned(buffers[1])) && cap_ >= kAlign,
                       "SwapStreamWriter: one or two aligned buffers of a block at least");
  scratch_ = static_cast<char*>(std::aligned_alloc(kAlign, kAlign));
  if (!scratch_) throw std::bad_alloc();
}

SwapStreamWriter::~SwapStreamWriter() {
  for (Write& w : writes_) {
    if (w.ticket == 0) continue;
    try {
      file_.wait(std::exchange(w.ticket, SwapFile::Ticket{0}));
    } catch (...) {  // (finish() says it; a destructor cannot)
    }
  }
  std::free(scratch_);
}

void SwapStreamWriter::settle(std::size_t begin, std::size_t end) {
  for (Write& w : writes_) {
    if (w.ticket != 0 && begin < w.end && end > w.begin) file_.wait(std::exchange(w.ticket, SwapFile::Ticket{0}));
  }
}

std::size_t SwapStreamWriter::write(std::size_t pos, const void* src, std::size_t n) {
  ZERO_INTERNAL_ASSERT(n > 0, "SwapStreamWriter::write of no bytes");
  // A range that follows the gathered bytes joins them while there is room.
  if (open_ && pos == open_at_ + open_len_ && open_len_ < cap_) {
    const std::size_t take = std::min(n, cap_ - open_len_);
    std::memcpy(buffers_[next_] + open_len_, src, take);
    open_len_ += take;
    return take;
  }
  if (open_) submit();
  // A new request in buffer next_, free once its last write is done (with
  // two, one request is under way while the other fills).
  Write& mine = writes_[next_];
  if (mine.ticket != 0) file_.wait(std::exchange(mine.ticket, SwapFile::Ticket{0}));
  char* buf = buffers_[next_];
  const std::size_t at = pos / kAlign * kAlign, lead = pos - at;
  // The head block keeps the file's bytes before the range: the last
  // request's tail block when it ended in this block (its bytes, from that
  // request's buffer), else read.
  head_read_ = lead > 0;
  if (lead > 0) {
    if (at == tail_at_ && tail_ != nullptr) {
      std::memmove(buf, tail_, kAlign);  // (one buffer: it may be the same bytes)
    } else {
      settle(at, at + kAlign);
      file_.wait(file_.read(at, buf, kAlign));
    }
  }
  const std::size_t take = std::min(n, cap_ - lead);
  std::memcpy(buf + lead, src, take);
  open_ = true;
  open_at_ = at;
  open_len_ = lead + take;
  return take;
}

void SwapStreamWriter::submit() {
  char* buf = buffers_[next_];
  const std::size_t span = SwapFile::align_up(open_len_);
  const std::size_t at = open_at_, end = open_len_;
  open_ = false;
  // The last block keeps the file's bytes after the range (unless it is
  // the head block, read whole already).
  if (end % kAlign != 0 && !(head_read_ && span == kAlign)) {
    settle(at + span - kAlign, at + span);
    file_.wait(file_.read(at + span - kAlign, scratch_, kAlign));
    std::memcpy(buf + end, scratch_ + end % kAlign, kAlign - end % kAlign);
  }
  settle(at, at + span);  // (two writes of one block never race)
  writes_[next_] = Write{file_.write(at, buf, span), at, at + span};
  tail_at_ = at + span - kAlign;
  tail_ = buf + span - kAlign;
  next_ = (next_ + 1) % count_;
}

void SwapStreamWriter::finish() {
  std::exception_ptr first;
  try {
    if (open_) submit();
  } catch (...) {
    first = std::current_exception();
  }
  open_ = false;
  tail_ = nullptr;
  tail_at_ = 0;
  next_ = 0;
  for (Write& w : writes_) {
    if (w.ticket == 0) continue;
    try {
      file_.wait(std::exchange(w.ticket, SwapFile::Ticket{0}));
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace zero::offload
