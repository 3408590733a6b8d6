// The safetensors format (huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}}, then
// the tensors' bytes. Written in two steps so that a file larger than memory
// can be filled piece by piece: the header from the tensors' names, dtypes
// and shapes, then each tensor's bytes at its offset, in any order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace zero::ckpt {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // safetensors' names: F32, BF16, F16, I64, ...
  std::vector<std::int64_t> shape;
  std::uint64_t bytes = 0;
};

class SafetensorsWriter {
 public:
  // Creates `path` (written to path.tmp, renamed by finish()) with its
  // header; entries' data laid out in the given order. Until commit(),
  // every error and the destructor remove path.tmp: a failed write leaves
  // nothing behind, and whatever was at `path` stays as it was.
  SafetensorsWriter(const std::filesystem::path& path, const std::vector<SafetensorsEntry>& entries,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Bytes [offset, offset + n) of entry i.
  void write(std::size_t entry, std::uint64_t offset, const void* data, std::size_t n);
  // fsync and rename into place: sync() then commit(). The two apart let a
  // caller write several files and rename them only once all are on disk.
  void finish();
  void sync();    // fsync and close path.tmp
  void commit();  // rename path.tmp to path

 private:
  void write_at(std::uint64_t at, const void* data, std::size_t n);
  void discard();  // close and remove path.tmp unless committed

  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  std::vector<std::uint64_t> begin_, bytes_;
  std::uint64_t data_start_ = 0;
};

}  // namespace zero::ckpt
