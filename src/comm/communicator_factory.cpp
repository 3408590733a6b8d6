// Backend selection: above the interface (communicator.cpp), since asking
// whether MPI is initialised needs MPI. Part of zero_comm_mpi, so that the
// interface and the single-process backend (zero_comm) link no MPI.
#include <mpi.h>

#include <cstdlib>
#include <string_view>

#include "zero/comm/communicator.h"
#include "zero/comm/launcher_env.h"
#include "zero/core/error.h"

namespace zero::comm {

std::string default_backend_name() {
  if (const char* forced = std::getenv("ZERO_COMM_BACKEND"); forced != nullptr && *forced != '\0') {
    const std::string_view v(forced);
    ZERO_CHECK(v == "mpi" || v == "single", "ZERO_COMM_BACKEND='", v,
               "' is not a backend: use 'mpi' or 'single' (or unset it to detect the launcher)");
    // Left in the environment of a launched job, "single" would make each
    // of its processes a job of its own: N trainings writing the same files.
    if (v == "single") {
      if (const auto launched = launcher_world_size(); launched && launched->size > 1) {
        ZERO_CHECK(false, "ZERO_COMM_BACKEND=single, but the launcher started this process as one of ",
                   launched->size, " (", launched->variable, "=", launched->size, "): each would run alone, as ",
                   launched->size, " separate jobs writing the same files. Unset ZERO_COMM_BACKEND (the ",
                   launched->size, " processes then work together), or start one process without mpirun");
      }
    }
    return std::string(v);
  }
  // Each launcher leaves its mark: Open MPI's mpirun, MPICH/Hydra's PMI,
  // PMIx launchers, and Slurm's srun (SLURM_PROCID is per task).
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"}) {
    if (std::getenv(var) != nullptr) return "mpi";
  }
  int initialized = 0;
  MPI_Initialized(&initialized);  // allowed before MPI_Init
  return initialized ? "mpi" : "single";
}

std::unique_ptr<Communicator> make_communicator() {
  return default_backend_name() == "mpi" ? make_mpi_communicator()
                                         : make_single_process_communicator();
}

}  // namespace zero::comm
