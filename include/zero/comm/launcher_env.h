// What the launcher (mpirun, srun, mpiexec.hydra) tells a process about its
// place, read from the environment before any communicator exists: the way to
// pick a GPU (local rank) before MPI_Init or NCCL's bootstrap.
//
// Variables, first one set wins:
//   local rank   OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), SLURM_LOCALID (srun),
//                MPI_LOCALRANKID (MPICH/Hydra), LOCAL_RANK (torchrun-style)
//   local size   OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_NTASKS_PER_NODE (a plain
//                number only), MPI_LOCALNRANKS, LOCAL_WORLD_SIZE
//
// A variable that is set but not a non-negative integer is an error naming it
// (a silently wrong local rank would put two ranks on one GPU).
// Once a communicator exists, Communicator::local_rank() is authoritative:
// the MPI backend computes it with MPI_Comm_split_type(MPI_COMM_TYPE_SHARED),
// which agrees with these variables under a well-behaved launcher.
#pragma once

#include <optional>

namespace zero::comm {

std::optional<int> launcher_local_rank();
// The rank in the job: OMPI_COMM_WORLD_RANK, PMI_RANK (MPICH/Hydra),
// SLURM_PROCID (not torchrun's RANK: zerocpp is not launched by it, and a
// job scheduler may set RANK for its own ends). For what a tool does before
// MPI starts (a usage error said by rank 0 alone).
std::optional<int> launcher_world_rank();
std::optional<int> launcher_local_size();
// The job's size as the launcher that started this process says it:
// OMPI_COMM_WORLD_SIZE (Open MPI), PMI_SIZE (MPICH/Hydra). Set only in the
// processes a launcher started (not Slurm's SLURM_NTASKS, which a batch
// script's own shell has too). Returns the variable's name with it.
struct LauncherSize {
  int size = 0;
  const char* variable = "";
};
std::optional<LauncherSize> launcher_world_size();

}  // namespace zero::comm
