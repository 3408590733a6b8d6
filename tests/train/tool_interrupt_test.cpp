// The tools' cleanup on an interrupt (apps/common/interrupt_cleanup.h), in a
// child process each: a SIGTERM removes the temporaries and the folders made
// for them and ends the process as SIGTERM would; a SIGINT that comes while
// a Hold lives acts after it, on what is still registered.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "common/interrupt_cleanup.h"

namespace fs = std::filesystem;
using zero::tools::InterruptCleanup;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("zero_interrupt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Runs `child` in a child process; returns its wait status.
int in_child(const std::function<void()>& child) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    child();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(InterruptCleanup, ATerminationRemovesTheTemporariesAndTheFoldersMadeForThem) {
  const fs::path d = fresh_dir("term");
  const fs::path made = d / "new", sub = made / "sub", tmp = sub / "model.safetensors.tmp";
  const int status = in_child([&] {
    InterruptCleanup cleanup;
    cleanup.add_folder(made);
    cleanup.add_folder(sub);
    cleanup.add_file(tmp);
    fs::create_directories(sub);
    std::ofstream(tmp) << std::string(1 << 16, 'x');
    ::raise(SIGTERM);
    ::_exit(3);  // (not reached)
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(made));
  EXPECT_TRUE(fs::exists(d));  // (not registered)
  fs::remove_all(d);
}

TEST(InterruptCleanup, AnInterruptDuringAHoldActsAfterItOnWhatIsStillRegistered) {
  const fs::path d = fresh_dir("hold");
  const fs::path tmp = d / "config.json.tmp", kept = d / "config.json", other = d / "other.tmp";
  const int status = in_child([&] {
    InterruptCleanup cleanup;
    cleanup.add_file(tmp);
    std::ofstream(tmp) << "{}";
    {
      const InterruptCleanup::Hold hold;
      ::raise(SIGINT);  // held: the rename below still happens
      fs::rename(tmp, kept);
      cleanup.forget_all();
    }
    ::_exit(3);  // (not reached: the held SIGINT acts at the end of the hold)
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  EXPECT_TRUE(fs::exists(kept));
  EXPECT_FALSE(fs::exists(tmp));
  // Without the forget_all, what is registered goes.
  const int status2 = in_child([&] {
    InterruptCleanup cleanup;
    cleanup.add_file(other);
    std::ofstream(other) << "x";
    ::raise(SIGHUP);
    ::_exit(3);
  });
  ASSERT_TRUE(WIFSIGNALED(status2)) << status2;
  EXPECT_EQ(WTERMSIG(status2), SIGHUP);
  EXPECT_FALSE(fs::exists(other));
  fs::remove_all(d);
}

TEST(InterruptCleanup, ASignalIgnoredAtTheStartStaysIgnored) {
  const fs::path d = fresh_dir("nohup");
  const fs::path tmp = d / "x.tmp";
  const int status = in_child([&] {
    ::signal(SIGHUP, SIG_IGN);  // nohup
    InterruptCleanup cleanup;
    cleanup.add_file(tmp);
    std::ofstream(tmp) << "x";
    ::raise(SIGHUP);
    ::_exit(7);  // reached: the hangup was ignored
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 7);
  EXPECT_TRUE(fs::exists(tmp));
  fs::remove_all(d);
}

}  // namespace
