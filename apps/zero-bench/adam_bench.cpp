// zero-bench adam: CPU Adam (AdamW, fp32 master weights) in M params/s, for
// each n and thread count asked (or, with --optimizer lion, CPU Lion against
// the same kinds of figure: its five-stream ceiling, Lion in LibTorch
// operations, its scalar loop, DeepSpeedCPULion), against
//   - the ceiling measured in the same run: an in-place kernel with the same
//     seven streams (reads p, g, m, v; writes p, m, v) and trivial arithmetic,
//     on the same threads and tiles (ceiling_kernel.h), run with software
//     prefetch 0, 128 and 256 elements ahead and taken as the best of the
//     three; and a second one with the streams of the bf16-grads +
//     bf16-copy-out variant;
//   - LibTorch's torch::optim::AdamW on one flat tensor of n, with
//     at::set_num_threads(threads);
//   - the naive scalar loop (adam_step_reference), on the same threads;
//   - DeepSpeed's DeepSpeedCPUAdam (bench/deepspeed_cpu_adam.py, run with the
//     project's .venv python) when it is installed (bench/setup-deepspeed),
//     once before and once after the rounds, the better figure reported.
// Each of our SIMD targets is validated against the reference on a slice
// before anything is timed (llm.c's dev/cuda habit). The variants run
// interleaved, one step each per round, so a change in machine load during
// the run hits them alike; each figure is the median over --iters rounds after
// --warmup rounds.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <sys/mman.h>

#include <algorithm>
#include <cctype>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ceiling_kernel.h"
#include "commands.h"
#include "common/cli_range.h"
#include "zero/core/error.h"
#include "zero/core/half.h"
#include "zero/optim/cpu_adam.h"

namespace zero::bench {
namespace {

using Json = nlohmann::ordered_json;

// Bytes each variant moves per parameter (reads + writes), for GB/s.
constexpr int kBytesFp32 = 4 * 4 + 3 * 4;          // read p g m v; write p m v
constexpr int kBytesBf16 = 3 * 4 + 2 + 3 * 4 + 2;  // read p m v, g16; write p m v, half
constexpr int kBytesLion = 3 * 4 + 2 * 4;          // read p g m; write p m
// Software prefetch distances (elements) the ceiling kernels are run with.
constexpr std::size_t kCeilingPrefetch[] = {0, 128, 256};

struct Options {
  std::vector<std::string> sizes;
  std::string threads = "1,all";
  int iters = 10;
  int warmup = 2;
  bool json = false;
  std::string deepspeed = "auto";  // auto | off
  bool torch = true;
  bool scalar = true;
  bool hugepages = true;
  std::string optimizer = "adamw";  // adamw | lion
  bool lion() const { return optimizer == "lion"; }
};

// "16M" -> 16 * 2^20, "512K", "1G", or a plain count.
std::size_t parse_count(const std::string& text) {
  ZERO_CHECK(!text.empty(), "--n: empty size");
  ZERO_CHECK(std::isdigit(static_cast<unsigned char>(text[0])), "--n: '", text,
             "' is not a count (e.g. 1000, 16M, 512K, 1G)");
  std::size_t pos = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &pos);
  } catch (const std::exception&) {
    ZERO_CHECK(false, "--n: '", text, "' is not a count (e.g. 1000, 16M, 512K, 1G)");
  }
  ZERO_CHECK(value >= 1, "--n: counts must be >= 1, got '", text, "'");
  const std::string suffix = text.substr(pos);
  if (suffix.empty()) return value;
  if (suffix == "K" || suffix == "k") return value << 10;
  if (suffix == "M" || suffix == "m") return value << 20;
  if (suffix == "G" || suffix == "g") return value << 30;
  ZERO_CHECK(false, "--n: unknown suffix in '", text, "' (use K, M or G: powers of 1024)");
  return 0;
}

std::string count_name(std::size_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n >= (1u << 10) && n % (1u << 10) == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}

std::vector<int> parse_threads(const std::string& text) {
  const int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int t = 0;
    if (item == "all") {
      t = all;
    } else {
      try {
        t = std::stoi(item);
      } catch (const std::exception&) {
        ZERO_CHECK(false, "--threads: '", item, "' is not a thread count or 'all'");
      }
    }
    ZERO_CHECK(t >= 1, "--threads: counts must be >= 1, got ", item);
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  }
  ZERO_CHECK(!out.empty(), "--threads: give at least one count, e.g. 1,2 or 1,all");
  return out;
}

