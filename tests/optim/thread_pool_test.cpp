#include "zero/optim/thread_pool.h"

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "zero/core/error.h"

namespace zero::optim {
namespace {

// Every element of [0, n) is visited exactly once, by tiles of the promised shape.
void expect_covers_once(ThreadPool& pool, std::size_t n, std::size_t tile) {
  std::vector<std::atomic<int>> hits(n);
  std::atomic<std::size_t> calls{0};
  pool.parallel_for(n, tile, [&](std::size_t begin, std::size_t end) {
    EXPECT_EQ(begin % tile, 0u);
    EXPECT_LT(begin, end);
    EXPECT_TRUE(end - begin == tile || end == n) << begin << ".." << end;
    for (std::size_t i = begin; i < end; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
    calls.fetch_add(1, std::memory_order_relaxed);
  });
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "element " << i;
  EXPECT_EQ(calls.load(), (n + tile - 1) / tile);
}

TEST(ThreadPool, CoversEveryTileOnceForManyShapes) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (std::size_t n : {0, 1, 7, 64, 1000, 4097}) {
      for (std::size_t tile : {1, 3, 64, 5000}) expect_covers_once(pool, n, tile);
    }
  }
}

TEST(ThreadPool, ZeroMeansHardwareConcurrency) {
  ThreadPool pool;
  EXPECT_EQ(pool.num_threads(),
            static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_THROW(ThreadPool(-1), zero::Error);
}

TEST(ThreadPool, UsesMoreThanOneThreadWhenAsked) {
  ThreadPool pool(3);
  std::mutex mutex;
  std::vector<std::thread::id> ids;
  // Tiles slow enough that the workers get some of them.
  pool.parallel_for(64, 1, [&](std::size_t, std::size_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lock(mutex);
    ids.push_back(std::this_thread::get_id());
  });
  std::sort(ids.begin(), ids.end());
  EXPECT_GT(std::unique(ids.begin(), ids.end()) - ids.begin(), 1);
}

TEST(ThreadPool, RethrowsTheFirstExceptionAndStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(100, 1,
                                 [&](std::size_t begin, std::size_t) {
                                   if (begin == 17) throw std::runtime_error("tile 17");
                                 }),
               std::runtime_error);
  // Every tile throws: still one exception, and the pool still works after.
  EXPECT_THROW(pool.parallel_for(100, 1, [](std::size_t, std::size_t) { throw 42; }), int);
  expect_covers_once(pool, 1000, 10);
}

TEST(ThreadPool, NestedCallRunsInline) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.parallel_for(4, 1, [&](std::size_t, std::size_t) {
    pool.parallel_for(3, 1, [&](std::size_t, std::size_t) { inner.fetch_add(1); });
  });
  EXPECT_EQ(inner.load(), 12);
}

TEST(ThreadPool, CallersFromSeveralThreadsAreSerialised) {
  ThreadPool pool(3);
  std::vector<long> sums(4, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<long> part(10, 0);
        pool.parallel_for(1000, 100, [&](std::size_t begin, std::size_t end) {
          for (std::size_t i = begin; i < end; ++i) part[begin / 100] += static_cast<long>(i);
        });
        for (long v : part) sums[c] += v;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (long s : sums) EXPECT_EQ(s, 20L * 999 * 1000 / 2);
}

TEST(ThreadPool, ManyShortJobsBackToBack) {
  ThreadPool pool(3);
  std::atomic<long> total{0};
  for (int rep = 0; rep < 2000; ++rep) {
    pool.parallel_for(8, 1, [&](std::size_t begin, std::size_t) { total.fetch_add(begin); });
  }
  EXPECT_EQ(total.load(), 2000L * 28);
}

}  // namespace
}  // namespace zero::optim
