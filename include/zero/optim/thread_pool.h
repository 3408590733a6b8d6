// A persistent pool of worker threads for the CPU optimizer kernels.
//
// The optimizer step is one pass over memory; starting threads per step would
// cost more than a small step itself, so the threads live as long as the pool.
// parallel_for() hands out tiles from a shared counter, so a thread that is
// slowed down (by another process on the same core) takes fewer tiles instead
// of holding up the step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace zero::optim {

// The tile the optimizer kernels hand to parallel_for: 16 Ki elements, 64 KiB
// of fp32 params, so one tile's input streams (256 KiB for Adam) fit in L2 and
// a thread's prefetchers run long before the next tile; a multiple of every
// vector width (up to 2048-bit), so only the last tile of a span has a tail.
inline constexpr std::size_t kTileElements = 16 * 1024;

class ThreadPool {
 public:
  // num_threads counts the calling thread, which takes part in every
  // parallel_for: a pool of T threads starts T - 1 workers. 0 means
  // usable_cores() (zero/core/cpu_cores.h: the process's affinity mask).
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over [0, n) in tiles of `tile` elements (the last
  // tile shorter), spread over the threads; returns when every tile is done.
  // If fn throws, no new tiles are started and the first exception is
  // rethrown here once the tiles already running have finished.
  //
  // One caller at a time: calls from several threads are serialised. A call
  // from inside fn (on any thread of this pool) runs its tiles inline on that
  // thread instead of deadlocking.
  void parallel_for(std::size_t n, std::size_t tile,
                    const std::function<void(std::size_t, std::size_t)>& fn);

 private:
  void worker_loop(int index);
  void run_tiles();  // claims tiles of the current job until none are left

  int num_threads_ = 1;
  std::vector<std::thread> workers_;

  std::mutex call_mutex_;  // serialises parallel_for callers

  std::mutex mutex_;               // guards everything below but next_tile_
  std::condition_variable wake_;   // workers: a new job (or stop)
  std::condition_variable done_;   // caller: the last busy worker finished
  std::uint64_t generation_ = 0;   // bumped once per job
  bool stop_ = false;
  int active_workers_ = 0;         // workers 0..active_workers_-1 take part in this job
  int busy_workers_ = 0;           // of those, the ones not finished yet
  std::exception_ptr error_;       // the first exception thrown by fn

  // The current job; written by the caller under mutex_ before the workers
  // are woken, read by them after they have taken mutex_.
  const std::function<void(std::size_t, std::size_t)>* fn_ = nullptr;
  std::size_t n_ = 0;
  std::size_t tile_ = 0;
  std::size_t num_tiles_ = 0;
  std::atomic<std::size_t> next_tile_{0};
};

}  // namespace zero::optim
