// LibTorch's intra-op threads for one rank of zero-train, chosen on purpose
// and said: --threads, else OMP_NUM_THREADS, else this rank's share of the
// cores it may run on. LibTorch's own default takes every core of the
// process for every rank on the node, and its OpenMP threads spin while
// they wait: ranks (or other work) sharing the cores then ran 4-6x slower
// (docs/train.md, "Threads").
#pragma once

#include <string>

namespace zero::train {

struct ThreadChoice {
  int threads = 1;
  std::string why;      // "--threads", "OMP_NUM_THREADS", or the share's arithmetic
  std::string warning;  // a bad OMP_NUM_THREADS, ignored (empty: none)
};

// flag: --threads (0: not given); omp: OMP_NUM_THREADS (nullptr: unset);
// cores: the cores this process may run on; local_ranks: the ranks on this node.
ThreadChoice choose_torch_threads(int flag, const char* omp, int cores, int local_ranks);

}  // namespace zero::train
