#include "zero/offload/swap_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "zero/core/error.h"

namespace zero::offload {
namespace {

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

std::string free_space(const std::filesystem::path& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return "unknown";
  return std::to_string(static_cast<unsigned long long>(s.f_bavail) * s.f_frsize) + " bytes";
}

}  // namespace

SwapFile::SwapFile(std::filesystem::path path, std::size_t bytes, Options options)
    : path_(std::move(path)), bytes_(bytes), o_(options) {
  ZERO_CHECK(o_.io_threads >= 1, "the NVMe swapper needs at least one I/O thread (aio.thread_count), got ",
             o_.io_threads);
  ZERO_CHECK(o_.block_bytes >= kAlign && o_.block_bytes % kAlign == 0, "aio.block_size must be a multiple of ",
             kAlign, " bytes, got ", o_.block_bytes);
  ZERO_CHECK(bytes_ % kAlign == 0, "an NVMe swap file's size must be a multiple of ", kAlign, ", got ", bytes_);
  const std::filesystem::path dir = path_.parent_path().empty() ? "." : path_.parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    const std::string d = dir.string();
    ZERO_CHECK(!std::filesystem::exists(dir, ec), "nvme_path '", d,
               "' is a file, not a folder: name a folder on the NVMe drive in ", o_.setting);
    ZERO_CHECK(d.empty() || d[0] != '~', "nvme_path '", d,
               "' does not exist: zerocpp does not expand '~'; give the full path in ", o_.setting);
    ZERO_CHECK(false, "nvme_path '", d, "' is not a folder that exists: create it (mkdir -p ", d,
               ") on the NVMe drive, or name another in ", o_.setting);
  }
  // The lock: a small file of its own, so that the swap file can go from
  // the folder at once (below). O_NOFOLLOW: never a file someone linked here.
  lock_path_ = path_.string() + ".lock";
  lock_fd_ = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  const int open_error = errno;
  ZERO_CHECK(lock_fd_ >= 0, "cannot create the NVMe lock file '", lock_path_, "': ",
             open_error == ELOOP ? std::string("it is a symbolic link, which zerocpp does not follow")
                                 : errno_text(open_error),
             ". Give ", o_.setting, " a folder this process may write to, holding no links of these names");
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::close(lock_fd_);
    ZERO_CHECK(false, "the NVMe swap file '", path_.string(), "' is ",
               e == EWOULDBLOCK ? "in use by another running process or engine (the same nvme_path given twice?)"
                                : "not lockable (" + errno_text(e) + ")",
               ": give each job a folder of its own in ", o_.setting);
  }
  auto fail = [&](int err, const std::string& before, const std::string& after) {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(lock_path_.c_str());
    ::close(lock_fd_);
    ZERO_CHECK(false, before, errno_text(err), after);
  };
  // What a job that died left here is ours to replace (the lock says no one
  // else uses it); unlink removes a link, never what it points to. O_EXCL
  // makes the file new and regular.
  ::unlink(path_.c_str());
  // Created without O_DIRECT, which is then asked for: a filesystem that
  // refuses it (EINVAL) keeps buffered I/O. (Opened with it, such a
  // filesystem makes the file and then fails, and O_EXCL refuses a retry.)
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd_ >= 0) {
    const int fl = ::fcntl(fd_, F_GETFL);
    direct_ = fl >= 0 && ::fcntl(fd_, F_SETFL, fl | O_DIRECT) == 0;
  }
  if (fd_ < 0) {
    fail(errno, "cannot create the NVMe swap file '" + path_.string() + "': ",
         ". Give " + o_.setting + " a folder this process may write to");
  }
  // Gone from the folder at once: its space goes back to the drive when the
  // process ends, however it ends (an error, Ctrl-C, SIGTERM, kill -9).
  ::unlink(path_.c_str());
  int err = 0;
  if (bytes_ > 0) {
    err = ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes_));
    if (err == EOPNOTSUPP || err == EINVAL) err = ::ftruncate(fd_, static_cast<off_t>(bytes_)) == 0 ? 0 : errno;
  }
  if (err != 0) {
    fail(err, "cannot allocate " + std::to_string(bytes_) + " bytes for the NVMe swap file '" + path_.string() + "': ",
         " (the filesystem has " + free_space(dir) +
             " free; each rank on this drive needs a file of its own). Free space there, or name a larger drive in " +
             o_.setting);
  }
  for (int i = 0; i < o_.io_threads; ++i) threads_.emplace_back([this] { run(); });
}

