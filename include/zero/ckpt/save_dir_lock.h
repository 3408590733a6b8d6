// One job per folder of checkpoints. Two jobs given the same folder replace
// each other's tags (step-5 of one run over step-5 of the other) and race
// on `latest`, with no error at the time. A job that saves holds this lock
// for as long as it may save: `<dir>/.lock`, flock'ed, holding the holder's
// pid, host and start time for the second job's error. The kernel drops
// the lock when the process ends, however it ends (kill -9 too), so a dead
// job's file is no obstacle; the file itself stays (removing it would let a
// third job lock a file the second has just opened).
//
// zero-train takes it on rank 0 for the run's whole length (--save-dir). A
// C++ program that saves from several processes to one folder takes it the
// same way, on one rank:
//   std::optional<zero::ckpt::SaveDirLock> lock;
//   if (comm.rank() == 0) lock.emplace("ckpts", "--save-dir");
#pragma once

#include <filesystem>
#include <string>

namespace zero::ckpt {

inline constexpr const char* kSaveDirLockName = ".lock";

class SaveDirLock {
 public:
  // Locks `dir` (which must exist), or throws zero::Error naming the job that
  // holds it and `option`, the setting that names the folder, and `clash`,
  // what two jobs in it would do. A folder that cannot be locked for another
  // reason (no room for the file, a filesystem without flock) is not
  // refused: warning() then says so. (zero-train locks its --out the same
  // way: two runs would write into each other's metrics.)
  SaveDirLock(const std::filesystem::path& dir, const std::string& option,
              const std::string& clash = "two jobs saving to one folder replace each other's checkpoints");
  // "" when locked; else why not, one sentence for the caller to print.
  const std::string& warning() const { return warning_; }
  ~SaveDirLock();
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;

 private:
  int fd_ = -1;
  std::string warning_;
};

}  // namespace zero::ckpt
