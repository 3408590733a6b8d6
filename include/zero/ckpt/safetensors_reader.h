// A safetensors file read back (huggingface/safetensors: an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets}}, then the tensors' bytes), one tensor at a time, so that a
// file larger than memory can be read piece by piece. The header is checked
// whole at open: every entry's dtype known, its shape's bytes equal to its
// offsets' span, every span inside the file; a file that is not one is a
// zero::Error naming the file and what is wrong, never a read past its end.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "zero/ckpt/safetensors.h"

namespace zero::ckpt {

// Bytes per element of a safetensors dtype name (F32 4, BF16 2, BOOL 1,
// ...), 0 for a name it does not have.
std::size_t safetensors_element_size(const std::string& dtype);

class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::filesystem::path& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  // In the order of their data in the file.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The entry called `name`, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
  // Entry `e`'s bytes (e.bytes of them) into `out`.
  void read(const SafetensorsEntry& e, void* out) const;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::vector<SafetensorsEntry> entries_;
  std::vector<std::uint64_t> begin_;  // file offset of each entry's data
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace zero::ckpt
