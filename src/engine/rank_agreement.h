// Every rank's word on a failure, so that all ranks leave a collective
// phase together: each rank's error text is gathered, and every rank throws
// when any failed (its own message where it failed, the first failing
// rank's elsewhere). The engine uses it wherever one rank alone can fail
// (a file, a disk) before a collective that the others would wait in.
#pragma once

#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "zero/comm/comm_errors.h"
#include "zero/comm/communicator.h"
#include "zero/core/error.h"

namespace zero::detail {

// Every rank's string, on every rank (through the device the communicator
// works on; the words are copied, never summed). Collective.
std::vector<std::string> all_gather_text(comm::Communicator& comm, const c10::Device& device, const std::string& mine);

// Each rank's error ("" for none) to every rank; throws E on every rank when
// any failed: its own message where it failed, the first failing rank's
// otherwise (as comm::ForAnotherRank<E>, which fail_job does not print: the
// failing rank prints its own). Collective.
template <class E = Error>
void agree(comm::Communicator& comm, const c10::Device& device, const std::string& error, const std::string& what) {
  const std::vector<std::string> errors = all_gather_text(comm, device, error);
  if (!error.empty()) throw E(error);
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) {
      throw comm::ForAnotherRank<E>(detail::str_cat(what, " failed on rank ", r, ": ", errors[r]), static_cast<int>(r));
    }
  }
}

// agree() where every rank can fail alone (`collective`, the same on every
// rank); otherwise this rank's error alone, with no collective.
template <class E = Error>
void agree_if(bool collective, comm::Communicator& comm, const c10::Device& device, const std::string& error,
              const std::string& what) {
  if (collective) {
    agree<E>(comm, device, error, what);
  } else if (!error.empty()) {
    throw Error(error);
  }
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

}  // namespace zero::detail
