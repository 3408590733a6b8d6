#include "torch_threads.h"

#include <algorithm>
#include <charconv>
#include <cstring>

namespace zero::train {

ThreadChoice choose_torch_threads(int flag, const char* omp, int cores, int local_ranks) {
  ThreadChoice c;
  if (flag > 0) {
    c.threads = flag;
    c.why = "--threads";
    return c;
  }
  if (omp != nullptr) {
    int n = 0;
    const char* end = omp + std::strlen(omp);
    const auto [p, ec] = std::from_chars(omp, end, n);
    if (ec == std::errc() && p == end && n >= 1) {
      c.threads = n;
      c.why = "OMP_NUM_THREADS";
      return c;
    }
    c.warning = std::string("OMP_NUM_THREADS='") + omp +
                "' is not a number of threads (a whole number of at least 1): ignored";
  }
  local_ranks = std::max(1, local_ranks);
  cores = std::max(1, cores);
  c.threads = std::max(1, cores / local_ranks);
  c.why = std::to_string(cores) + " core" + (cores == 1 ? "" : "s") + " this process may run on / " +
          std::to_string(local_ranks) + " rank" + (local_ranks == 1 ? "" : "s") + " on this node";
  return c;
}

}  // namespace zero::train
