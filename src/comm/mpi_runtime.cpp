#include "mpi_runtime.h"

#include <mpi.h>

#include <cstdio>
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

void run_stoppers() {
  std::vector<Stopper> stop;
  {
    std::lock_guard<std::mutex> lock(stoppers_mutex());
    stop.swap(stoppers());
  }
  for (const Stopper& s : stop) s.stop(s.arg);
}

// MPI_Finalize frees MPI_COMM_SELF first, and with it its attributes: their
// delete callbacks are MPI's own hook for "finalize is starting", whoever
// calls it (this library at exit, or a program that initialised MPI).
int stop_at_finalize(MPI_Comm, int, void*, void*) {
  run_stoppers();
  return MPI_SUCCESS;
}

void hook_finalize() {
  static std::once_flag once;
  std::call_once(once, [] {
    int keyval = MPI_KEYVAL_INVALID;
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, stop_at_finalize, &keyval, nullptr) == MPI_SUCCESS) {
      MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
    }
  });
}

void finalize_mpi_at_exit() {
  run_stoppers();
  // Communicators still alive at exit are fine: their destructors skip
  // MPI_Comm_free once MPI is finalised.
  if (!mpi_finalized()) MPI_Finalize();
}

thread_local int t_completing = 0;
MPI_Errhandler g_world_previous = MPI_ERRHANDLER_NULL;
MPI_Errhandler g_world_filter = MPI_ERRHANDLER_NULL;

std::recursive_mutex& program_handler_mutex() {
  static std::recursive_mutex m;
  return m;
}

void world_error_filter(MPI_Comm* comm, int* code, ...) {
  if (t_completing > 0) return;  // MPI returns the code to our MPI_Test/MPI_Wait
  // Someone else's error: what WORLD did before.
  if (g_world_previous == MPI_ERRORS_RETURN) return;
  if (g_world_previous == MPI_ERRORS_ARE_FATAL) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(*code, text, &length);
    // Communicators made from WORLD (dup, split) inherit the filter: named.
    char name[MPI_MAX_OBJECT_NAME] = {};
    int name_length = 0;
    MPI_Comm_get_name(*comm, name, &name_length);
    const std::string which = *comm == MPI_COMM_WORLD ? std::string("MPI_COMM_WORLD")
                              : name_length > 0       ? "the communicator '" + std::string(name, name_length) +
                                                      "' (made from MPI_COMM_WORLD)"
                                                      : std::string("a communicator made from MPI_COMM_WORLD");
    std::fprintf(stderr,
                 "An MPI call on %s failed: %.*s. Its error handler is MPI_ERRORS_ARE_FATAL, from MPI_COMM_WORLD "
                 "(zerocpp's filter in front of it passed the error on): aborting the job\n",
                 which.c_str(), length, text);
    std::fflush(stderr);
    MPI_Abort(*comm, *code);
    return;
  }
  // The program's own handler: put back while it runs (one thread at a
  // time; the filter again afterwards, also if the handler throws).
  const std::lock_guard<std::recursive_mutex> lock(program_handler_mutex());
  struct Reinstall {
    MPI_Comm comm;
    ~Reinstall() { MPI_Comm_set_errhandler(comm, g_world_filter); }
  } reinstall{*comm};
  MPI_Comm_set_errhandler(*comm, g_world_previous);
  MPI_Comm_call_errhandler(*comm, *code);
}

void install_world_error_filter() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (MPI_Comm_get_errhandler(MPI_COMM_WORLD, &g_world_previous) != MPI_SUCCESS) return;
    if (MPI_Comm_create_errhandler(world_error_filter, &g_world_filter) != MPI_SUCCESS) return;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, g_world_filter);
  });
}

}  // namespace

RequestCompletion::RequestCompletion() { ++t_completing; }
RequestCompletion::~RequestCompletion() { --t_completing; }

int add_finalize_stopper(void (*stop)(void*), void* arg) {
  hook_finalize();
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
    ZERO_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    std::atexit(finalize_mpi_at_exit);
    ZERO_CHECK(provided >= MPI_THREAD_MULTIPLE, "this MPI library provides only ",
               thread_level_name(provided),
               ", and zerocpp needs MPI_THREAD_MULTIPLE: use an MPI built with thread support "
               "(Open MPI and MPICH are, by default)");
    install_world_error_filter();
    return;
  }
  ZERO_MPI_CHECK(MPI_Query_thread(&provided));
  ZERO_CHECK(provided >= MPI_THREAD_MULTIPLE, "MPI was initialised with ",
             thread_level_name(provided),
             ", and zerocpp needs MPI_THREAD_MULTIPLE: initialise it with "
             "MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), or let zerocpp "
             "initialise it (do not call MPI_Init)");
  install_world_error_filter();
}

}  // namespace zero::comm::detail