SwapFile::~SwapFile() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  ::close(fd_);  // the (unlinked) file's space goes back to the drive
  ::unlink(lock_path_.c_str());
  ::close(lock_fd_);
}

SwapFile::Ticket SwapFile::read(std::size_t offset, void* dst, std::size_t bytes) {
  return submit(false, offset, static_cast<char*>(dst), bytes);
}

SwapFile::Ticket SwapFile::write(std::size_t offset, const void* src, std::size_t bytes) {
  return submit(true, offset, static_cast<char*>(const_cast<void*>(src)), bytes);
}

SwapFile::Ticket SwapFile::submit(bool write, std::size_t offset, char* data, std::size_t bytes) {
  ZERO_CHECK(offset % kAlign == 0 && bytes % kAlign == 0 && reinterpret_cast<std::uintptr_t>(data) % kAlign == 0,
             "NVMe swap request not aligned to ", kAlign, " bytes (offset ", offset, ", ", bytes, " bytes)");
  ZERO_CHECK(offset <= bytes_ && bytes <= bytes_ - offset, "NVMe swap request past the end of '", path_.string(),
             "' (offset ", offset, ", ", bytes, " bytes, file ", bytes_, " bytes)");
  std::size_t blocks = 0;
  Ticket t = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t = next_++;
    for (std::size_t at = 0; at < bytes; at += o_.block_bytes) {
      queue_.push_back(Block{t, write, offset + at, data + at, std::min(o_.block_bytes, bytes - at)});
      ++blocks;
    }
    pending_[t].blocks_left = blocks;
  }
  if (blocks > 0) work_cv_.notify_all();
  return t;
}

void SwapFile::wait(Ticket ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  ZERO_CHECK(pending_.count(ticket) == 1, "NVMe swap ticket ", ticket, " is unknown or was waited for already");
  // (Found again each time: a submit on another thread may rehash the map.)
  done_cv_.wait(lock, [&] { return pending_.find(ticket)->second.blocks_left == 0; });
  auto it = pending_.find(ticket);
  const std::exception_ptr error = it->second.error;
  pending_.erase(it);
  if (error) std::rethrow_exception(error);
}

bool SwapFile::done(Ticket ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = pending_.find(ticket);
  ZERO_CHECK(it != pending_.end(), "NVMe swap ticket ", ticket, " is unknown or was waited for already");
  return it->second.blocks_left == 0;
}

void SwapFile::wait_all() {
  std::vector<Ticket> tickets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [t, p] : pending_) tickets.push_back(t);
  }
  std::exception_ptr first;
  for (Ticket t : tickets) {
    try {
      wait(t);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void SwapFile::run() {
  for (;;) {
    Block b{};
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      b = queue_.front();
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      transfer(b);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      Pending& p = pending_.find(b.ticket)->second;
      if (error && !p.error) p.error = error;
      --p.blocks_left;
    }
    done_cv_.notify_all();
  }
}

void SwapFile::transfer(const Block& b) const {
  std::size_t done = 0;
  while (done < b.bytes) {
    const off_t at = static_cast<off_t>(b.offset + done);
    const ssize_t n = b.write ? ::pwrite(fd_, b.data + done, b.bytes - done, at)
                              : ::pread(fd_, b.data + done, b.bytes - done, at);
    if (n < 0 && errno == EINTR) continue;
    ZERO_CHECK(n > 0, "NVMe swap file '", path_.string(), "': ", b.write ? "writing " : "reading ", b.bytes,
               " bytes at offset ", b.offset, " failed: ", n == 0 ? std::string("the file ends early") : errno_text(errno),
               ". What the file holds there (", o_.contents, ") is lost: check the drive (dmesg), then resume from the "
               "last checkpoint");
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace zero::offload
