#include "block_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "zero/core/log.h"

namespace zero::ckpt::detail {

IoMode io_mode() {
  const char* env = std::getenv("ZERO_CKPT_IO");
  if (env && std::strcmp(env, "direct") == 0) return IoMode::kDirect;
  if (env && std::strcmp(env, "buffered") == 0) return IoMode::kBuffered;
  if (env && *env) {
    // A typo would otherwise measure the default while the user thinks it
    // is another way: said once per process.
    static std::once_flag said;
    std::call_once(said, [env] {
      zero::detail::log_warning(log_topic::checkpoint,
                          "ZERO_CKPT_IO=%s is not 'direct' or 'buffered' (lower case): ignored, checkpoint files are "
                          "written with O_DIRECT and read through the page cache (the default); set one of the two or "
                          "unset it",
                          env);
    });
  }
  return IoMode::kDefault;
}
bool direct_writes() { return io_mode() != IoMode::kBuffered; }
bool direct_reads() { return io_mode() == IoMode::kDirect; }

AlignedBlock::AlignedBlock(std::size_t bytes) : n_(bytes) {
  void* p = nullptr;
  if (::posix_memalign(&p, kDirectAlign, bytes == 0 ? kDirectAlign : bytes) != 0) throw std::bad_alloc();
  p_ = static_cast<char*>(p);
}

AlignedBlock::~AlignedBlock() { std::free(p_); }

IoThread::IoThread() : thread_([this] { run(); }) {}

IoThread::~IoThread() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void IoThread::rethrow_locked() {
  if (error_) std::rethrow_exception(error_);
}

void IoThread::submit(std::function<void()> job) {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    rethrow_locked();
    queue_.push_back(std::move(job));
    ++submitted_;
  }
  cv_.notify_all();
}

void IoThread::wait_completed(std::uint64_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return completed_ >= n || error_; });
  rethrow_locked();
}

void IoThread::wait_all() {
  std::uint64_t n;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    n = submitted_;
  }
  wait_completed(n);
}

void IoThread::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = error_ != nullptr;
    lock.unlock();
    std::exception_ptr failed;
    if (!skip) {
      try {
        job();
      } catch (...) {
        failed = std::current_exception();
      }
    }
    lock.lock();
    if (failed && !error_) error_ = failed;
    ++completed_;
    cv_.notify_all();
  }
}

OpenedFile open_file(const char* path, int flags, bool direct, int mode) {
  OpenedFile f;
  if (direct) {
    f.fd = ::open(path, flags | O_DIRECT | O_CLOEXEC, mode);
    if (f.fd >= 0) {
      f.direct = true;
      return f;
    }
    // EINVAL: this filesystem has no direct I/O (tmpfs). Any other error
    // is the path's, and the buffered open below will say it again.
  }
  f.fd = ::open(path, flags | O_CLOEXEC, mode);
  f.error = f.fd < 0 ? errno : 0;
  return f;
}

namespace {

// Leaves direct mode for good (for this file).
void drop_direct(int fd, std::atomic<bool>& direct) {
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) (void)::fcntl(fd, F_SETFL, fl & ~O_DIRECT);
  direct = false;
}

}  // namespace

int write_at(int fd, std::atomic<bool>& direct, const char* data, std::size_t n, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd, data + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EINVAL && direct) {
      drop_direct(fd, direct);
      continue;
    }
    if (w < 0) return errno;
    if (w == 0) return ENOSPC;
    done += static_cast<std::size_t>(w);
  }
  return 0;
}

int read_at(int fd, std::atomic<bool>& direct, char* data, std::size_t n, std::uint64_t offset, std::size_t& got) {
  got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, data + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EINVAL && direct) {
      drop_direct(fd, direct);
      continue;
    }
    if (r < 0) return errno;
    if (r == 0) return 0;  // end of file
    got += static_cast<std::size_t>(r);
    // A direct read that ends short of a block boundary is at the end.
    if (direct && got % kDirectAlign != 0) return 0;
  }
  return 0;
}

}  // namespace zero::ckpt::detail
