// The process-wide MPI state the MPI backend relies on.
#pragma once

namespace zero::comm::detail {

// Initialises MPI with MPI_THREAD_MULTIPLE if nobody has yet (and registers
// MPI_Finalize at exit, since then it is ours to finalise); otherwise checks
// that the level MPI was initialised with is MPI_THREAD_MULTIPLE. Throws
// zero::Error if MPI is finalised or the thread level is too low.
// Thread-safe.
void ensure_mpi_initialized();

// Open MPI (4.1) raises the error of a failed non-blocking collective's
// request in MPI_Test/MPI_Wait on MPI_COMM_WORLD, whatever communicator the
// collective ran on, so MPI_ERRORS_RETURN on the backend's own communicator
// is not enough: with WORLD's default handler the job aborts with "MPI_ERR_
// OTHER" and no word of which collective, or why. ensure_mpi_initialized()
// puts a filter on MPI_COMM_WORLD that lets an error raised while this
// thread is inside a RequestCompletion return as a code (the backend turns
// it into zero::Error), and hands every other error to WORLD's previous
// handler, so a program's own MPI calls fail as they did before:
// MPI_ERRORS_RETURN returns the code, MPI_ERRORS_ARE_FATAL prints MPI's
// words and aborts (without the failing call's name, which MPI passes to
// handlers only unportably), a handler of the program's own is put back on
// WORLD while it runs (under a lock; a library error raised on another
// thread meanwhile reaches it too). A handler the program sets on WORLD
// after the communicator exists replaces the filter: then the backend's
// failed collectives go to it. Communicators the program makes from WORLD
// afterwards inherit the filter. Needed for Open MPI 4.1 (checked here);
// an MPI that raises such errors on the request's own communicator, as the
// standard asks, never reaches the filter with them.
class RequestCompletion {
 public:
  RequestCompletion();
  ~RequestCompletion();
  RequestCompletion(const RequestCompletion&) = delete;
  RequestCompletion& operator=(const RequestCompletion&) = delete;
};

// True once MPI_Finalize has run: MPI objects must not be freed then.
bool mpi_finalized();

// Threads that call MPI (the health channel's watchdog) must stop before
// MPI_Finalize. A registered stopper is called once, when MPI_Finalize
// starts, whoever calls it (the delete callback of an MPI_COMM_SELF
// attribute, MPI's hook for this); remove it when the thread has stopped by
// itself. Thread-safe.
int add_finalize_stopper(void (*stop)(void*), void* arg);
void remove_finalize_stopper(int id);

}  // namespace zero::comm::detail
