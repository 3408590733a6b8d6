#include "progress.h"

#include <unistd.h>

#include <cstdio>

#include "zero/memory/memory_ledger.h"

namespace zero::train {

Progress::Progress(std::int64_t every) : tty_(isatty(fileno(stderr)) != 0), every_(every > 0 ? every : 1) {}

void Progress::update(const ProgressLine& p) {
  char val[32] = "";
  if (p.val_loss >= 0) std::snprintf(val, sizeof val, " val %.4f", p.val_loss);
  const std::string dev = memory::format_bytes(p.device_bytes), host = memory::format_bytes(p.host_bytes);
  remaining_.observe(p.step, p.elapsed_s);
  const std::string time = elapsed_and_eta(p.elapsed_s, remaining_.seconds_left(p.steps));
  if (tty_) {
    const int width = 24;
    const int filled = static_cast<int>(width * p.step / (p.steps > 0 ? p.steps : 1));
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stderr,
                 "\r[%s] %lld/%lld loss %.4f%s | %.0f tok/s %.3f TFLOP/s | lr %.2e scale %g skipped %lld | dev %s host %s |%s\033[K",
                 bar.c_str(), (long long)p.step, (long long)p.steps, p.loss, val, p.tokens_per_s, p.tflops, p.lr,
                 p.loss_scale, (long long)p.skipped, dev.c_str(), host.c_str(), time.c_str());
    drawn_ = true;
  } else if (p.step % every_ == 0 || p.step == p.steps || p.val_loss >= 0) {
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
