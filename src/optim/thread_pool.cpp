#include "zero/optim/thread_pool.h"

#include <algorithm>

#include "zero/core/cpu_cores.h"
#include "zero/core/error.h"

namespace zero::optim {
namespace {

// The pool whose tile the current thread is running, if any: a nested
// parallel_for on the same pool runs inline instead of waiting on itself.
thread_local const ThreadPool* t_running_pool = nullptr;

struct RunningPoolScope {
  explicit RunningPoolScope(const ThreadPool* pool) : saved_(t_running_pool) {
    t_running_pool = pool;
  }
  ~RunningPoolScope() { t_running_pool = saved_; }
  const ThreadPool* saved_;
};

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  ZERO_CHECK(num_threads >= 0, "ThreadPool: num_threads must be >= 0 (0 = all cores), got ",
             num_threads);
  if (num_threads == 0) {
    num_threads = usable_cores();
  }
  num_threads_ = num_threads;
  workers_.reserve(static_cast<std::size_t>(num_threads_ - 1));
  for (int i = 0; i + 1 < num_threads_; ++i) {
    workers_.emplace_back([this, i] { worker_loop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run_tiles() {
  RunningPoolScope scope(this);
  for (;;) {
    // relaxed: the job itself was published under mutex_; the counter only
    // has to hand each tile to exactly one thread.
    const std::size_t t = next_tile_.fetch_add(1, std::memory_order_relaxed);
    if (t >= num_tiles_) return;
    const std::size_t begin = t * tile_;
    const std::size_t end = std::min(n_, begin + tile_);
    try {
      (*fn_)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      next_tile_.store(num_tiles_, std::memory_order_relaxed);  // start no more tiles
    }
  }
}

void ThreadPool::worker_loop(int index) {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= active_workers_) continue;  // this job is too small to need us
    }
    run_tiles();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--busy_workers_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(std::size_t n, std::size_t tile,
                              const std::function<void(std::size_t, std::size_t)>& fn) {
  ZERO_CHECK(tile > 0, "ThreadPool::parallel_for: tile must be > 0");
  if (n == 0) return;
  const std::size_t num_tiles = (n + tile - 1) / tile;
  if (num_threads_ == 1 || num_tiles == 1 || t_running_pool == this) {
    for (std::size_t begin = 0; begin < n; begin += tile) fn(begin, std::min(n, begin + tile));
    return;
  }

  std::lock_guard<std::mutex> call_lock(call_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    n_ = n;
    tile_ = tile;
    num_tiles_ = num_tiles;
    next_tile_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    active_workers_ = static_cast<int>(
        std::min<std::size_t>(workers_.size(), num_tiles - 1));
    busy_workers_ = active_workers_;
    ++generation_;
  }
  wake_.notify_all();
  run_tiles();  // the caller's thread takes tiles too
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return busy_workers_ == 0; });
    fn_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace zero::optim
