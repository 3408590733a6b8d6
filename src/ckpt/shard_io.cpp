#include "zero/ckpt/shard_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <csignal>
#include <cstdlib>

#include "block_io.h"
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
  if (e == ENOSPC || e == EDQUOT) return "free space on that disk or save somewhere else (zero-train: --save-dir)";
  if (e == EACCES || e == EPERM || e == EROFS) return "make the folder writable or save somewhere else (zero-train: --save-dir)";
  return "check the disk and the folder, or save somewhere else (zero-train: --save-dir)";
}

}  // namespace

struct ShardWriter::Blocks {
  detail::OpenedFile file;
  std::atomic<bool> direct{false};  // file.direct, until the filesystem refuses it
  bool padded = false;  // opened direct: blocks go out whole, the file is cut at finish
  std::vector<detail::AlignedBlock> ring;
  std::size_t fill = 0;        // bytes in the block being filled
  std::uint64_t next = 0;      // blocks handed to the I/O thread
  std::uint64_t file_off = 0;  // where the block being filled goes
  detail::IoThread io[kIoThreads];  // last: joined before the ring and the file go

  // Until block k is written (or read).
  void wait_block(std::uint64_t k) { io[k % kIoThreads].wait_completed(k / kIoThreads + 1); }
};

ShardWriter::ShardWriter(std::filesystem::path path) : path_(std::move(path)), blocks_(std::make_unique<Blocks>()) {
  blocks_->file = detail::open_file(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, detail::direct_writes());
  const int e = blocks_->file.error;
  if (const auto k = kill_spec(path_.filename().string())) {
    kill_after_ = k->at_end ? ~std::uint64_t{0} - 1 : k->bytes;
    kill_at_end_ = k->at_end;
  }
  ZERO_CHECK(blocks_->file.fd >= 0, "cannot create checkpoint file ", path_.string(), ": ", errno_text(e), "; ",
             write_fix(e), ". The previous checkpoint is untouched");
  blocks_->padded = blocks_->direct = blocks_->file.direct;
  for (std::size_t i = 0; i < kIoRing; ++i) blocks_->ring.emplace_back(kIoBlock);
}

