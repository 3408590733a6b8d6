#include "zero/ckpt/safetensors_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "zero/core/error.h"

namespace zero::ckpt {

namespace {

// The reference implementation's bound on the header (100 MB).
constexpr std::uint64_t kMaxHeader = 100'000'000;

}  // namespace

std::size_t safetensors_element_size(const std::string& dtype) {
  static const std::map<std::string, std::size_t> kSizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U8", 1},  {"U16", 2}, {"U32", 4},  {"U64", 8}, {"BOOL", 1}};
  const auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

SafetensorsReader::SafetensorsReader(const std::filesystem::path& path) : path_(path) {
  const std::string where = path.string();
  fd_ = ::open(where.c_str(), O_RDONLY | O_CLOEXEC);
  const int open_error = errno;
  ZERO_CHECK(fd_ >= 0, "cannot open ", where, ": ", std::strerror(open_error));
  try {
    struct stat st {};
    ZERO_CHECK(::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode), where, " is not a regular file");
    const auto size = static_cast<std::uint64_t>(st.st_size);
    auto bad = [&](const std::string& what) {
      ZERO_CHECK(false, where, " is not a safetensors file (", what, "): give a file that zero-ckpt consolidate "
                 "wrote, or another safetensors file");
    };
    if (size < 8) bad("shorter than its 8-byte header length");
    unsigned char len[8];
    ZERO_CHECK(::pread(fd_, len, 8, 0) == 8, "cannot read ", where, ": ", std::strerror(errno));
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    if (n > kMaxHeader || n > size - 8) {
      bad("its header length " + std::to_string(n) + " is past the file's " + std::to_string(size) + " bytes");
    }
    std::string text(static_cast<std::size_t>(n), '\0');
    ZERO_CHECK(::pread(fd_, text.data(), text.size(), 8) == static_cast<ssize_t>(n), "cannot read ", where, ": ",
               std::strerror(errno));
    const nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!header.is_object()) bad("its header is not a JSON object");
    const std::uint64_t data_start = 8 + n, data_bytes = size - data_start;
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) bad("__metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string()) bad("__metadata__." + m.key() + " is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      const std::string shown = "'" + name.substr(0, 80) + "'";
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
        bad("entry " + shown + " lacks dtype, shape or data_offsets");
      }
      SafetensorsEntry e;
      e.name = name;
      if (!v["dtype"].is_string()) bad("entry " + shown + "'s dtype is not a string");
      e.dtype = v["dtype"].get<std::string>();
      const std::size_t element = safetensors_element_size(e.dtype);
      if (element == 0) bad("entry " + shown + " has dtype '" + e.dtype.substr(0, 16) + "', which zerocpp does not know");
      if (!v["shape"].is_array()) bad("entry " + shown + "'s shape is not a list");
      std::uint64_t count = 1;
      for (const nlohmann::json& d : v["shape"]) {
        if (!d.is_number_unsigned()) bad("entry " + shown + "'s shape holds " + (d.is_number() ? d.dump() : std::string(d.is_array() || d.is_object() ? "an " : "a ") + d.type_name()));
        const auto dim = d.get<std::uint64_t>();
        if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
          bad("entry " + shown + "'s shape is too large");
        }
        if (dim != 0 && count > std::numeric_limits<std::uint64_t>::max() / element / dim) {
          bad("entry " + shown + "'s shape is too large");
        }
        count *= dim;
        e.shape.push_back(static_cast<std::int64_t>(dim));
      }
      const nlohmann::json& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
        bad("entry " + shown + "'s data_offsets are not two offsets");
      }
      const auto b = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
      if (b > end || end > data_bytes) {
        bad("entry " + shown + "'s data [" + std::to_string(b) + ", " + std::to_string(end) + ") is past the " +
            std::to_string(data_bytes) + " bytes of data");
      }
      if (end - b != count * element) {
        bad("entry " + shown + " holds " + std::to_string(end - b) + " bytes, its shape and dtype " +
            std::to_string(count * element));
      }
      e.bytes = end - b;
      index_[name] = entries_.size();
      entries_.push_back(std::move(e));
      begin_.push_back(data_start + b);
    }
    // In the order of their data (the header's JSON order is not kept).
    std::vector<std::size_t> order(entries_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return begin_[a] < begin_[b]; });
    std::vector<SafetensorsEntry> sorted;
    std::vector<std::uint64_t> begins;
    for (const std::size_t i : order) {
      index_[entries_[i].name] = sorted.size();
      sorted.push_back(std::move(entries_[i]));
      begins.push_back(begin_[i]);
    }
    entries_ = std::move(sorted);
    begin_ = std::move(begins);
    // As the reference implementation requires: the entries tile the data,
    // front to back, no gap, no overlap, to the file's end.
    std::uint64_t at = data_start;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (begin_[i] != at) {
        bad("entry '" + entries_[i].name.substr(0, 80) + "' starts at data byte " + std::to_string(begin_[i] - data_start) +
            ", not where the one before it ends (" + std::to_string(at - data_start) + "): its data overlaps another's "
            "or leaves a gap");
      }
      at += entries_[i].bytes;
    }
    if (at != size) {
      bad("its tensors end at byte " + std::to_string(at) + " of " + std::to_string(size) + ": the file holds "
          "bytes no tensor owns");
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

void SafetensorsReader::read(const SafetensorsEntry& e, void* out) const {
  const auto it = index_.find(e.name);
  ZERO_CHECK(it != index_.end(), "no tensor '", e.name, "' in ", path_.string());
  auto* p = static_cast<char*>(out);
  std::uint64_t at = begin_[it->second], left = entries_[it->second].bytes;
  while (left > 0) {
    const ssize_t got = ::pread(fd_, p, static_cast<std::size_t>(std::min<std::uint64_t>(left, 1u << 30)),
                                static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    ZERO_CHECK(got > 0, "cannot read '", e.name, "' from ", path_.string(), ": ",
               got == 0 ? std::string("the file ended early (it was truncated after it was opened?)")
                        : std::string(std::strerror(errno)));
    p += got;
    at += static_cast<std::uint64_t>(got);
    left -= static_cast<std::uint64_t>(got);
  }
}

}  // namespace zero::ckpt
