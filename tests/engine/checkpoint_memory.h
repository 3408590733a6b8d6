// What the streamed checkpoints of the NVMe tiers are measured with
// (engine_nvme_test, engine_param_nvme_test): the growth of the process's
// peak resident memory over a call (Linux only), and the 25M-parameter
// model whose state it must not grow by.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include <ATen/ops/randn.h>
#include <torch/nn/modules/linear.h>

#include "zero/engine/engine.h"

namespace zero::test {

// A "<key>: N kB" line of /proc/self/status, in bytes (-1: none).
inline std::int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  }
  return -1;
}
// Under a sanitizer the resident memory holds its shadow of every page
// touched (and ASan's quarantine of freed blocks): no measure of what the
// engine holds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kRssMeasures = false;
#else
constexpr bool kRssMeasures = true;
#endif

// Peak resident memory of the process since the last reset_peak_rss().
inline std::int64_t peak_rss_bytes() { return status_bytes("VmHWM"); }
inline std::int64_t rss_bytes() { return status_bytes("VmRSS"); }
inline bool reset_peak_rss() {  // Linux >= 4.0: VmHWM back to VmRSS
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

// How much higher the peak resident memory went than where it was before
// `fn` ran (-1: the peak cannot be reset, /proc/self/clear_refs).
inline std::int64_t peak_rss_growth(const std::function<void()>& fn) {
  if (!reset_peak_rss()) return -1;
  const std::int64_t before = rss_bytes();
  fn();
  return peak_rss_bytes() - before;
}

// 25M parameters in one Linear (no bias), the same on every call.
inline std::shared_ptr<torch::nn::LinearImpl> big_linear() {
  torch::manual_seed(7);
  return std::make_shared<torch::nn::LinearImpl>(torch::nn::LinearOptions(4096, 6144).bias(false));
}
// One step of `engine` on a random input (seeded by `seed`): its buffers
// touched, so that what a later call adds to the resident memory is its own.
inline void big_linear_step(Engine& engine, torch::nn::LinearImpl& model, std::uint64_t seed) {
  torch::manual_seed(seed);
  engine.backward(model.forward(torch::randn({1, 4096})).square().mean());
  engine.step();
}

}  // namespace zero::test
