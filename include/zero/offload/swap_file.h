// The NVMe tier's file: a fixed-size file that state is swapped out to and
// read back from, block by block, on I/O threads of its own (ZeRO-Infinity's
// swapper). Each read or write is a ticket to wait for, so that the caller
// reads the next piece ahead and writes the last one behind while it
// computes on the current one.
//
// The file is opened with O_DIRECT where the filesystem allows it (an NVMe
// drive's ext4 or xfs: the page cache holds none of it) and with buffered
// I/O where it does not (some tmpfs and overlay mounts; direct() says
// which). Its size is allocated on disk when it is made (posix_fallocate),
// so that a full disk is an error at construction, never half-way through a
// step. It is created new (O_EXCL, never through a link) and unlinked at
// once: the space goes back to the drive when the process ends, however it
// ends. `<path>.lock` (empty, flock'ed while the SwapFile lives, removed
// after) refuses a second job given the same folder.
//
// Offsets, sizes and buffer addresses must be multiples of kAlign (what
// O_DIRECT asks of them on every Linux filesystem).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace zero::offload {

class SwapFile {
 public:
  static constexpr std::size_t kAlign = 4096;
  static std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

  struct Options {
    int io_threads = 1;                   // aio.thread_count
    std::size_t block_bytes = 1u << 20;   // aio.block_size: one pread/pwrite at most this long
    std::string setting = "offload_optimizer.nvme_path";  // the config key that names the folder (in errors)
    std::string contents = "the optimizer state";          // what the file holds (in errors)
  };
  // Makes `path` (its folder must exist and be writable) of `bytes` bytes.
  // Throws zero::Error naming the path and the fix when it cannot.
  SwapFile(std::filesystem::path path, std::size_t bytes, Options options);
  SwapFile(std::filesystem::path path, std::size_t bytes) : SwapFile(std::move(path), bytes, Options{}) {}
  // Waits for the requests under way, closes and removes the file.
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  using Ticket = std::uint64_t;
  Ticket read(std::size_t offset, void* dst, std::size_t bytes);
  Ticket write(std::size_t offset, const void* src, std::size_t bytes);
  // Blocks until the request is done; rethrows its error (once). A ticket
  // is waited for at most once.
  void wait(Ticket ticket);
  // Waits for every request; rethrows the first error among them.
  void wait_all();
  // Whether the request is done (its wait() would not block).
  bool done(Ticket ticket);

  bool direct() const { return direct_; }
  std::size_t size() const { return bytes_; }
  const std::filesystem::path& path() const { return path_; }  // (unlinked: the name it had)
  const std::string& lock_path() const { return lock_path_; }

 private:
  struct Block {
    Ticket ticket;
    bool write;
    std::size_t offset;
    char* data;
    std::size_t bytes;
  };
  struct Pending {
    std::size_t blocks_left = 0;
    std::exception_ptr error;
  };
  Ticket submit(bool write, std::size_t offset, char* data, std::size_t bytes);
  void run();
  void transfer(const Block& b) const;

  std::filesystem::path path_;
  std::size_t bytes_;
  Options o_;
  int fd_ = -1, lock_fd_ = -1;
  std::string lock_path_;
  bool direct_ = false;

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Block> queue_;
  std::unordered_map<Ticket, Pending> pending_;
  Ticket next_ = 1;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace zero::offload
