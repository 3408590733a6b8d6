#include "zero/comm/mpi_check.h"

#include "zero/core/error.h"

namespace zero::comm {
namespace {

const char* error_class_name(int error_class) {
  switch (error_class) {
    case MPI_ERR_BUFFER:
      return "MPI_ERR_BUFFER";
    case MPI_ERR_COUNT:
      return "MPI_ERR_COUNT";
    case MPI_ERR_TYPE:
      return "MPI_ERR_TYPE";
    case MPI_ERR_TAG:
      return "MPI_ERR_TAG";
    case MPI_ERR_COMM:
      return "MPI_ERR_COMM";
    case MPI_ERR_RANK:
      return "MPI_ERR_RANK";
    case MPI_ERR_REQUEST:
      return "MPI_ERR_REQUEST";
    case MPI_ERR_ROOT:
      return "MPI_ERR_ROOT";
    case MPI_ERR_OP:
      return "MPI_ERR_OP";
    case MPI_ERR_ARG:
      return "MPI_ERR_ARG";
    case MPI_ERR_TRUNCATE:
      return "MPI_ERR_TRUNCATE";
    case MPI_ERR_OTHER:
      return "MPI_ERR_OTHER";
    case MPI_ERR_INTERN:
      return "MPI_ERR_INTERN";
    case MPI_ERR_IN_STATUS:
      return "MPI_ERR_IN_STATUS";
    case MPI_ERR_PENDING:
      return "MPI_ERR_PENDING";
    case MPI_ERR_NO_MEM:
      return "MPI_ERR_NO_MEM";
    default:
      return nullptr;
  }
}

}  // namespace

std::string mpi_error_string(int error_code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  std::string out;
  int error_class = error_code;
  if (MPI_Error_class(error_code, &error_class) == MPI_SUCCESS) {
    if (const char* name = error_class_name(error_class)) out = std::string(name) + ": ";
  }
  if (MPI_Error_string(error_code, text, &length) == MPI_SUCCESS) {
    std::string said(text, static_cast<std::size_t>(length));
    // Open MPI's text often starts with the class name already.
    if (!out.empty() && said.rfind(out, 0) == 0) said.erase(0, out.size());
    out += said;
  } else {
    out += "MPI error code " + std::to_string(error_code);
  }
  return out;
}

namespace detail {

void throw_mpi_error(int error_code, const char* call, const char* file, int line) {
  throw Error(std::string("MPI call failed: ") + call + " at " + file + ":" + std::to_string(line) +
              ": " + mpi_error_string(error_code));
}

}  // namespace detail
}  // namespace zero::comm
