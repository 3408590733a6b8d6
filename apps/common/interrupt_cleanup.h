// What a tool leaves behind when it is interrupted: nothing of its own.
//
// While an InterruptCleanup lives, SIGINT, SIGTERM and SIGHUP (Ctrl-C, kill,
// a closed terminal) first remove the files it was given and then the
// folders (only if empty, the last given first), and end the process as
// the signal would have (the same exit status). For temporaries written
// beside their final names: a full-size .tmp of a 6 GB export is not left
// on the disk by a Ctrl-C. A SIGKILL cannot be caught; the next run to the
// same output replaces the temporaries.
//
// A signal that was ignored when the InterruptCleanup was made (nohup, a
// script's `cmd &`) stays ignored.
//
// InterruptCleanup::Hold holds those signals back while it lives (a rename
// pair that must not be split by one); a signal that came meanwhile acts
// when the Hold ends. It blocks them for the calling thread only: the
// renames it guards must run on the thread that handles the signals (the
// tools' main thread; their I/O threads block none).
#pragma once

#include <signal.h>

#include <filesystem>

namespace zero::tools {

class InterruptCleanup {
 public:
  InterruptCleanup();   // installs the handlers (one InterruptCleanup at a time)
  ~InterruptCleanup();  // the earlier handlers back; nothing removed
  InterruptCleanup(const InterruptCleanup&) = delete;
  InterruptCleanup& operator=(const InterruptCleanup&) = delete;

  // Given before the file or folder is created; a path too long to hold, or
  // past the 64th, is not removed (it stays, as without this).
  void add_file(const std::filesystem::path& p);
  void add_folder(const std::filesystem::path& p);
  // Everything is in place: an interrupt from now on removes nothing.
  void forget_all();

  class Hold {
   public:
    Hold();
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    sigset_t old_;
  };

 private:
  struct sigaction old_[3];
  bool handled_[3] = {false, false, false};
};

}  // namespace zero::tools
