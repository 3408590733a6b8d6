#include "param_swap.h"

#include <algorithm>
#include <cstdint>

#include <c10/core/ScalarType.h>

#include "zero/core/error.h"
#include "zero/zero/memory_plan.h"

namespace zero::detail {

namespace {
std::int64_t i64(std::size_t n) { return static_cast<std::int64_t>(n); }
// A pass of gathers is at most this long (per bucket, plus a constant).
constexpr std::size_t kMaxPassPerBucket = 8, kMaxPassExtra = 256;
}  // namespace

ParamSwap::ParamSwap(const FlatLayout& layout, c10::ScalarType dtype, at::Tensor slots,
                     const std::filesystem::path& file, offload::SwapFile::Options io)
    : layout_(layout), dtype_(dtype), es_(c10::elementSize(dtype)), slots_mem_(std::move(slots)) {
  // Each bucket's region, and a slot as large as the largest.
  std::size_t bytes = 0;
  for (const Bucket& b : layout_.buckets()) {
    region_.push_back(bytes);
    const std::size_t r = param_region_bytes(b, static_cast<int>(es_));
    slot_bytes_ = std::max(slot_bytes_, r);
    bytes += r;
  }
  const std::size_t mem = static_cast<std::size_t>(slots_mem_.nbytes());
  ZERO_INTERNAL_ASSERT(slot_bytes_ > 0 && mem >= slot_bytes_ + kSwapAlignBytes, "the NVMe parameter buffers (", mem,
                       " bytes) do not hold one chunk of ", slot_bytes_);
  slots_.resize((mem - kSwapAlignBytes) / slot_bytes_);
  swap_ = std::make_unique<offload::SwapFile>(file, bytes, io);
}

ParamSwap::~ParamSwap() = default;

char* ParamSwap::slot_data(std::size_t s) const {
  return swap_aligned(static_cast<char*>(slots_mem_.data_ptr())) + s * slot_bytes_;
}

at::Tensor ParamSwap::slot_tensor(std::size_t s, int b) const {
  const std::size_t begin = static_cast<std::size_t>(slot_data(s) - static_cast<char*>(slots_mem_.data_ptr()));
  const std::size_t n = layout_.buckets()[static_cast<std::size_t>(b)].chunk;
  return slots_mem_.narrow(0, i64(begin), i64(n * es_)).view(dtype_);
}

std::size_t ParamSwap::region_bytes(int b) const {
  return param_region_bytes(layout_.buckets()[static_cast<std::size_t>(b)], static_cast<int>(es_));
}

int ParamSwap::find(int b) const {
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].state != State::kFree && slots_[s].bucket == b) return static_cast<int>(s);
  }
  return -1;
}

int ParamSwap::take(bool wait) {
  int best = -1;
  // A free slot; else the least recently used one not in use and not being
  // filled, those reserved for a coming gather last; read-ahead (!wait)
  // takes only slots that hold a chunk nobody waits for.
  auto rank = [&](const Slot& sl) { return std::pair<int, std::uint64_t>{sl.ahead ? 1 : 0, sl.used}; };
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    const Slot& sl = slots_[s];
    if (sl.state == State::kFree) {
      best = static_cast<int>(s);
      break;
    }
    if (sl.in_use || sl.state == State::kFilling) continue;
    if (!wait && (sl.ahead || sl.state != State::kReady)) continue;
    if (best < 0 || rank(sl) < rank(slots_[static_cast<std::size_t>(best)])) best = static_cast<int>(s);
  }
  if (best < 0) return -1;
  quiesce(static_cast<std::size_t>(best));
  slots_[static_cast<std::size_t>(best)] = Slot{};
  return best;
}

void ParamSwap::quiesce(std::size_t s) {
  Slot& sl = slots_[s];
  settle_slot(s, /*drop_read=*/true);
  if (sl.wait_copy) {
    const std::function<void()> wait = std::move(sl.wait_copy);
    sl.wait_copy = nullptr;
    wait();
  }
}

void ParamSwap::settle_slot(std::size_t s, bool drop_read) {
  Slot& sl = slots_[s];
  if (sl.state != State::kReading && sl.state != State::kWriting) return;
  const bool reading = sl.state == State::kReading;
  const offload::SwapFile::Ticket t = sl.ticket;
  sl.ticket = 0;
  try {
    swap_->wait(t);
  } catch (...) {
    // A failed read leaves nothing; a failed write leaves the file behind
    // the slot: either way the slot no longer says what the file holds.
    // (Its copy out, if one is queued, still reads it: kept.)
    std::function<void()> wait = std::move(sl.wait_copy);
    sl = Slot{};
    sl.wait_copy = std::move(wait);
    if (reading && drop_read) return;  // nobody wanted it
    throw;
  }
  sl.state = State::kReady;
}

