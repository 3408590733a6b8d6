// fail_job: how a program on several ranks ends on an error, so that the
// user sees it once, marked with the rank that raised it, and the job ends
// instead of hanging.
//
//   int main() {
//     std::unique_ptr<zero::comm::Communicator> comm;
//     try {
//       comm = zero::comm::make_communicator();
//       ...
//     } catch (const std::exception& e) {
//       zero::comm::fail_job(comm.get(), e, "my-trainer");
//     }
//   }
//
// What it does, on the rank that caught `error`:
//  - An error caused by another rank's failure (RemoteFailure, or one marked
//    RaisedForAnotherRank: a rank agreement's) is not printed again: that
//    rank prints its own. (A marked one waits up to 10 s for that rank's
//    announcement, and prints after all when none comes.)
//  - Otherwise the error is announced to every other rank through the health
//    channel (their waits end at once with RemoteFailure), and the ranks that
//    raised the same error (same CommError::key(), or the same message)
//    leave it to one of them to print (the lowest of those that fail
//    together; one that fails after another printed stays silent): "<program>: error on rank R of
//    N: <message>" and which other ranks raised it too.
//  - The process then ends with exit code 1. With more than one rank it does
//    not call MPI_Finalize (the others may never get there): the launcher
//    sees a rank exit non-zero and ends the job.
// Without a communicator (the error came before one existed) or on one rank
// it prints and exits.
#pragma once

#include <exception>
#include <string_view>

#include "zero/comm/communicator.h"

namespace zero::comm {

[[noreturn]] void fail_job(Communicator* comm, const std::exception& error, std::string_view program);

}  // namespace zero::comm
