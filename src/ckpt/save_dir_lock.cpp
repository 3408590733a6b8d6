#include "zero/ckpt/save_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

#include "zero/core/error.h"

namespace zero::ckpt {

namespace {

std::string holder_text() {
  char host[256] = "?";
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  host[sizeof host - 1] = '\0';
  const std::time_t now = std::time(nullptr);
  char when[32] = "?";
  std::tm utc{};
  if (::gmtime_r(&now, &utc) != nullptr) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
  return "pid " + std::to_string(::getpid()) + " on " + host + ", since " + when;
}

// What the holder wrote ("pid 123 on node7, since ..."), or "" if nothing
// readable is there yet (it writes just after it locks).
std::string read_holder(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  std::string text(buf, static_cast<std::size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  for (char& c : text) {
    if (c < 0x20 || c == 0x7f) c = '?';
  }
  return text;
}

}  // namespace

SaveDirLock::SaveDirLock(const std::filesystem::path& dir, const std::string& option, const std::string& clash) {
  const std::string path = (dir / kSaveDirLockName).string();
  // O_NOFOLLOW: never a file someone linked here. 0666 less the umask: a
  // group's shared folder stays lockable by its members. A lock file this
  // process may not write (another user's) is opened to read: flock needs
  // no write access.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd_ < 0 && errno == EACCES) fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd_ < 0) {
    const int e = errno;
    ZERO_CHECK(e != ELOOP, option, " ", dir.string(), ": its lock file ", path,
               " is a symbolic link, which zerocpp does not follow: remove it, or give another folder (", option, ")");
    // No lock file (a full disk, a quota, a read-only folder): the folder
    // is not guarded, which is no reason to refuse the run.
    warning_ = zero::detail::str_cat(option, " ", dir.string(), " is not locked against a second job (cannot create ",
                                     path, ": ", std::strerror(e), ")");
    return;
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    const std::string holder = e == EWOULDBLOCK ? read_holder(fd_) : "";
    ::close(fd_);
    fd_ = -1;
    ZERO_CHECK(e != EWOULDBLOCK, option, " ", dir.string(), " is in use by another running job",
               holder.empty() ? std::string() : " (" + holder + ")",
               ": ", clash, ". Give this job another ", option, ", or wait until that job has ended");
    // A filesystem without flock (Lustre without -o flock: ENOSYS; some NFS
    // setups: ENOLCK) trains as it did before the lock existed.
    warning_ = zero::detail::str_cat(option, " ", dir.string(), " is not locked against a second job (flock: ",
                                     std::strerror(e), "; the filesystem does not lock)");
    return;
  }
  const std::string text = holder_text() + "\n";
  // Best effort: the lock holds without the text, which only names the holder.
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t written = ::pwrite(fd_, text.data(), text.size(), 0);
    (void)written;
  }
}

SaveDirLock::~SaveDirLock() {
  if (fd_ >= 0) ::close(fd_);  // the lock goes with the descriptor; the file stays (see the header)
}

}  // namespace zero::ckpt