void ParamSwap::start_read(std::size_t s, int b, bool ahead, bool count) {
  Slot& sl = slots_[s];
  sl.state = State::kReading;
  sl.bucket = b;
  sl.ahead = ahead;
  sl.used = ++clock_;
  sl.ticket = swap_->read(region_[static_cast<std::size_t>(b)], slot_data(s), region_bytes(b));
  if (count) ++counters_.reads;
  if (ahead) ++counters_.read_ahead;
}

void ParamSwap::new_pass() {
  if (!this_pass_.empty()) last_pass_ = std::move(this_pass_);
  this_pass_.clear();
  expect_ = 0;
  for (Slot& sl : slots_) sl.ahead = false;
}

at::Tensor ParamSwap::chunk(int b) {
  // Gathers with no publish between them (evaluation only, or a long
  // accumulation window): a pass ends after a bound, so that its record
  // stays bounded and the reads follow it (the order repeats).
  if (this_pass_.size() >= kMaxPassPerBucket * layout_.buckets().size() + kMaxPassExtra) new_pass();
  this_pass_.push_back(b);
  int s = find(b);
  if (s >= 0 && slots_[static_cast<std::size_t>(s)].state == State::kFilling) {
    // Left by a publish that failed part-way: the file has the chunk.
    slots_[static_cast<std::size_t>(s)] = Slot{};
    s = -1;
  }
  if (s >= 0) {
    Slot& sl = slots_[static_cast<std::size_t>(s)];
    if (sl.state == State::kReading && !swap_->done(sl.ticket)) ++counters_.waited;
    settle_slot(static_cast<std::size_t>(s));
  } else {
    s = take(/*wait=*/true);
    ZERO_INTERNAL_ASSERT(s >= 0, "no NVMe parameter buffer is free for bucket ", b);
    start_read(static_cast<std::size_t>(s), b, /*ahead=*/false);
    ++counters_.waited;
    settle_slot(static_cast<std::size_t>(s));
  }
  Slot& sl = slots_[static_cast<std::size_t>(s)];
  sl.ahead = false;
  sl.used = ++clock_;
  sl.in_use = true;
  try {
    read_ahead(b);
  } catch (...) {
    sl.in_use = false;
    throw;
  }
  return slot_tensor(static_cast<std::size_t>(s), b);
}

void ParamSwap::done_with(int b, std::function<void()> wait_copy) {
  const int s = find(b);
  ZERO_INTERNAL_ASSERT(s >= 0 && slots_[static_cast<std::size_t>(s)].in_use, "bucket ", b, " was not handed out");
  Slot& sl = slots_[static_cast<std::size_t>(s)];
  sl.in_use = false;
  // A later copy's wait covers an earlier one's (a lane runs its copies in order).
  if (wait_copy) sl.wait_copy = std::move(wait_copy);
}

void ParamSwap::read_ahead(int b) {
  // Where this pass is in the last one: the next entry, or b's next place.
  const std::size_t n = last_pass_.size();
  if (expect_ < n && last_pass_[expect_] == b) {
    ++expect_;
  } else {
    std::size_t at = n;
    for (std::size_t k = 0; k < n && at == n; ++k) {
      const std::size_t i = (expect_ + k) % n;
      if (last_pass_[i] == b) at = i;
    }
    if (at == n) return;  // not gathered in the last pass: nothing to follow
    expect_ = at + 1;
  }
  // The coming gathers: their chunks reserved where a slot holds them,
  // read into the free slots (or those holding chunks nobody waits for).
  for (std::size_t i = expect_; i < n; ++i) {
    const int c = last_pass_[i];
    if (c == b) continue;
    const int held = find(c);
    if (held >= 0) {
      Slot& sl = slots_[static_cast<std::size_t>(held)];
      if (sl.state != State::kFilling) sl.ahead = true;
      continue;
    }
    const int s = take(/*wait=*/false);
    if (s < 0) return;
    start_read(static_cast<std::size_t>(s), c, /*ahead=*/true);
  }
}

