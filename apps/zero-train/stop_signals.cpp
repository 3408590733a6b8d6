#include "stop_signals.h"

#include <signal.h>

#include <atomic>
#include <csignal>

#include "zero/core/error.h"

namespace zero::train {
namespace {

constexpr std::size_t kSlots = StopSignals::kCount;
constexpr int kSignals[kSlots] = {SIGTERM, SIGINT, SIGUSR2, SIGUSR1, SIGHUP};
constexpr const char* kNames[kSlots] = {"SIGTERM", "SIGINT", "SIGUSR2", "SIGUSR1", "SIGHUP"};

// Written by the handler, read by take_counts(): lock-free atomics are safe
// to touch from a signal handler.
std::atomic<int> g_counts[kSlots];
std::atomic<bool> g_stop_seen{false};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);
struct sigaction g_previous[kSlots];
bool g_handled[kSlots];  // SIGHUP and SIGINT stay ignored where they were (nohup, a background job)
std::atomic<bool> g_installed{false};

std::size_t slot_of(int sig) {
  for (std::size_t i = 0; i < kSlots; ++i) {
    if (kSignals[i] == sig) return i;
  }
  return kSlots;
}

extern "C" void on_signal(int sig) {
  const std::size_t slot = slot_of(sig);
  if (slot >= kSlots) return;
  if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) {
    // The second one: the user (or the scheduler) will not wait.
    if (g_stop_seen.exchange(true)) {
      ::signal(sig, SIG_DFL);
      ::raise(sig);
      return;
    }
  }
  g_counts[slot].fetch_add(1);
}

}  // namespace

StopSignals::StopSignals() {
  ZERO_CHECK(!g_installed.exchange(true), "zero-train: the signal handlers are installed once per process");
  for (auto& c : g_counts) c.store(0);
  g_stop_seen.store(false);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  // Reads and writes interrupted by the signal go on (the swap file's, the
  // checkpoint's): the handler only counts.
  sa.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < kSlots; ++i) {
    ::sigaction(kSignals[i], nullptr, &g_previous[i]);
    // Started under nohup (SIGHUP ignored): a closed terminal does not stop
    // it. Started in the background by a script (`zero-train ... &`: the
    // shell ignores SIGINT for it): a Ctrl-C meant for the foreground does
    // not either, at any moment (before, one that came before this point
    // was ignored and one after it stopped the run).
    const int sig = kSignals[i];
    g_handled[i] = !((sig == SIGHUP || sig == SIGINT) && g_previous[i].sa_handler == SIG_IGN);
    if (g_handled[i]) ::sigaction(kSignals[i], &sa, nullptr);
  }
}

StopSignals::~StopSignals() { restore(); }

void StopSignals::restore() {
  if (!installed_) return;
  installed_ = false;
  for (std::size_t i = 0; i < kSlots; ++i) {
    if (g_handled[i]) ::sigaction(kSignals[i], &g_previous[i], nullptr);
  }
  g_installed.store(false);
}

std::string StopSignals::restore_and_raise_late(bool stop_agreed) {
  restore();
  std::string save;
  for (std::size_t i = 0; i < kSlots; ++i) {
    if (g_counts[i].exchange(0) == 0) continue;
    if (kSignals[i] == SIGUSR1) {
      save = kNames[i];
    } else if (!stop_agreed) {
      ::raise(kSignals[i]);
    }
  }
  return save;
}

std::array<float, StopSignals::kCount> StopSignals::take_counts() {
  std::array<float, kSlots> out{};
  for (std::size_t i = 0; i < kSlots; ++i) out[i] = static_cast<float>(g_counts[i].exchange(0));
  return out;
}

SignalVerdict signal_verdict(const std::array<float, StopSignals::kCount>& summed) {
  SignalVerdict v;
  for (std::size_t i = 0; i < kSlots; ++i) {
    if (summed[i] <= 0.0f) continue;
    std::string& names = kSignals[i] == SIGUSR1 ? v.save_names : v.stop_names;
    if (kSignals[i] == SIGUSR1) {  // save, and train on
      v.save = true;
    } else {
      v.stop = v.save = true;
    }
    names += (names.empty() ? "" : " and ");
    names += kNames[i];
  }
  return v;
}

void SignalVerdict::merge(const SignalVerdict& other) {
  auto join = [](std::string& names, const std::string& more) {
    if (more.empty() || names.find(more) != std::string::npos) return;
    names += (names.empty() ? "" : " and ");
    names += more;
  };
  stop = stop || other.stop;
  save = save || other.save;
  join(stop_names, other.stop_names);
  join(save_names, other.save_names);
}

}  // namespace zero::train
