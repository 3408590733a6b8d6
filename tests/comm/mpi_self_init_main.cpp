// A program that never calls MPI itself: make_communicator() must initialise
// MPI (with MPI_THREAD_MULTIPLE) under mpirun, and finalise it at exit, or
// mpirun reports that a process exited without MPI_Finalize and fails.
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "zero/comm/communicator.h"

int main() {
  int initialized = 1;
  MPI_Initialized(&initialized);
  if (initialized) {
    std::fprintf(stderr, "MPI initialised before make_communicator\n");
    return 1;
  }
  auto comm = zero::comm::make_communicator();
  MPI_Initialized(&initialized);
  int level = 0;
  MPI_Query_thread(&level);
  if (comm->backend_name() != "mpi" || !initialized || level != MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "backend %s, initialised %d, thread level %d\n",
                 comm->backend_name().c_str(), initialized, level);
    return 1;
  }
  std::vector<float> v(5, static_cast<float>(comm->rank() + 1));
  comm->all_reduce(v.data(), v.size(), zero::DType::kFloat32)->wait();
  const int n = comm->world_size();
  for (float x : v) {
    if (x != static_cast<float>(n * (n + 1) / 2)) {
      std::fprintf(stderr, "all_reduce gave %g\n", x);
      return 1;
    }
  }
  return 0;  // MPI_Finalize runs at exit; `comm` is freed before it
}
