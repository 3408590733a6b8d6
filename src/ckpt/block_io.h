// Sequential file I/O in blocks, for checkpoint files: O_DIRECT where asked
// and the filesystem takes it (the bytes go from our buffer to the disk,
// without a copy into the page cache and without the kernel's dirty-page
// throttling), buffered I/O otherwise (tmpfs, some network filesystems);
// I/O threads that run a file's requests while the caller fills (copy and
// checksum) the next block.
//
// Internal to zero_ckpt (shard_io.cpp is the user).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zero::ckpt::detail {

// O_DIRECT wants buffers, offsets and lengths in multiples of the logical
// block size (512 or 4096 bytes): 4096 serves both.
inline constexpr std::size_t kDirectAlign = 4096;

// How checkpoint files are written and read: ZERO_CKPT_IO=direct|buffered,
// or by default O_DIRECT writes and reads through the page cache with its
// readahead (on the development VM: direct writes 1.8–2.0 GB/s against
// 0.5 buffered; buffered reads 1.8–2.0 GB/s against 1.2–1.6 direct).
enum class IoMode { kDefault, kDirect, kBuffered };
IoMode io_mode();
bool direct_writes();
bool direct_reads();

// A heap block aligned to kDirectAlign.
class AlignedBlock {
 public:
  explicit AlignedBlock(std::size_t bytes);
  ~AlignedBlock();
  AlignedBlock(const AlignedBlock&) = delete;
  AlignedBlock& operator=(const AlignedBlock&) = delete;
  AlignedBlock(AlignedBlock&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  char* data() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  char* p_ = nullptr;
  std::size_t n_ = 0;
};

// One thread that runs jobs in the order they were submitted. Jobs are
// numbered from 0; completed() counts the jobs done. The first job that
// throws stops the rest (they are skipped) and its exception is rethrown by
// the next submit() or wait_*() on the owner's side.
class IoThread {
 public:
  IoThread();
  ~IoThread();  // lets the running job end, drops the queued ones, joins
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  void submit(std::function<void()> job);
  // Blocks until at least `n` jobs are done (or one failed: rethrown).
  void wait_completed(std::uint64_t n);
  void wait_all();

 private:
  void run();
  void rethrow_locked();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::uint64_t submitted_ = 0, completed_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

// A file descriptor and whether it does direct I/O. The flags are open(2)'s
// without O_DIRECT; it is added where `direct` asks and the filesystem
// takes it.
struct OpenedFile {
  int fd = -1;
  bool direct = false;
  int error = 0;  // errno of a failed open
};
OpenedFile open_file(const char* path, int flags, bool direct, int mode = 0644);

// All of [data, data + n) to `fd` at `offset`, or all that the file holds
// there on reading (returns the bytes read: fewer only at its end). Where
// the file is direct and the kernel refuses the request (EINVAL), the file
// leaves direct mode and the request is retried through the page cache
// (`direct` is shared by the file's I/O threads). Errors: errno (a short
// write is ENOSPC).
int write_at(int fd, std::atomic<bool>& direct, const char* data, std::size_t n, std::uint64_t offset);
int read_at(int fd, std::atomic<bool>& direct, char* data, std::size_t n, std::uint64_t offset, std::size_t& got);

}  // namespace zero::ckpt::detail