// Page-aligned memory from mmap, optionally backed by transparent huge pages
// (MADV_HUGEPAGE: fewer TLB misses on multi-GB streams; LibTorch and the
// DeepSpeed peer get the same through THP_MEM_ALLOC_ENABLE=1).
//
// Buffer k starts k KiB into its mapping. Without that, buffers of a
// power-of-two size all start at the same address modulo that size, every
// stream's element i falls in the same cache set and DRAM bank, and the
// in-place streams run several times slower (measured here: 64 Mi elements,
// 4 streams, 1 thread: 255 M params/s unstaggered vs ~1600 staggered). glibc
// staggers large allocations by a page already, so LibTorch's tensors (and
// the engine's) do not hit this; the benchmark must not either.
template <typename T>
class HostBuffer {
 public:
  HostBuffer(std::size_t n, bool hugepages, std::size_t index)
      : stagger_(index * 1024), bytes_(n * sizeof(T) + stagger_ + 1) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ZERO_CHECK(p != MAP_FAILED, "cannot map ", bytes_, " bytes for the benchmark buffers");
    if (hugepages) madvise(p, bytes_, MADV_HUGEPAGE);
    base_ = p;
    data_ = reinterpret_cast<T*>(static_cast<char*>(p) + stagger_);
  }
  ~HostBuffer() { munmap(base_, bytes_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  T* data() { return data_; }
  T& operator[](std::size_t i) { return data_[i]; }

 private:
  std::size_t stagger_;
  std::size_t bytes_;
  void* base_ = nullptr;
  T* data_ = nullptr;
};

// A fast deterministic fill (xorshift), in [-1, 1).
void fill_uniform(float* x, std::size_t n, std::uint64_t seed, float scale) {
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x[i] = scale * (static_cast<float>(s >> 40) * 0x1.0p-23f - 1.0f);
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const std::size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

// Lion as its paper suggests it (betas 0.9, 0.99) with a weight decay: the
// kernel's time does not depend on the values.
optim::LionHyper lion_hyper() {
  optim::LionHyper h;
  h.lr = 1e-4f;
  h.beta2 = 0.99f;
  h.weight_decay = 0.1f;
  return h;
}

optim::AdamHyper bench_hyper(std::int64_t step) {
  optim::AdamHyper h;  // AdamW: lr 1e-3, betas (0.9, 0.999), eps 1e-8
  h.weight_decay = 0.01f;
  h.step = step;
  return h;
}

// Our kernel on `target`, through `pool`, against the scalar reference on a
// slice of the benchmark's own data, off vector alignment, 3 steps, with and
// without the bf16 copy. Throws (and so stops the benchmark) on a mismatch.
void validate_lion_target(const std::string& target, const float* p0, const float* g0, std::size_t n,
                          optim::ThreadPool& pool) {
  const std::size_t kSlice = std::min(n, 3 * optim::kTileElements + 7);
  std::vector<float> p(p0, p0 + kSlice), m(kSlice, 0.0f), rp(p0, p0 + kSlice), rm(kSlice, 0.0f);
  optim::force_simd_target(target);
  for (int step = 1; step <= 3; ++step) {
    optim::lion_step(lion_hyper(), optim::LionBuffers{p.data(), g0, DType::kFloat32, m.data(), kSlice}, &pool);
    optim::lion_step_reference(lion_hyper(), optim::LionBuffers{rp.data(), g0, DType::kFloat32, rm.data(), kSlice});
  }
  optim::force_simd_target("");
  for (std::size_t i = 0; i < kSlice; ++i) {
    ZERO_CHECK(p[i] == rp[i] && m[i] == rm[i], "validation failed: target ", target, " (Lion) element ", i,
               ": p/m ", p[i], "/", m[i], " vs reference ", rp[i], "/", rm[i]);
  }
}

void validate_target(const std::string& target, const float* p0, const float* g0, std::size_t n,
                     optim::ThreadPool& pool) {
  const std::size_t kSlice = std::min(n, 3 * optim::kTileElements + 7);
  for (bool bf16 : {false, true}) {
    std::vector<float> p(kSlice + 1), m(kSlice + 1, 0.0f), v(kSlice + 1, 0.0f);
    std::vector<float> rp(kSlice + 1), rm(kSlice + 1, 0.0f), rv(kSlice + 1, 0.0f);
    std::vector<std::uint16_t> g16(kSlice + 1), half(kSlice + 1);
    std::copy(p0, p0 + kSlice, p.begin() + 1);
    std::copy(p0, p0 + kSlice, rp.begin() + 1);
    for (std::size_t i = 0; i < kSlice; ++i) g16[i + 1] = float_to_bf16(g0[i]);
    optim::AdamBuffers b;
    b.params = p.data() + 1;
    b.grads = bf16 ? static_cast<const void*>(g16.data() + 1) : static_cast<const void*>(g0);
    b.grad_dtype = bf16 ? DType::kBFloat16 : DType::kFloat32;
    b.exp_avg = m.data() + 1;
    b.exp_avg_sq = v.data() + 1;
    b.n = kSlice;
    optim::AdamBuffers rb = b;
    rb.params = rp.data() + 1;
    rb.exp_avg = rm.data() + 1;
    rb.exp_avg_sq = rv.data() + 1;
    if (bf16) {
      b.half_out = half.data() + 1;
      b.half_dtype = DType::kBFloat16;
    }
    optim::force_simd_target(target);
    for (int step = 1; step <= 3; ++step) {
      optim::adam_step(bench_hyper(step), b, &pool);
      optim::adam_step_reference(bench_hyper(step), rb);
    }
    optim::force_simd_target("");
    for (std::size_t i = 1; i <= kSlice; ++i) {
      const auto close = [](float a, float r) {
        return (std::isnan(a) && std::isnan(r)) ||
               std::fabs(a - r) <= 1e-6f * std::max(std::fabs(a), std::fabs(r));
      };
      ZERO_CHECK(close(p[i], rp[i]) && close(m[i], rm[i]) && close(v[i], rv[i]),
                 "validation failed: target ", target, (bf16 ? " (bf16 grads)" : " (fp32 grads)"),
                 " element ", i - 1, ": p/m/v ", p[i], "/", m[i], "/", v[i], " vs reference ",
                 rp[i], "/", rm[i], "/", rv[i]);
      ZERO_CHECK(!bf16 || half[i] == float_to_bf16(p[i]), "validation failed: target ", target,
                 " bf16 copy of element ", i - 1);
    }
  }
}

struct Variant {
  Variant(std::string key_, std::string label_, std::string target_, int bytes,
          std::string ceiling, std::function<void(std::int64_t)> run_)
      : key(std::move(key_)), label(std::move(label_)), target(std::move(target_)),
        bytes_per_param(bytes), ceiling_key(std::move(ceiling)), run(std::move(run_)) {}
  std::string key;    // JSON key
  std::string label;  // table row
  std::string target;
  int bytes_per_param = kBytesFp32;
  std::string ceiling_key;  // the ceiling group it is compared with ("" for a ceiling)
  std::string group;        // for a ceiling kernel: the group it is one candidate of
  std::function<void(std::int64_t step)> run;
  std::vector<double> seconds;
  double mps = NAN;
};

struct PeerResult {
  double mps = NAN;
  std::string version;
  std::string error;  // why there is no figure
};

std::string python_path() {
  if (const char* env = std::getenv("ZERO_PYTHON")) return env;
  return ZERO_BENCH_PYTHON;
}

// Runs bench/deepspeed_cpu_adam.py and reads the JSON line it prints last.
PeerResult run_deepspeed(std::size_t n, int threads, int iters, int warmup, bool hugepages,
                         const std::string& optimizer) {
  PeerResult r;
  const std::string script = std::string(ZERO_SOURCE_DIR) + "/bench/deepspeed_cpu_adam.py";
  const std::string python = python_path();
  if (std::FILE* f = std::fopen(python.c_str(), "r")) {
    std::fclose(f);
  } else {
    r.error = "no python at " + python + " (run scripts/setup, then bench/setup-deepspeed)";
    return r;
  }
  std::ostringstream cmd;
  cmd << "DS_ACCELERATOR=cpu OMP_NUM_THREADS=" << threads
      << (hugepages ? " THP_MEM_ALLOC_ENABLE=1" : "") << " '" << python << "' '" << script
      << "' --n " << n << " --threads " << threads << " --iters " << iters << " --warmup "
      << warmup << " --optimizer " << optimizer << " 2>&1";
  std::FILE* pipe = popen(cmd.str().c_str(), "r");
  if (pipe == nullptr) {
    r.error = "cannot start " + python;
    return r;
  }
  std::string out, last_json;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), pipe) != nullptr) {
    const std::string line = buf.data();
    out += line;
    if (!line.empty() && line[0] == '{') last_json = line;
  }
  const int status = pclose(pipe);
  if (last_json.empty()) {
    const std::size_t keep = 600;
    r.error = "no result from " + script + " (exit status " + std::to_string(status) +
              "); its output ended: " + (out.size() > keep ? out.substr(out.size() - keep) : out);
    return r;
  }
  try {
    const Json j = Json::parse(last_json);
    if (j.contains("error")) {
      r.error = j["error"].get<std::string>() + " (install it with bench/setup-deepspeed)";
    } else {
      r.mps = j["mps"].get<double>();
      r.version = j.value("deepspeed", "");
    }
  } catch (const std::exception& e) {
    r.error = std::string("unreadable result from the peer: ") + e.what();
  }
  return r;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

