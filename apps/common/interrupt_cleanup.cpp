#include "common/interrupt_cleanup.h"

#include <unistd.h>

#include <atomic>
#include <cstring>

#include "zero/core/error.h"

namespace zero::tools {

namespace {

constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
constexpr int kSlots = 64;
constexpr std::size_t kPathBytes = 4096;

// Written by the thread that adds, read by the handler: a slot is filled
// before the count that publishes it.
char g_paths[kSlots][kPathBytes];
bool g_is_folder[kSlots];
std::atomic<int> g_count{0};
std::atomic<bool> g_installed{false};

void add(const std::filesystem::path& p, bool folder) {
  const std::string s = p.string();
  const int n = g_count.load(std::memory_order_relaxed);
  if (n >= kSlots || s.size() >= kPathBytes) return;
  std::memcpy(g_paths[n], s.c_str(), s.size() + 1);
  g_is_folder[n] = folder;
  std::atomic_signal_fence(std::memory_order_release);
  g_count.store(n + 1, std::memory_order_release);
}

// Async-signal-safe: unlink, rmdir, signal, raise.
extern "C" void on_interrupt(int sig) {
  const int n = g_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    if (!g_is_folder[i]) ::unlink(g_paths[i]);
  }
  for (int i = n - 1; i >= 0; --i) {
    if (g_is_folder[i]) ::rmdir(g_paths[i]);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void signal_set(sigset_t* set) {
  sigemptyset(set);
  for (int s : kSignals) sigaddset(set, s);
}

}  // namespace

InterruptCleanup::InterruptCleanup() {
  ZERO_INTERNAL_ASSERT(!g_installed.exchange(true), "one InterruptCleanup at a time");
  g_count.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  for (int s : kSignals) sigaddset(&sa.sa_mask, s);  // one cleanup at a time
  for (int i = 0; i < 3; ++i) {
    // A signal ignored where the tool started (nohup, a script's `&`) stays
    // ignored: it must not end the process now.
    ::sigaction(kSignals[i], nullptr, &old_[i]);
    handled_[i] = old_[i].sa_handler != SIG_IGN;
    if (handled_[i]) ::sigaction(kSignals[i], &sa, nullptr);
  }
}

InterruptCleanup::~InterruptCleanup() {
  for (int i = 0; i < 3; ++i) {
    if (handled_[i]) ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  g_count.store(0);
  g_installed.store(false);
}

void InterruptCleanup::add_file(const std::filesystem::path& p) { add(p, false); }
void InterruptCleanup::add_folder(const std::filesystem::path& p) { add(p, true); }
void InterruptCleanup::forget_all() { g_count.store(0, std::memory_order_release); }

InterruptCleanup::Hold::Hold() {
  sigset_t set;
  signal_set(&set);
  ::pthread_sigmask(SIG_BLOCK, &set, &old_);
}

InterruptCleanup::Hold::~Hold() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

}  // namespace zero::tools
