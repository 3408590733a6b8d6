// MPI initialised without MPI_THREAD_MULTIPLE: make_mpi_communicator() must
// refuse with an error that says what to do.
#include <mpi.h>

#include <cstdio>
#include <string>

#include "zero/comm/communicator.h"
#include "zero/core/error.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rc = 0;
  if (provided >= MPI_THREAD_MULTIPLE) {
    std::printf("this MPI gave MPI_THREAD_MULTIPLE when asked for less; nothing to test\n");
  } else {
    try {
      zero::comm::make_mpi_communicator();
      std::fprintf(stderr, "expected an error\n");
      rc = 1;
    } catch (const zero::Error& e) {
      const std::string what = e.what();
      if (what.find("MPI_THREAD_MULTIPLE") == std::string::npos ||
          what.find("MPI_Init_thread") == std::string::npos) {
        std::fprintf(stderr, "unhelpful message: %s\n", what.c_str());
        rc = 1;
      }
    }
  }
  MPI_Finalize();
  return rc;
}
