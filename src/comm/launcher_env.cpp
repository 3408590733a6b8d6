#include "zero/comm/launcher_env.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <initializer_list>

#include "zero/core/error.h"

namespace zero::comm {
namespace {

std::optional<int> first_set(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    errno = 0;
    char* end = nullptr;
    const long v = std::strtol(value, &end, 10);
    ZERO_CHECK(errno == 0 && end != value && *end == '\0' && v >= 0 && v <= INT_MAX,
               "the launcher variable ", name, "='", value,
               "' is not a non-negative integer; unset it or launch with mpirun/srun, which set "
               "it correctly");
    return static_cast<int>(v);
  }
  return std::nullopt;
}

}  // namespace

std::optional<LauncherSize> launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const std::optional<int> v = first_set({name})) return LauncherSize{*v, name};
  }
  return std::nullopt;
}

std::optional<int> launcher_local_rank() {
  return first_set({"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"});
}

std::optional<int> launcher_world_rank() {
  return first_set({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"});
}

std::optional<int> launcher_local_size() {
  return first_set(
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"});
}

}  // namespace zero::comm