struct ConfigResult {
  bool lion = false;
  std::size_t n = 0;
  int threads = 0;
  std::vector<Variant> variants;
  PeerResult deepspeed;       // the better of the two runs
  std::vector<double> deepspeed_runs;  // both runs' figures (before, after)
  bool deepspeed_ran = false;
};

// The figure of a variant by key; for a ceiling group ("ceiling",
// "bf16_ceiling"), the best of its candidates.
double find_mps(const std::vector<Variant>& vs, const std::string& key) {
  double best = NAN;
  for (const Variant& v : vs) {
    if (v.key == key) return v.mps;
    if (v.group == key && !(v.mps <= best)) best = v.mps;
  }
  return best;
}

ConfigResult run_config(const Options& o, std::size_t n, int threads) {
  ConfigResult res;
  res.lion = o.lion();
  res.n = n;
  res.threads = threads;
  optim::ThreadPool pool(threads);
  at::set_num_threads(threads);

  // Our buffers; the ceilings run on the same ones (their values drift, which
  // does not matter for the timing of trivial adds).
  HostBuffer<float> p(n, o.hugepages, 0), g(n, o.hugepages, 1), m(n, o.hugepages, 2),
      v(n, o.hugepages, 3);
  HostBuffer<std::uint16_t> g16(n, o.hugepages, 4), half(n, o.hugepages, 5);
  fill_uniform(p.data(), n, 1, 1.0f);
  fill_uniform(g.data(), n, 2, 1e-2f);
  std::fill(m.data(), m.data() + n, 0.0f);
  std::fill(v.data(), v.data() + n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) g16[i] = float_to_bf16(g[i]);
  std::fill(half.data(), half.data() + n, std::uint16_t{0});

  const std::vector<std::string> targets = optim::available_simd_targets();
  const std::string best = targets.front();
  const std::string ceiling_target = ceiling_simd_target();
  std::vector<Variant>& vs = res.variants;
  at::Tensor tp, tg, tm;
  std::unique_ptr<torch::optim::AdamW> torch_opt;
  if (o.lion()) {
    for (const std::string& t : targets) validate_lion_target(t, p.data(), g.data(), n, pool);
    for (std::size_t pd : kCeilingPrefetch) {
      vs.push_back({"ceiling_prefetch" + std::to_string(pd), "ceiling, 5 streams, prefetch " + std::to_string(pd),
                    ceiling_target, kBytesLion, "", [&, pd](std::int64_t) {
                      ceiling_step_lion(p.data(), g.data(), m.data(), n, &pool, pd);
                    }});
      vs.back().group = "ceiling";
    }
    for (const std::string& t : targets) {
      vs.push_back({"zerocpp_" + t, "zerocpp Lion, fp32 grads", t, kBytesLion, "ceiling", [&, t](std::int64_t) {
                      optim::force_simd_target(t);
                      optim::lion_step(lion_hyper(), optim::LionBuffers{p.data(), g.data(), DType::kFloat32, m.data(), n},
                                       &pool);
                    }});
    }
    if (o.torch) {
      // Lion as PyTorch users write it (lucidrains/lion-pytorch): four
      // LibTorch operations over one flat tensor, at::set_num_threads above.
      tp = at::from_blob(p.data(), {static_cast<std::int64_t>(n)}, at::kFloat).clone();
      tg = at::from_blob(g.data(), {static_cast<std::int64_t>(n)}, at::kFloat).clone();
      tm = at::zeros_like(tp);
      vs.push_back({"torch", "Lion in LibTorch operations", "aten", kBytesLion, "ceiling", [&](std::int64_t) {
                      const optim::LionHyper h = lion_hyper();
                      tp.mul_(1.0 - static_cast<double>(h.lr) * h.weight_decay);
                      tp.add_((tm * h.beta1).add_(tg, 1.0 - h.beta1).sign_(), -static_cast<double>(h.lr));
                      tm.mul_(h.beta2).add_(tg, 1.0 - h.beta2);
                    }});
    }
    if (o.scalar) {
      vs.push_back({"scalar", "scalar reference loop", "none", kBytesLion, "ceiling", [&](std::int64_t) {
                      pool.parallel_for(n, optim::kTileElements, [&](std::size_t b0, std::size_t b1) {
                        optim::lion_step_reference(
                            lion_hyper(), optim::LionBuffers{p.data() + b0, g.data() + b0, DType::kFloat32, m.data() + b0,
                                                             b1 - b0});
                      });
                    }});
    }
  } else {
    for (const std::string& t : targets) validate_target(t, p.data(), g.data(), n, pool);
    // The ceilings, with and without software prefetch (our kernel prefetches
    // 256 elements ahead; a ceiling without it can be slower than the kernel on
    // one thread). The ceiling a variant is compared with is the best of its
    // group, so prefetching never flatters the ratio.
    for (std::size_t pd : kCeilingPrefetch) {
      vs.push_back({"ceiling_prefetch" + std::to_string(pd),
                    "ceiling, 7 streams, prefetch " + std::to_string(pd), ceiling_target,
                    kBytesFp32, "", [&, pd](std::int64_t) {
                      ceiling_step_fp32(p.data(), g.data(), m.data(), v.data(), n, &pool, pd);
                    }});
      vs.back().group = "ceiling";
    }
    for (const std::string& t : targets) {
      vs.push_back({"zerocpp_" + t, "zerocpp AdamW, fp32 grads", t, kBytesFp32, "ceiling",
                    [&, t](std::int64_t step) {
                      optim::force_simd_target(t);
                      optim::AdamBuffers b;
                      b.params = p.data();
                      b.grads = g.data();
                      b.exp_avg = m.data();
                      b.exp_avg_sq = v.data();
                      b.n = n;
                      optim::adam_step(bench_hyper(step), b, &pool);
                    }});
    }
    for (std::size_t pd : kCeilingPrefetch) {
      vs.push_back({"bf16_ceiling_prefetch" + std::to_string(pd),
                    "bf16 ceiling, prefetch " + std::to_string(pd), ceiling_target,
                    kBytesBf16, "", [&, pd](std::int64_t) {
                      ceiling_step_bf16(p.data(), g16.data(), m.data(), v.data(), half.data(), n,
                                        &pool, pd);
                    }});
      vs.back().group = "bf16_ceiling";
    }
    vs.push_back({"zerocpp_bf16_copyout", "zerocpp AdamW, bf16 grads + bf16 copy", best, kBytesBf16,
                  "bf16_ceiling", [&](std::int64_t step) {
                    optim::force_simd_target(best);
                    optim::AdamBuffers b;
                    b.params = p.data();
                    b.grads = g16.data();
                    b.grad_dtype = DType::kBFloat16;
                    b.exp_avg = m.data();
                    b.exp_avg_sq = v.data();
                    b.n = n;
                    b.half_out = half.data();
                    b.half_dtype = DType::kBFloat16;
                    optim::adam_step(bench_hyper(step), b, &pool);
                  }});

    // LibTorch's AdamW on its own flat tensor of n (its state is created on the
    // first, warm-up, step).
    if (o.torch) {
      tp = at::from_blob(p.data(), {static_cast<std::int64_t>(n)}, at::kFloat).clone();
      tg = at::from_blob(g.data(), {static_cast<std::int64_t>(n)}, at::kFloat).clone();
      tp.set_requires_grad(true);
      tp.mutable_grad() = tg;
      torch_opt = std::make_unique<torch::optim::AdamW>(
          std::vector<at::Tensor>{tp}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
      vs.push_back({"torch", "torch::optim::AdamW (LibTorch)", "aten", kBytesFp32, "ceiling",
                    [&](std::int64_t) { torch_opt->step(); }});
    }
    if (o.scalar) {
      vs.push_back({"scalar", "scalar reference loop", "none", kBytesFp32, "ceiling",
                    [&](std::int64_t step) {
                      const optim::AdamHyper h = bench_hyper(step);
                      pool.parallel_for(n, optim::kTileElements, [&](std::size_t b0, std::size_t b1) {
                        optim::AdamBuffers b;
                        b.params = p.data() + b0;
                        b.grads = g.data() + b0;
                        b.exp_avg = m.data() + b0;
                        b.exp_avg_sq = v.data() + b0;
                        b.n = b1 - b0;
                        optim::adam_step_reference(h, b);
                      });
                    }});
    }
  }

  // DeepSpeed runs in its own process, so it cannot be interleaved with the
  // rounds; it runs once before and once after them, and the better of the
  // two is reported (a change of machine load then cannot flatter our ratio).
  PeerResult ds_before;
  if (o.deepspeed != "off") ds_before = run_deepspeed(n, threads, o.iters, o.warmup, o.hugepages, o.optimizer);

  // Interleaved rounds: every variant steps once per round.
  for (int round = 0; round < o.warmup + o.iters; ++round) {
    for (Variant& var : vs) {
      const auto t0 = std::chrono::steady_clock::now();
      var.run(round + 1);
      const auto t1 = std::chrono::steady_clock::now();
      if (round >= o.warmup) var.seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
  }
  optim::force_simd_target("");
  for (Variant& var : vs) var.mps = static_cast<double>(n) / median(var.seconds) / 1e6;
  torch_opt.reset();
  tp = at::Tensor();
  tg = at::Tensor();
  tm = at::Tensor();

  if (o.deepspeed != "off") {
    res.deepspeed_ran = true;
    const PeerResult after = run_deepspeed(n, threads, o.iters, o.warmup, o.hugepages, o.optimizer);
    const bool before_ok = ds_before.error.empty(), after_ok = after.error.empty();
    res.deepspeed = !after_ok || (before_ok && ds_before.mps >= after.mps) ? ds_before : after;
    if (before_ok && after_ok) {
      res.deepspeed_runs = {ds_before.mps, after.mps};
    }
  }
  return res;
}

// The variants measured above their ceiling by more than 10%: the ceiling
// is a bound, so the machine's load changed between them (another job, a
// frequency change): figures of that run are not to be recorded.
std::vector<const Variant*> past_ceiling(const ConfigResult& r) {
  std::vector<const Variant*> out;
  for (const Variant& v : r.variants) {
    if (v.ceiling_key.empty()) continue;
    const double ceiling = find_mps(r.variants, v.ceiling_key);
    if (!std::isnan(ceiling) && v.mps > 1.10 * ceiling) out.push_back(&v);
  }
  return out;
}

void print_config(const ConfigResult& r) {
  const double torch_mps = find_mps(r.variants, "torch");
  std::printf("\nn = %zu (%s), threads = %d\n", r.n, count_name(r.n).c_str(), r.threads);
  std::printf("  %-40s %-7s %10s %8s %11s %9s\n", "variant", "target", "Mparam/s", "GB/s",
              "of ceiling", "x torch");
  const auto row = [&](const std::string& label, const std::string& target, double mps, int bytes,
                       double ceiling) {
    char of_ceiling[32] = "";
    if (!std::isnan(ceiling)) std::snprintf(of_ceiling, sizeof of_ceiling, "%.1f%%", 100.0 * mps / ceiling);
    char x_torch[32] = "";
    if (!std::isnan(torch_mps)) std::snprintf(x_torch, sizeof x_torch, "%.2fx", mps / torch_mps);
    std::printf("  %-40s %-7s %10.1f %8.1f %11s %9s\n", label.c_str(), target.c_str(), mps,
                mps * bytes / 1e3, of_ceiling, x_torch);
  };
  for (const Variant& v : r.variants) {
    const double ceiling = find_mps(r.variants, v.ceiling_key.empty() ? v.group : v.ceiling_key);
    row(v.label, v.target, v.mps, v.bytes_per_param, ceiling);
  }
  for (const Variant* v : past_ceiling(r)) {
    std::printf("  warning: %s ran at %.0f%% of its ceiling, which bounds it: the machine's load changed during "
                "the rounds (load average now %s); these figures are noise, rerun on a quiet machine\n",
                v->label.c_str(), 100.0 * v->mps / find_mps(r.variants, v->ceiling_key), load_average().c_str());
  }
  if (r.deepspeed_ran) {
    if (r.deepspeed.error.empty()) {
      row((r.lion ? "DeepSpeedCPULion " : "DeepSpeedCPUAdam ") + r.deepspeed.version +
              (r.lion ? " (fp32)" : " (AdamW, fp32)"),
          "-", r.deepspeed.mps, r.lion ? kBytesLion : kBytesFp32, find_mps(r.variants, "ceiling"));
      if (r.deepspeed_runs.size() == 2) {
        std::printf("  (DeepSpeed in its own process, before and after the rounds: %.1f and %.1f; "
                    "the better is shown)\n",
                    r.deepspeed_runs[0], r.deepspeed_runs[1]);
      }
      const double ours = find_mps(r.variants, "zerocpp_" + optim::available_simd_targets().front());
      std::printf("  zerocpp (fp32 grads, best target) / DeepSpeed = %.3fx\n", ours / r.deepspeed.mps);
    } else {
      std::printf("  %s: not measured: %s\n", r.lion ? "DeepSpeedCPULion" : "DeepSpeedCPUAdam",
                  r.deepspeed.error.c_str());
    }
  }
}

void run_adam_bench(const Options& o) {
  std::vector<std::size_t> sizes;
  for (const std::string& s : o.sizes.empty() ? std::vector<std::string>{"16M", "64M"} : o.sizes) {
    sizes.push_back(parse_count(s));
  }
  const std::vector<int> threads = parse_threads(o.threads);
  ZERO_CHECK(o.iters >= 1 && o.warmup >= 0, "--iters must be >= 1 and --warmup >= 0");
  if (o.hugepages) setenv("THP_MEM_ALLOC_ENABLE", "1", 0);  // LibTorch's allocator, too

  const std::vector<std::string> targets = optim::available_simd_targets();
  std::string target_list;
  for (const std::string& t : targets) target_list += (target_list.empty() ? "" : " ") + t;
  const std::string load_before = load_average();
  std::printf("zero-bench adam: %s step on fp32 master weights; "
              "median of %d steps after %d warm-up, variants interleaved\n",
              o.lion() ? "Lion (lr 1e-4, betas 0.9 0.99, wd 0.1)" : "AdamW (lr 1e-3, wd 0.01)", o.iters, o.warmup);
  std::printf("machine: %s, %u hardware threads; SIMD targets: %s; ceiling kernels on %s; "
              "huge pages: %s\n",
              cpu_model().c_str(), std::thread::hardware_concurrency(), target_list.c_str(),
              ceiling_simd_target(), o.hugepages ? "madvise" : "off");
  if (o.lion()) {
    std::printf("bytes per param: %d (read p g m, write p m)\n", kBytesLion);
  } else {
    std::printf("bytes per param: fp32 grads %d (read p g m v, write p m v); bf16 grads + bf16 "
                "copy %d (read p m v + 2, write p m v + 2)\n",
                kBytesFp32, kBytesBf16);
  }
  std::printf("load average at start: %s\n", load_before.c_str());
  for (int t : threads) {
    if (t > static_cast<int>(std::thread::hardware_concurrency())) {
      std::printf("warning: --threads %d is more than the %u hardware threads: the threads take turns on the "
                  "cores, which measures the scheduler, not the kernel\n", t, std::thread::hardware_concurrency());
    }
  }
  std::fflush(stdout);

  std::vector<ConfigResult> results;
  for (std::size_t n : sizes) {
    for (int t : threads) {
      results.push_back(run_config(o, n, t));
      print_config(results.back());
      std::fflush(stdout);
    }
  }
  const std::string load_after = load_average();
  std::printf("\nload average at end: %s\n", load_after.c_str());

  if (!o.json) return;
  // Headline: the largest n at the largest thread count asked.
  const std::size_t max_n = *std::max_element(sizes.begin(), sizes.end());
  const int max_t = *std::max_element(threads.begin(), threads.end());
  const auto nan_to_null = [](double x) { return std::isnan(x) ? Json(nullptr) : Json(x); };
  Json out;
  for (const ConfigResult& r : results) {
    if (r.n != max_n || r.threads != max_t) continue;
    out["n"] = r.n;
    out["threads"] = r.threads;
    out["ceiling_mps"] = nan_to_null(find_mps(r.variants, "ceiling"));
    out["zerocpp_mps"] = nan_to_null(find_mps(r.variants, "zerocpp_" + targets.front()));
    out["zerocpp_target"] = targets.front();
    out["zerocpp_bf16_copyout_mps"] = nan_to_null(find_mps(r.variants, "zerocpp_bf16_copyout"));
    out["bf16_ceiling_mps"] = nan_to_null(find_mps(r.variants, "bf16_ceiling"));
    out["torch_mps"] = nan_to_null(find_mps(r.variants, "torch"));
    out["deepspeed_mps"] = r.deepspeed_ran && r.deepspeed.error.empty() ? Json(r.deepspeed.mps)
                                                                        : Json(nullptr);
    if (r.deepspeed_ran && !r.deepspeed.error.empty()) out["deepspeed_error"] = r.deepspeed.error;
  }
  out["optimizer"] = o.optimizer;
  if (o.lion()) {
    out["bytes_per_param"] = {{"fp32_grads", kBytesLion}};
  } else {
    out["bytes_per_param"] = {{"fp32_grads", kBytesFp32}, {"bf16_grads_bf16_copyout", kBytesBf16}};
  }
  out["machine"] = {{"cpu", cpu_model()}, {"hardware_threads", std::thread::hardware_concurrency()}};
  out["load_average"] = {{"start", load_before}, {"end", load_after}};
  out["iters"] = o.iters;
  out["warmup"] = o.warmup;
  Json configs = Json::array();
  bool noisy = false;  // a variant above its ceiling (past_ceiling)
  for (const ConfigResult& r : results) {
    Json c;
    c["n"] = r.n;
    c["threads"] = r.threads;
    Json mps;
    for (const Variant& v : r.variants) mps[v.key] = nan_to_null(v.mps);
    if (r.deepspeed_ran) {
      mps["deepspeed"] = r.deepspeed.error.empty() ? Json(r.deepspeed.mps) : Json(nullptr);
      if (!r.deepspeed_runs.empty()) c["deepspeed_runs"] = r.deepspeed_runs;
    }
    c["mps"] = mps;
    Json past = Json::array();
    for (const Variant* v : past_ceiling(r)) past.push_back(v->key);
    c["past_ceiling"] = past;
    noisy = noisy || !past.empty();
    configs.push_back(c);
  }
  out["configs"] = configs;
  out["noisy"] = noisy;
  out["command"] = command_line();
  std::printf("%s\n", out.dump().c_str());
}

}  // namespace

void add_adam_command(CLI::App& app) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "adam", "CPU Adam (AdamW), or Lion, in M params/s against its in-place memory-bandwidth ceiling, "
              "LibTorch, a scalar loop and DeepSpeed");
  cmd->add_option("--n", opts->sizes,
                  "parameter counts, e.g. 16M 64M or 1000 (K/M/G are powers of 1024; default: 16M 64M)")
      ->delimiter(',');
  cmd->add_option("--threads", opts->threads, "thread counts, comma-separated; 'all' = every core")
      ->capture_default_str();
  cmd->add_option("--iters", opts->iters, "timed steps per variant (the median is reported)")
      ->check(tools::at_least<long long>(1))
      ->capture_default_str();
  cmd->add_option("--warmup", opts->warmup, "untimed steps per variant first")->check(tools::at_least<long long>(0))
      ->capture_default_str();
  cmd->add_flag("--json", opts->json, "print one JSON object as the last line");
  cmd->add_option("--deepspeed", opts->deepspeed,
                  "auto: run DeepSpeedCPUAdam through bench/deepspeed_cpu_adam.py when it can; off")
      ->check(CLI::IsMember({"auto", "off"}))
      ->capture_default_str();
  cmd->add_option("--optimizer", opts->optimizer,
                  "adamw, or lion: Lion against its 5-stream ceiling, Lion in LibTorch operations and "
                  "DeepSpeedCPULion")
      ->check(CLI::IsMember({"adamw", "lion"}))
      ->capture_default_str();
  cmd->add_flag("!--no-torch", opts->torch, "skip LibTorch's AdamW (with --optimizer lion: its Lion)");
  cmd->add_flag("!--no-scalar", opts->scalar, "skip the scalar reference loop");
  cmd->add_flag("!--no-hugepages", opts->hugepages, "do not ask for transparent huge pages");
  cmd->callback([opts] {
    require_one_process("adam");
    // The counts and threads read before anything runs: a usage error (exit 2).
    try {
      for (const std::string& s : opts->sizes) parse_count(s);
      parse_threads(opts->threads);
    } catch (const Error& e) {
      throw CLI::ValidationError(e.what());
    }
    run_adam_bench(*opts);
  });
}

}  // namespace zero::bench
