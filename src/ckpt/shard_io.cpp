#include "zero/ckpt/shard_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <csignal>
#include <cstdlib>

#include "zero/ckpt/crc32c.h"
#include "zero/core/error.h"

namespace zero::ckpt {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

// Fault injection for the crash tests (tests/train/ckpt_crash_test.sh):
// ZERO_CKPT_TEST_KILL="<n>:<name part>:<bytes>|end" kills this process with
// SIGKILL during the n-th file it writes (counting from 1) whose name
// contains <name part>, once <bytes> bytes are written, or after the file is
// complete and fsync'd ("end": between the files and the commit).
struct KillSpec {
  int nth = 0;
  std::string part;
  std::uint64_t bytes = 0;
  bool at_end = false;
};
std::optional<KillSpec> kill_spec(const std::string& file) {
  static int files_seen = 0;
  const char* env = std::getenv("ZERO_CKPT_TEST_KILL");
  if (!env) return std::nullopt;
  const std::string s = env;
  const auto a = s.find(':'), b = s.find(':', a + 1);
  if (a == std::string::npos || b == std::string::npos) return std::nullopt;
  KillSpec k;
  k.nth = std::atoi(s.substr(0, a).c_str());
  k.part = s.substr(a + 1, b - a - 1);
  if (file.find(k.part) == std::string::npos) return std::nullopt;
  if (++files_seen != k.nth) return std::nullopt;
  k.at_end = s.substr(b + 1) == "end";
  if (!k.at_end) k.bytes = std::strtoull(s.substr(b + 1).c_str(), nullptr, 10);
  return k;
}

std::string write_fix(int e) {
  if (e == ENOSPC || e == EDQUOT) return "free space on that disk or save somewhere else (--save-dir)";
  if (e == EACCES || e == EPERM || e == EROFS) return "make the folder writable or save somewhere else (--save-dir)";
  return "check the disk and the folder, or save somewhere else (--save-dir)";
}

}  // namespace

ShardWriter::ShardWriter(std::filesystem::path path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int e = errno;
  if (const auto k = kill_spec(path_.filename().string())) {
    kill_after_ = k->at_end ? ~std::uint64_t{0} - 1 : k->bytes;
    kill_at_end_ = k->at_end;
  }
  ZERO_CHECK(fd_ >= 0, "cannot create checkpoint file ", path_.string(), ": ", errno_text(e), "; ", write_fix(e),
             ". The previous checkpoint is untouched");
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void ShardWriter::begin_section(const std::string& name, const std::string& dtype, std::vector<std::int64_t> shape) {
  ZERO_INTERNAL_ASSERT(!in_section_, "section ", name, " begun inside another");
  SectionRecord s;
  s.name = name;
  s.dtype = dtype;
  s.shape = std::move(shape);
  s.offset = bytes_;
  sections_.push_back(std::move(s));
  in_section_ = true;
}

void ShardWriter::write(const void* data, std::size_t n) {
  ZERO_INTERNAL_ASSERT(in_section_, "write outside a section");
  const auto* p = static_cast<const char*>(data);
  std::size_t left = n;
  while (left > 0) {
    const std::size_t piece = std::min(left, kIoBlock);
    const ssize_t w = ::write(fd_, p, piece);
    if (w < 0 && errno == EINTR) continue;
    const int e = errno;
    ZERO_CHECK(w > 0, "writing checkpoint file ", path_.string(), " failed after ", bytes_, " bytes: ",
               w == 0 ? std::string("nothing written") : errno_text(e), "; ", write_fix(e),
               ". The save is abandoned and the previous checkpoint is untouched");
    crc_ = crc32c(crc_, p, static_cast<std::size_t>(w));
    p += w;
    left -= static_cast<std::size_t>(w);
    bytes_ += static_cast<std::uint64_t>(w);
    // Write-behind: start the disk on what is written every 64 MiB, so that
    // the final fsync finds little left and dirty pages do not pile up.
    if (bytes_ - flushed_ >= (std::uint64_t{64} << 20)) {
      ::sync_file_range(fd_, static_cast<off_t>(flushed_), static_cast<off_t>(bytes_ - flushed_), SYNC_FILE_RANGE_WRITE);
      flushed_ = bytes_;
    }
    if (bytes_ >= kill_after_ && !kill_at_end_) {
      ::fsync(fd_);
      std::raise(SIGKILL);
    }
  }
}

void ShardWriter::end_section() {
  ZERO_INTERNAL_ASSERT(in_section_, "end_section without a section");
  sections_.back().bytes = bytes_ - sections_.back().offset;
  in_section_ = false;
}

FileRecord ShardWriter::finish(int rank) {
  ZERO_INTERNAL_ASSERT(!in_section_, "finish inside a section");
  const int rc = ::fsync(fd_);
  const int e = errno;
  ZERO_CHECK(rc == 0, "fsync of checkpoint file ", path_.string(), " failed: ", errno_text(e), "; ", write_fix(e));
  if (kill_at_end_) std::raise(SIGKILL);
  const int rc2 = ::close(fd_);
  fd_ = -1;
  ZERO_CHECK(rc2 == 0, "closing checkpoint file ", path_.string(), " failed: ", errno_text(errno));
  FileRecord f;
  f.name = path_.filename().string();
  f.rank = rank;
  f.bytes = bytes_;
  f.crc32c = crc_;
  f.sections = sections_;
  return f;
}

namespace {

// A checkpoint file opened for reading, its size checked against the
// manifest's; closed when it goes.
struct ShardFd {
  int fd = -1;
  ShardFd(const std::filesystem::path& path, const FileRecord& rec) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    const int e = errno;
    ZERO_CHECK(fd >= 0, "cannot open checkpoint file ", path.string(), ": ", errno_text(e),
               e == ENOENT ? "; the checkpoint is incomplete (a shard is missing): load another tag" : "");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int se = errno;
      ::close(fd);
      ZERO_CHECK(false, "cannot stat checkpoint file ", path.string(), ": ", errno_text(se));
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size != rec.bytes) {
      ::close(fd);
      ZERO_CHECK(false, "checkpoint file ", path.string(), " has ", size, " bytes but the manifest says ", rec.bytes,
                 ": it is ", size < rec.bytes ? "truncated" : "longer than written", "; load another tag");
    }
  }
  ~ShardFd() { ::close(fd); }
  ShardFd(const ShardFd&) = delete;
  ShardFd& operator=(const ShardFd&) = delete;
};

}  // namespace

