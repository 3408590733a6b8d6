// A fresh folder every rank of the job sees (rank 0's pid in its name,
// broadcast), and its removal. The engine tests that write files use them.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "zero/ckpt/checkpoint_dir.h"
#include "zero/comm/communicator.h"

namespace zero::test {

// Not std::filesystem::remove_all: libtorch.so's copy of it crashes
// (zero/ckpt/checkpoint_dir.h).
inline void rm_tree(const std::filesystem::path& p) {
  std::error_code ec;
  ckpt::remove_tree(p, ec);
}

// <temp>/<prefix><what>_<rank 0's pid>_np<world>, emptied and made by rank 0.
inline std::filesystem::path shared_temp_dir(comm::Communicator& comm, const std::string& prefix,
                                             const std::string& what) {
  float id = 0.0f;
  if (comm.rank() == 0) id = static_cast<float>(::getpid() % 1000000);
  comm.broadcast(&id, 1, DType::kFloat32)->wait();
  const std::filesystem::path d = std::filesystem::temp_directory_path() /
                                  (prefix + what + "_" + std::to_string(static_cast<long>(id)) + "_np" +
                                   std::to_string(comm.world_size()));
  comm.barrier()->wait();
  if (comm.rank() == 0) {
    rm_tree(d);
    std::filesystem::create_directories(d);
  }
  comm.barrier()->wait();
  return d;
}

}  // namespace zero::test
