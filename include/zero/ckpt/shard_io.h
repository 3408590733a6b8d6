// One checkpoint file: written front to back in sections, with its CRC-32C
// computed on the way and fsync'd at the end; read back front to back, its
// size and checksum checked, the byte ranges a reader wants copied out on
// the way (so a file is read once, whatever part of it is needed).
//
// Writes go through O_DIRECT where the filesystem takes it, reads through
// the page cache with readahead (ZERO_CKPT_IO=direct|buffered changes both:
// src/ckpt/block_io.h says what was measured), in blocks of kIoBlock on
// kIoThreads I/O threads of their own, so that that many requests are in
// flight; a ring of kIoRing blocks lets the copy and the checksum of one
// block overlap the disk's work on the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zero/ckpt/manifest.h"

namespace zero::ckpt {

class ShardWriter {
 public:
  // Creates (truncates) `path`. Errors name the path and the fix.
  explicit ShardWriter(std::filesystem::path path);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  void begin_section(const std::string& name, const std::string& dtype, std::vector<std::int64_t> shape = {});
  void write(const void* data, std::size_t n);
  void end_section();
  // fsync and close; the file's record (name, bytes, checksum, sections).
  FileRecord finish(int rank);

 private:
  struct Blocks;  // the file, the ring of blocks and the I/O thread
  void submit_block();
  void flush_to_disk();

  std::filesystem::path path_;
  std::unique_ptr<Blocks> blocks_;
  std::uint64_t bytes_ = 0;
  std::uint32_t crc_ = 0;
  std::vector<SectionRecord> sections_;
  bool in_section_ = false;
  // Fault injection (shard_io.cpp, ZERO_CKPT_TEST_KILL).
  std::uint64_t kill_after_ = ~std::uint64_t{0};
  bool kill_at_end_ = false;
};

// A range of a file to copy out: `bytes` bytes at `offset`, to `dst`.
struct ReadRange {
  std::uint64_t offset = 0, bytes = 0;
  void* dst = nullptr;
};

// Reads `path` whole, front to back: its size must be rec.bytes and its
// CRC-32C rec.crc32c (verify=false skips the checksum), and each range's
// bytes are copied to its dst (ranges in any order; each must lie inside
// the file). `sink`, when given, gets the ranges' bytes instead, in pieces:
// sink(range index, offset within the range, data, n). Throws zero::Error
// naming the file: missing, unreadable, truncated, damaged.
using RangeSink = std::function<void(std::size_t, std::uint64_t, const void*, std::size_t)>;
void read_file(const std::filesystem::path& path, const FileRecord& rec, const std::vector<ReadRange>& ranges,
               bool verify = true, const RangeSink& sink = {});

// That `path` opens and has rec.bytes bytes (what read_file checks before
// it reads): a loader checks every file before it reads any.
void check_file(const std::filesystem::path& path, const FileRecord& rec);

// Bytes [offset, offset + n) of `path` to dst, without the checksum (the
// file's size is checked): random access for the offline tools, which
// verify the checksums in a pass of their own.
void read_range(const std::filesystem::path& path, const FileRecord& rec, std::uint64_t offset, std::uint64_t n,
                void* dst);

// Bytes per read and write call, the blocks per file, and the threads that
// read or write them (block k on thread k % kIoThreads).
inline constexpr std::size_t kIoBlock = std::size_t{8} << 20;
inline constexpr std::size_t kIoRing = 4;
inline constexpr std::size_t kIoThreads = 2;

}  // namespace zero::ckpt