void read_range(const std::filesystem::path& path, const FileRecord& rec, std::uint64_t offset, std::uint64_t n,
                void* dst) {
  ZERO_CHECK(offset <= rec.bytes && n <= rec.bytes - offset, "checkpoint file ", path.string(), ": a read of ", n,
             " bytes at ", offset, " lies past its ", rec.bytes, " bytes");
  const ShardFd shard(path, rec);
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(shard.fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    ZERO_CHECK(r > 0, "reading checkpoint file ", path.string(), " at byte ", offset, " failed: ",
               r == 0 ? std::string("end of file (truncated while reading)") : errno_text(errno));
    p += r;
    offset += static_cast<std::uint64_t>(r);
    n -= static_cast<std::uint64_t>(r);
  }
}

void read_file(const std::filesystem::path& path, const FileRecord& rec, const std::vector<ReadRange>& ranges,
               bool verify, const RangeSink& sink) {
  for (const ReadRange& r : ranges) {
    ZERO_CHECK(r.offset <= rec.bytes && r.bytes <= rec.bytes - r.offset, "checkpoint file ", path.string(),
               ": a read of ", r.bytes, " bytes at ", r.offset, " lies past its ", rec.bytes, " bytes");
  }
  const ShardFd shard(path, rec);
  const int fd = shard.fd;
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  // Ranges by offset, so that one pass over the file serves them all.
  std::vector<std::size_t> order(ranges.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ranges[a].offset < ranges[b].offset; });
  std::unique_ptr<char[]> buf(new char[kIoBlock]);
  std::uint32_t crc = 0;
  std::size_t first = 0;  // the first range (in order) not yet past
  std::uint64_t pos = 0;
  // Without checksum, only the blocks some range touches are needed.
  const std::uint64_t end = verify ? rec.bytes : [&] {
    std::uint64_t last = 0;
    for (const ReadRange& r : ranges) last = std::max(last, r.offset + r.bytes);
    return last;
  }();
  while (pos < end) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(kIoBlock, end - pos));
    std::size_t got = 0;
    while (got < want) {
      const ssize_t r = ::pread(fd, buf.get() + got, want - got, static_cast<off_t>(pos + got));
      if (r < 0 && errno == EINTR) continue;
      ZERO_CHECK(r > 0, "reading checkpoint file ", path.string(), " at byte ", pos + got, " failed: ",
                 r == 0 ? std::string("end of file (truncated while reading)") : errno_text(errno));
      got += static_cast<std::size_t>(r);
    }
    if (verify) crc = crc32c(crc, buf.get(), got);
    const std::uint64_t block_end = pos + got;
    while (first < order.size() && ranges[order[first]].offset + ranges[order[first]].bytes <= pos) ++first;
    for (std::size_t k = first; k < order.size() && ranges[order[k]].offset < block_end; ++k) {
      const ReadRange& r = ranges[order[k]];
      const std::uint64_t a = std::max(r.offset, pos), b = std::min(r.offset + r.bytes, block_end);
      if (a >= b) continue;
      if (sink) {
        sink(order[k], a - r.offset, buf.get() + (a - pos), static_cast<std::size_t>(b - a));
      } else {
        std::memcpy(static_cast<char*>(r.dst) + (a - r.offset), buf.get() + (a - pos), static_cast<std::size_t>(b - a));
      }
    }
    pos = block_end;
  }
  if (verify) {
    ZERO_CHECK(crc == rec.crc32c, "checkpoint file ", path.string(), " is damaged: its CRC-32C is ", crc,
               " but the manifest says ", rec.crc32c, "; load another tag");
  }
}

}  // namespace zero::ckpt
