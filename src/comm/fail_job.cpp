#include "zero/comm/fail_job.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "zero/comm/comm_errors.h"
#include "zero/comm/sequence_divergence.h"

namespace zero::comm {
namespace {

// How long a failing rank listens for the same error from lower ranks
// before it decides to print, and how long a rank that stays silent waits
// before it exits (so that the rank that prints does so before the launcher
// tears the job down).
constexpr std::chrono::milliseconds kListen{500};
constexpr std::chrono::milliseconds kSilentExitDelay{1500};
// How long a rank whose error only repeats another rank's failure (a rank
// agreement) waits for that rank's own announcement before it prints.
constexpr std::chrono::milliseconds kOtherRankGrace{10000};

[[noreturn]] void end_process(int world) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  if (world > 1) std::_Exit(1);
  std::exit(1);
}

}  // namespace

void fail_job(Communicator* comm, const std::exception& error, std::string_view program) {
  const int rank = comm != nullptr ? comm->rank() : 0;
  const int world = comm != nullptr ? comm->world_size() : 1;
  const std::string what = error.what();
  if (world <= 1) {
    std::fprintf(stderr, "%.*s: error: %s\n", static_cast<int>(program.size()), program.data(), what.c_str());
    end_process(world);
  }
  if (dynamic_cast<const RemoteFailure*>(&error) != nullptr) {
    // The failing rank prints; this one only says, in its flight recorder, why it stopped.
    std::this_thread::sleep_for(kSilentExitDelay);
    end_process(world);
  }
  HealthChannel* channel = comm->health_channel();
  if (const auto* other = dynamic_cast<const RaisedForAnotherRank*>(&error); other != nullptr && channel != nullptr) {
    // The rank that failed prints its own error once it gets here: wait (a
    // bounded time: it may be slow to unwind, or dead) for its announcement,
    // and print this rank's words for it if none comes.
    const auto until = std::chrono::steady_clock::now() + kOtherRankGrace;
    while (std::chrono::steady_clock::now() < until) {
      for (const AnnouncedFailure& f : channel->announced_failures()) {
        if (f.rank == other->failed_rank()) {
          std::this_thread::sleep_for(kSilentExitDelay);
          end_process(world);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  const auto* ce = dynamic_cast<const CommError*>(&error);
  const std::string key = ce != nullptr ? ce->key() : what;
  bool print = true;
  std::vector<int> same;
  if (channel != nullptr) {
    // The rank that prints says so first ("printed:<key>"), so that a rank
    // that fails the same way later (ranks time out on the same op at
    // slightly different times) stays silent.
    const std::string printed = "printed:" + key;
    auto printed_already = [&] {
      for (const AnnouncedFailure& f : channel->announced_failures()) {
        if (f.key == printed) return true;
      }
      return false;
    };
    print = !printed_already();
    if (print) channel->announce_failure(key, what, std::chrono::milliseconds(1000));
    // Ranks that fail together leave it to the lowest of them.
    const auto until = std::chrono::steady_clock::now() + kListen;
    while (print && std::chrono::steady_clock::now() < until) {
      same.clear();
      for (const AnnouncedFailure& f : channel->announced_failures()) {
        if (f.key == printed) print = false;
        if (f.key != key) continue;
        same.push_back(f.rank);
        if (f.rank < rank) print = false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (print) channel->announce_failure(printed, what, std::chrono::milliseconds(1000));
  }
  if (!print) {
    std::this_thread::sleep_for(kSilentExitDelay);
    end_process(world);
  }
  std::string also;
  if (!same.empty()) also = " (" + format_ranks(same) + " raised the same error)";
  std::fprintf(stderr, "%.*s: error on rank %d of %d: %s%s\n", static_cast<int>(program.size()), program.data(),
               rank, world, what.c_str(), also.c_str());
  end_process(world);
}

}  // namespace zero::comm