ShardWriter::~ShardWriter() {
  if (!blocks_) return;
  const int fd = blocks_->file.fd;
  blocks_.reset();  // the I/O thread first
  if (fd >= 0) ::close(fd);
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

// The block being filled goes to the I/O thread (whole, zero-padded to the
// direct-I/O alignment where it is the last and short); the next block is
// the ring's next one, once the thread is done with it.
void ShardWriter::submit_block() {
  Blocks& b = *blocks_;
  char* data = b.ring[b.next % kIoRing].data();
  std::size_t len = b.fill;
  if (b.padded && len % detail::kDirectAlign != 0) {
    const std::size_t padded = (len + detail::kDirectAlign - 1) / detail::kDirectAlign * detail::kDirectAlign;
    std::memset(data + len, 0, padded - len);
    len = padded;
  }
  const std::uint64_t offset = b.file_off;
  b.io[b.next % kIoThreads].submit([&b, data, len, offset, path = path_.string()] {
    const int e = detail::write_at(b.file.fd, b.direct, data, len, offset);
    ZERO_CHECK(e == 0, "writing checkpoint file ", path, " failed after ", offset, " bytes: ", errno_text(e), "; ",
               write_fix(e), ". The save is abandoned and the previous checkpoint is untouched");
    // Write-behind through the page cache: start the disk on the block now,
    // so that the final fsync finds little left and dirty pages do not pile up.
    if (!b.direct) {
      ::sync_file_range(b.file.fd, static_cast<off_t>(offset), static_cast<off_t>(len), SYNC_FILE_RANGE_WRITE);
    }
  });
  ++b.next;
  b.file_off += b.fill;
  b.fill = 0;
  if (b.next >= kIoRing) b.wait_block(b.next - kIoRing);  // the last user of the next slot
}

// Everything handed over is on the disk, the file cut to its size.
void ShardWriter::flush_to_disk() {
  Blocks& b = *blocks_;
  if (b.fill > 0) submit_block();
  for (detail::IoThread& t : b.io) t.wait_all();
  if (b.padded && bytes_ % detail::kDirectAlign != 0) {
    const int rc = ::ftruncate(b.file.fd, static_cast<off_t>(bytes_));
    const int e = errno;
    ZERO_CHECK(rc == 0, "cutting checkpoint file ", path_.string(), " to its ", bytes_, " bytes failed: ",
               errno_text(e), "; ", write_fix(e));
  }
  const int rc = ::fsync(b.file.fd);
  const int e = errno;
  ZERO_CHECK(rc == 0, "fsync of checkpoint file ", path_.string(), " failed: ", errno_text(e), "; ", write_fix(e));
}

void ShardWriter::write(const void* data, std::size_t n) {
  ZERO_INTERNAL_ASSERT(in_section_, "write outside a section");
  Blocks& b = *blocks_;
  const auto* p = static_cast<const char*>(data);
  // In pieces of at most 1 MiB, so that the checksum reads the copy while
  // it is still in the cache.
  constexpr std::size_t kPiece = std::size_t{1} << 20;
  while (n > 0) {
    const std::size_t piece = std::min({n, kIoBlock - b.fill, kPiece});
    char* dst = b.ring[b.next % kIoRing].data() + b.fill;
    std::memcpy(dst, p, piece);
    crc_ = crc32c(crc_, dst, piece);
    p += piece;
    n -= piece;
    b.fill += piece;
    bytes_ += piece;
    if (b.fill == kIoBlock) submit_block();
    if (bytes_ >= kill_after_ && !kill_at_end_) {
      flush_to_disk();
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
  flush_to_disk();
  if (kill_at_end_) std::raise(SIGKILL);
  const int fd = blocks_->file.fd;
  blocks_.reset();
  const int rc2 = ::close(fd);
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

// A checkpoint file opened for reading (direct where asked and possible),
// its size checked against the manifest's; closed when it goes.
struct ShardFd {
  int fd = -1;
  std::atomic<bool> direct{false};  // shared by the I/O threads
  ShardFd(const std::filesystem::path& path, const FileRecord& rec, bool direct_io) {
    const detail::OpenedFile f = detail::open_file(path.c_str(), O_RDONLY, direct_io);
    fd = f.fd;
    direct = f.direct;
    const int e = f.error;
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

void check_file(const std::filesystem::path& path, const FileRecord& rec) {
  const ShardFd shard(path, rec, /*direct_io=*/false);
}

void read_range(const std::filesystem::path& path, const FileRecord& rec, std::uint64_t offset, std::uint64_t n,
                void* dst) {
  ZERO_CHECK(offset <= rec.bytes && n <= rec.bytes - offset, "checkpoint file ", path.string(), ": a read of ", n,
             " bytes at ", offset, " lies past its ", rec.bytes, " bytes");
  const ShardFd shard(path, rec, /*direct_io=*/false);
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
  ShardFd shard(path, rec, detail::direct_reads());
  // Through the page cache: readahead, and what is consumed dropped from
  // the cache behind (a checkpoint is read once).
  const bool cached = !shard.direct;
  if (cached) (void)::posix_fadvise(shard.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  // Ranges by offset, so that one pass over the file serves them all.
  std::vector<std::size_t> order(ranges.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ranges[a].offset < ranges[b].offset; });
  // Without checksum, only the blocks some range touches are needed.
  const std::uint64_t end = verify ? rec.bytes : [&] {
    std::uint64_t last = 0;
    for (const ReadRange& r : ranges) last = std::max(last, r.offset + r.bytes);
    return last;
  }();
  const std::uint64_t blocks = (end + kIoBlock - 1) / kIoBlock;

  // The I/O thread reads up to kIoRing blocks ahead of this one.
  std::vector<detail::AlignedBlock> ring;
  for (std::size_t i = 0; i < std::min<std::uint64_t>(kIoRing, blocks); ++i) ring.emplace_back(kIoBlock);
  detail::IoThread io[kIoThreads];  // after the ring: joined before it goes
  const auto read_block = [&](std::uint64_t k) {
    const std::uint64_t pos = k * kIoBlock;
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(kIoBlock, end - pos));
    char* data = ring[k % kIoRing].data();
    io[k % kIoThreads].submit([&shard, &path, data, pos, want] {
      // Direct reads ask for whole aligned blocks (the file's end stops them).
      const std::size_t ask = shard.direct ? (want + detail::kDirectAlign - 1) / detail::kDirectAlign *
                                                 detail::kDirectAlign
                                           : want;
      std::size_t got = 0;
      const int e = detail::read_at(shard.fd, shard.direct, data, ask, pos, got);
      ZERO_CHECK(e == 0 && got >= want, "reading checkpoint file ", path.string(), " at byte ", pos + got,
                 " failed: ", e != 0 ? errno_text(e) : std::string("end of file (truncated while reading)"));
    });
  };
  for (std::uint64_t k = 0; k < ring.size(); ++k) read_block(k);

  std::uint32_t crc = 0;
  std::size_t first = 0;  // the first range (in order) not yet past
  // A block in pieces of 1 MiB: each piece's checksum and copies while it
  // is in the cache.
  constexpr std::uint64_t kPiece = std::uint64_t{1} << 20;
  for (std::uint64_t k = 0; k < blocks; ++k) {
    io[k % kIoThreads].wait_completed(k / kIoThreads + 1);
    const char* data = ring[k % kIoRing].data();
    const std::uint64_t block_pos = k * kIoBlock, block_end = std::min<std::uint64_t>(block_pos + kIoBlock, end);
    for (std::uint64_t pos = block_pos; pos < block_end;) {
      const std::uint64_t piece_end = std::min(pos + kPiece, block_end);
      const char* piece = data + (pos - block_pos);
      if (verify) crc = crc32c(crc, piece, static_cast<std::size_t>(piece_end - pos));
      while (first < order.size() && ranges[order[first]].offset + ranges[order[first]].bytes <= pos) ++first;
      for (std::size_t j = first; j < order.size() && ranges[order[j]].offset < piece_end; ++j) {
        const ReadRange& r = ranges[order[j]];
        const std::uint64_t a = std::max(r.offset, pos), b = std::min(r.offset + r.bytes, piece_end);
        if (a >= b) continue;
        if (sink) {
          sink(order[j], a - r.offset, piece + (a - pos), static_cast<std::size_t>(b - a));
        } else {
          std::memcpy(static_cast<char*>(r.dst) + (a - r.offset), piece + (a - pos), static_cast<std::size_t>(b - a));
        }
      }
      pos = piece_end;
    }
    if (cached) (void)::posix_fadvise(shard.fd, static_cast<off_t>(block_pos), static_cast<off_t>(kIoBlock), POSIX_FADV_DONTNEED);
    if (k + kIoRing < blocks) read_block(k + kIoRing);
  }
  if (verify) {
    if (crc != rec.crc32c) {
      char got[9], want[9];  // hex, as zero-ckpt inspect prints them
      std::snprintf(got, sizeof got, "%08x", crc);
      std::snprintf(want, sizeof want, "%08x", rec.crc32c);
      ZERO_CHECK(false, "checkpoint file ", path.string(), " is damaged: its CRC-32C is ", got,
                 " but the manifest says ", want, "; load another tag");
    }
  }
}

}  // namespace zero::ckpt
