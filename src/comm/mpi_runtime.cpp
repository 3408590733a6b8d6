#include "mpi_runtime.h"

#include <mpi.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "zero/comm/mpi_check.h"
#include "zero/core/error.h"

namespace zero::comm::detail {
namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "an unknown thread level";
  }
}

struct Stopper {
  int id;
  void (*stop)(void*);
  void* arg;
};
std::mutex& stoppers_mutex() {
  static std::mutex m;
  return m;
}
std::vector<Stopper>& stoppers() {
  static auto* s = new std::vector<Stopper>();  // leaked: used at exit
  return *s;
}

void finalize_mpi_at_exit() {
  std::vector<Stopper> stop;
  {
    std::lock_guard<std::mutex> lock(stoppers_mutex());
    stop.swap(stoppers());
  }
  for (const Stopper& s : stop) s.stop(s.arg);
  // Communicators still alive at exit are fine: their destructors skip
  // MPI_Comm_free once MPI is finalised.
  if (!mpi_finalized()) MPI_Finalize();
}

}  // namespace

int add_finalize_stopper(void (*stop)(void*), void* arg) {
  static int next = 0;
  std::lock_guard<std::mutex> lock(stoppers_mutex());
  stoppers().push_back({++next, stop, arg});
  return next;
}

void remove_finalize_stopper(int id) {
  std::lock_guard<std::mutex> lock(stoppers_mutex());
  auto& s = stoppers();
  for (auto it = s.begin(); it != s.end(); ++it) {
    if (it->id == id) {
      s.erase(it);
      return;
    }
  }
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);  // allowed at any time
  return finalized != 0;
}

void ensure_mpi_initialized() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  ZERO_CHECK(!mpi_finalized(),
             "MPI is already finalised: create MPI communicators before MPI_Finalize");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    // The engine issues collectives from a communication thread while the
    // main thread computes, hence MPI_THREAD_MULTIPLE.
    MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    std::atexit(finalize_mpi_at_exit);
    ZERO_CHECK(provided >= MPI_THREAD_MULTIPLE, "this MPI library provides only ",
               thread_level_name(provided),
               ", and zerocpp needs MPI_THREAD_MULTIPLE: use an MPI built with thread support "
               "(Open MPI and MPICH are, by default)");
    return;
  }
  MPI_CHECK(MPI_Query_thread(&provided));
  ZERO_CHECK(provided >= MPI_THREAD_MULTIPLE, "MPI was initialised with ",
             thread_level_name(provided),
             ", and zerocpp needs MPI_THREAD_MULTIPLE: initialise it with "
             "MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), or let zerocpp "
             "initialise it (do not call MPI_Init)");
}

}  // namespace zero::comm::detail
