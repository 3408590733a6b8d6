#include "zero/ckpt/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "zero/core/error.h"

namespace zero::ckpt {

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path, const std::vector<SafetensorsEntry>& entries,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tmp_(path.string() + ".tmp") {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (const SafetensorsEntry& e : entries) {
    h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {at, at + e.bytes}}};
    begin_.push_back(at);
    bytes_.push_back(e.bytes);
    at += e.bytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data 8-byte aligned, as the reference writer does
  data_start_ = 8 + header.size();
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int e = errno;
  ZERO_CHECK(fd_ >= 0, "cannot create ", tmp_.string(), ": ", std::strerror(e), "; choose another --out");
  // A constructor that throws runs no destructor: the temporary goes here.
  try {
    unsigned char len[8];
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    std::string front(reinterpret_cast<const char*>(len), 8);
    front += header;
    write_at(0, front.data(), front.size());
    // The full size now, so that a full disk shows at once.
    const int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(data_start_ + at));
    ZERO_CHECK(rc == 0 || rc == EOPNOTSUPP || rc == EINVAL, "cannot reserve ", data_start_ + at, " bytes for ",
               tmp_.string(), ": ", std::strerror(rc), "; free space or choose another --out");
  } catch (...) {
    discard();
    throw;
  }
}

SafetensorsWriter::~SafetensorsWriter() { discard(); }

void SafetensorsWriter::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!committed_) ::unlink(tmp_.c_str());
}

void SafetensorsWriter::write_at(std::uint64_t at, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    // (A write past RLIMIT_FSIZE with SIGXFSZ ignored fails with EFBIG.)
    ZERO_CHECK(w > 0, "writing ", tmp_.string(), " failed: ", std::strerror(w < 0 ? errno : ENOSPC),
               "; free space or choose another --out");
    p += w;
    at += static_cast<std::uint64_t>(w);
    n -= static_cast<std::size_t>(w);
  }
}

void SafetensorsWriter::write(std::size_t entry, std::uint64_t offset, const void* data, std::size_t n) {
  ZERO_INTERNAL_ASSERT(entry < begin_.size() && offset + n <= bytes_[entry], "safetensors write out of bounds");
  ZERO_INTERNAL_ASSERT(fd_ >= 0, "safetensors write after sync()");
  write_at(data_start_ + begin_[entry] + offset, data, n);
}

void SafetensorsWriter::sync() {
  ZERO_INTERNAL_ASSERT(fd_ >= 0, "safetensors sync() twice");
  const int rc = ::fsync(fd_);
  const int e = errno;
  ZERO_CHECK(rc == 0, "fsync of ", tmp_.string(), " failed: ", std::strerror(e),
             "; free space or choose another --out");
  const int closed = ::close(fd_);
  fd_ = -1;  // (closed either way: discard() must not close it again)
  ZERO_CHECK(closed == 0, "closing ", tmp_.string(), " failed: ", std::strerror(errno));
}

void SafetensorsWriter::commit() {
  ZERO_INTERNAL_ASSERT(fd_ < 0 && !committed_, "safetensors commit() before sync(), or twice");
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  ZERO_CHECK(!ec, "cannot rename ", tmp_.string(), " to ", path_.string(), ": ", ec.message());
  committed_ = true;
}

void SafetensorsWriter::finish() {
  sync();
  commit();
}

}  // namespace zero::ckpt
