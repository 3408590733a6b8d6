// ZERO_MPI_CHECK(call): runs an MPI call that returns an error code and, if it is
// not MPI_SUCCESS, throws zero::Error with MPI's error string, the call's text
// and file:line. Only useful on communicators whose error handler is
// MPI_ERRORS_RETURN (the MPI backend sets it on its own communicator); with
// MPI's default, MPI_ERRORS_ARE_FATAL, MPI aborts before returning.
#pragma once

#include <mpi.h>

#include <string>

namespace zero::comm {

// "MPI_ERR_COUNT: invalid count argument" (class name when known, then MPI's
// own text).
std::string mpi_error_string(int error_code);

namespace detail {
[[noreturn]] void throw_mpi_error(int error_code, const char* call, const char* file, int line);
}  // namespace detail

}  // namespace zero::comm

#define ZERO_MPI_CHECK(call)                                                                  \
  do {                                                                                        \
    const int zero_mpi_check_rc_ = (call);                                                    \
    if (__builtin_expect(zero_mpi_check_rc_ != MPI_SUCCESS, 0)) {                             \
      ::zero::comm::detail::throw_mpi_error(zero_mpi_check_rc_, #call, __FILE__, __LINE__);   \
    }                                                                                         \
  } while (0)