void ParamSwap::write(int b, std::size_t offset, const at::Tensor& values) {
  const Bucket& bucket = layout_.buckets()[static_cast<std::size_t>(b)];
  const std::size_t n = static_cast<std::size_t>(values.numel());
  ZERO_INTERNAL_ASSERT(offset + n <= bucket.chunk, "a write past bucket ", b, "'s chunk");
  int s = find(b);
  if (s >= 0 && slots_[static_cast<std::size_t>(s)].state != State::kFilling) {
    // An older copy of the chunk: done with its read or write (a failed
    // read of it does not matter: it is overwritten), then refilled.
    Slot& sl = slots_[static_cast<std::size_t>(s)];
    ZERO_INTERNAL_ASSERT(!sl.in_use, "bucket ", b, " written while a gather reads it");
    quiesce(static_cast<std::size_t>(s));
    if (sl.state == State::kFree) {  // its read failed: the slot is free again
      sl.bucket = b;
    }
    sl.state = State::kFilling;
    sl.filled = 0;
  } else if (s < 0) {
    s = take(/*wait=*/true);
    ZERO_INTERNAL_ASSERT(s >= 0, "no NVMe parameter buffer is free for bucket ", b, "'s update");
    Slot& sl = slots_[static_cast<std::size_t>(s)];
    sl.state = State::kFilling;
    sl.bucket = b;
  }
  Slot& sl = slots_[static_cast<std::size_t>(s)];
  sl.used = ++clock_;
  slot_tensor(static_cast<std::size_t>(s), b).narrow(0, i64(offset), i64(n)).copy_(values.reshape({-1}));
  sl.filled += n;
  ZERO_INTERNAL_ASSERT(sl.filled <= bucket.chunk, "bucket ", b, "'s chunk written more than once");
  if (sl.filled < bucket.chunk) return;
  sl.state = State::kWriting;
  sl.ahead = false;
  sl.ticket = swap_->write(region_[static_cast<std::size_t>(b)], slot_data(static_cast<std::size_t>(s)),
                           region_bytes(b));
  ++counters_.writes;
}

void ParamSwap::flush() {
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    ZERO_INTERNAL_ASSERT(slots_[s].state != State::kFilling, "bucket ", slots_[s].bucket, "'s chunk was written in part (",
                         slots_[s].filled, " elements)");
  }
  // The writes (a failed one throws); the reads ahead go on.
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].state == State::kWriting) settle_slot(s);
  }
  new_pass();
}

void ParamSwap::discard_partial() {
  for (Slot& sl : slots_) {
    if (sl.state == State::kFilling) sl = Slot{};
  }
}

at::Tensor ParamSwap::read_copy(int b) {
  discard_partial();
  int s = find(b);
  if (s < 0) {
    s = take(/*wait=*/true);
    ZERO_INTERNAL_ASSERT(s >= 0, "no NVMe parameter buffer is free to read bucket ", b);
    start_read(static_cast<std::size_t>(s), b, /*ahead=*/false, /*count=*/false);
  }
  settle_slot(static_cast<std::size_t>(s));
  return slot_tensor(static_cast<std::size_t>(s), b).clone();
}

void ParamSwap::settle_writes() {
  ZERO_INTERNAL_ASSERT(!writer_, "a streamed load of the parameters is not finished");
  discard_partial();
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].state == State::kWriting) settle_slot(s);
  }
}

ParamSwap::FileRun ParamSwap::file_run(std::uint64_t offset, std::size_t n) const {
  const std::vector<Bucket>& buckets = layout_.buckets();
  const std::size_t element = static_cast<std::size_t>(offset / es_);
  // (The chunks are in partition order, one after another.)
  const auto next = std::upper_bound(buckets.begin(), buckets.end(), element,
                                     [](std::size_t e, const Bucket& b) { return e < b.partition_offset; });
  ZERO_INTERNAL_ASSERT(next != buckets.begin(), "partition byte ", offset, " is in no chunk");
  const auto b = static_cast<std::size_t>(std::prev(next) - buckets.begin());
  const std::size_t in_chunk = static_cast<std::size_t>(offset) - buckets[b].partition_offset * es_;
  ZERO_INTERNAL_ASSERT(in_chunk < buckets[b].chunk * es_, "partition byte ", offset, " is past the partition");
  return {region_[b] + in_chunk, std::min(n, buckets[b].chunk * es_ - in_chunk)};
}

std::pair<const char*, std::size_t> ParamSwap::read_bytes(std::uint64_t offset, std::size_t n, char* buf,
                                                          std::size_t cap) const {
  // (A chunk's region is rounded up to 4096 bytes: the aligned read stays inside it.)
  const FileRun run = file_run(offset, n);
  return offload::read_span(*swap_, run.pos, run.n, buf, cap);
}

void ParamSwap::write_bytes(std::uint64_t offset, const void* src, std::size_t n) {
  if (!writer_) {
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      ZERO_INTERNAL_ASSERT(!slots_[s].in_use, "bucket ", slots_[s].bucket, " loaded while a gather reads it");
      quiesce(s);
      slots_[s] = Slot{};
    }
    writer_ = std::make_unique<offload::SwapStreamWriter>(
        *swap_, std::array<char*, 2>{slot_data(0), slots_.size() > 1 ? slot_data(1) : nullptr}, slot_bytes_);
  }
  const char* from = static_cast<const char*>(src);
  while (n > 0) {
    const FileRun run = file_run(offset, n);
    const std::size_t took = writer_->write(run.pos, from, run.n);
    from += took;
    offset += took;
    n -= took;
  }
}

void ParamSwap::finish_writes() {
  if (!writer_) return;
  const std::unique_ptr<offload::SwapStreamWriter> writer = std::move(writer_);
  writer->finish();
}

}  // namespace zero::detail
