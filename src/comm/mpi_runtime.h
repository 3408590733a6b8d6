// The process-wide MPI state the MPI backend relies on.
#pragma once

namespace zero::comm::detail {

// Initialises MPI with MPI_THREAD_MULTIPLE if nobody has yet (and registers
// MPI_Finalize at exit, since then it is ours to finalise); otherwise checks
// that the level MPI was initialised with is MPI_THREAD_MULTIPLE. Throws
// zero::Error if MPI is finalised or the thread level is too low.
// Thread-safe.
void ensure_mpi_initialized();

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
