#include "progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "zero/memory/memory_ledger.h"

namespace zero::train {

Progress::Progress(std::int64_t every) : tty_(isatty(fileno(stderr)) != 0), every_(every > 0 ? every : 1) {}

std::string terminal_line(const ProgressLine& p, const std::string& time, int columns) {
  char buf[256];
  auto text = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof buf, fmt, args...);
    return std::string(buf);
  };
  const int width = 24;
  const int filled = static_cast<int>(width * p.step / (p.steps > 0 ? p.steps : 1));
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(width, '.');
  const std::string counts = text("%lld/%lld loss %.4f", (long long)p.step, (long long)p.steps, p.loss) +
                             (p.val_loss >= 0 ? text(" val %.4f", p.val_loss) : std::string());
  // The segments, and the order they give way in when the terminal is
  // narrower than the whole line (a line longer than the terminal wraps,
  // and \r then redraws only its last row: every step would leave rows).
  struct Segment {
    std::string text;
    int drop_order;  // lowest first; -1: kept
  };
  const std::vector<Segment> segments = {
      {"[" + bar + "] ", 3},
      {counts, -1},
      {text(" | %.0f tok/s", p.tokens_per_s), 4},
      {text(" %.3f TFLOP/s", p.tflops), 1},
      {text(" | lr %.2e scale %g skipped %lld", p.lr, p.loss_scale, (long long)p.skipped), 2},
      {" | dev " + memory::format_bytes(p.device_bytes) + " host " + memory::format_bytes(p.host_bytes), 0},
      {" |" + time, 5},
  };
  std::vector<bool> shown(segments.size(), true);
  auto length = [&] {
    std::size_t n = 0;
    for (std::size_t i = 0; i < segments.size(); ++i) n += shown[i] ? segments[i].text.size() : 0;
    return n;
  };
  const std::size_t limit = columns > 1 ? static_cast<std::size_t>(columns - 1) : 0;
  for (int order = 0; order <= 5 && length() > limit; ++order) {
    for (std::size_t i = 0; i < segments.size(); ++i) {
      if (segments[i].drop_order == order) shown[i] = false;
    }
  }
  std::string line;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    if (shown[i]) line += segments[i].text;
  }
  if (line.size() > limit) line.resize(limit);
  return line;
}

namespace {

// The terminal's columns (stderr's), else $COLUMNS, else 80.
int terminal_columns() {
  winsize w{};
  if (ioctl(fileno(stderr), TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    const int n = std::atoi(c);
    if (n > 0) return n;
  }
  return 80;
}

}  // namespace

void Progress::update(const ProgressLine& p) {
  remaining_.observe(p.step, p.elapsed_s);
  const std::string time = elapsed_and_eta(p.elapsed_s, remaining_.seconds_left(p.steps));
  if (tty_) {
    std::fprintf(stderr, "\r%s\033[K", terminal_line(p, time, terminal_columns()).c_str());
    drawn_ = true;
  } else if (p.step % every_ == 0 || p.step == p.steps || p.val_loss >= 0) {
    char val[32] = "";
    if (p.val_loss >= 0) std::snprintf(val, sizeof val, " val %.4f", p.val_loss);
    const std::string dev = memory::format_bytes(p.device_bytes), host = memory::format_bytes(p.host_bytes);
    std::fprintf(stderr,
                 "step %lld/%lld loss %.4f%s tokens/s %.0f TFLOP/s %.4f lr %.3e loss_scale %g skipped %lld device %s host %s%s\n",
                 (long long)p.step, (long long)p.steps, p.loss, val, p.tokens_per_s, p.tflops, p.lr, p.loss_scale,
                 (long long)p.skipped, dev.c_str(), host.c_str(), time.c_str());
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace zero::train
