// Runs a kernel over [0, n) on a pool, or inline when there is none or the
// span is a single tile (waking threads for one tile costs more than it saves).
#pragma once

#include <cstddef>
#include <functional>

#include "zero/optim/thread_pool.h"

namespace zero::optim::detail {

template <typename Fn>
void run_tiled(ThreadPool* pool, std::size_t n, std::size_t tile, Fn&& fn) {
  if (pool == nullptr || pool->num_threads() <= 1 || n <= tile) {
    fn(std::size_t{0}, n);
    return;
  }
  pool->parallel_for(n, tile, std::function<void(std::size_t, std::size_t)>(fn));
}

}  // namespace zero::optim::detail
