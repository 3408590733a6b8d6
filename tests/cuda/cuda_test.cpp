// zero_cuda on a device: the fused Adam kernel against optim's scalar
// reference, device and pinned buffers, streams. Every test here needs a
// CUDA device and skips without one (cuda_host_test covers what runs
// everywhere).
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "zero/core/dtype.h"
#include "zero/core/half.h"
#include "zero/cuda/device_adam.h"
#include "zero/cuda/device_lion.h"
#include "zero/cuda/device_buffer.h"
#include "zero/cuda/pinned_buffer.h"
#include "zero/cuda/stream.h"
#include "zero/optim/adam.h"

namespace zero::cuda {
namespace {

template <typename T>
void upload(DeviceBuffer& d, const std::vector<T>& h, void* stream) {
  copy_async(d.data(), h.data(), h.size() * sizeof(T), stream);
}
template <typename T>
void download(std::vector<T>& h, const DeviceBuffer& d, void* stream) {
  copy_async(h.data(), d.data(), h.size() * sizeof(T), stream);
}

// |a - b| <= 1e-6 |b| (exact equality for b == 0), NaN only against NaN.
::testing::AssertionResult close_rel(const std::vector<float>& got, const std::vector<float>& want,
                                     const char* what) {
  std::size_t bad = 0, first = 0, not_bitwise = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float a = got[i], b = want[i];
    if (std::memcmp(&a, &b, sizeof a) != 0) ++not_bitwise;
    const bool ok = (std::isnan(a) && std::isnan(b)) || std::fabs(a - b) <= 1e-6f * std::fabs(b);
    if (!ok && bad++ == 0) first = i;
  }
  // The kernel is written to be bit-identical; say so when it is not.
  if (not_bitwise > 0) {
    std::printf("  %s: %zu of %zu elements differ from the reference in some bit\n", what,
                not_bitwise, want.size());
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << want.size() << " elements off by more than 1e-6 "
         << "relative; first at " << first << ": device " << got[first] << ", reference "
         << want[first];
}

struct AdamCase {
  std::size_t n = 0;
  DType grad_dtype = DType::kFloat32;
  std::optional<DType> half;  // copy-out dtype, if any
  bool decoupled = true;      // AdamW, else Adam (L2)
};

std::string describe(const AdamCase& c) {
  std::ostringstream os;
  os << "n=" << c.n << " grads=" << dtype_name(c.grad_dtype)
     << " half=" << (c.half ? dtype_name(*c.half) : "none") << (c.decoupled ? " AdamW" : " Adam");
  return os.str();
}

// 20 steps of fused_adam_device and of optim::adam_step_reference from the
// same start and the same grads; params, m, v (and the half copy) compared
// after the last step.
void run_adam_case(const AdamCase& c) {
  SCOPED_TRACE(describe(c));
  constexpr int kSteps = 20;
  const std::size_t n = c.n;
  const std::size_t ge = element_size(c.grad_dtype);
  std::mt19937 rng(static_cast<unsigned>(n * 3 + static_cast<unsigned>(c.grad_dtype)));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  std::vector<float> p(n), m(n), v(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = uni(rng);
    m[i] = 0.1f * uni(rng);
    v[i] = 0.01f * std::fabs(uni(rng));
  }
  std::vector<float> rp = p, rm = m, rv = v;
  std::vector<std::uint16_t> rhalf(n), half(n);
  std::vector<unsigned char> g(n * ge);

  CudaStream stream;
  DeviceBuffer dp(n * 4), dm(n * 4), dv(n * 4), dg(n * ge), dhalf(c.half ? n * 2 : 0);
  upload(dp, p, stream.handle());
  upload(dm, m, stream.handle());
  upload(dv, v, stream.handle());

  for (int step = 1; step <= kSteps; ++step) {
    // Grads over several orders of magnitude, and a new lr every step.
    const float scale = std::ldexp(1.0f, (step % 7) - 3);
    for (std::size_t i = 0; i < n; ++i) {
      const float x = scale * normal(rng);
      if (c.grad_dtype == DType::kFloat32) {
        std::memcpy(&g[i * 4], &x, 4);
      } else {
        const std::uint16_t h =
            c.grad_dtype == DType::kBFloat16 ? float_to_bf16(x) : float_to_fp16(x);
        std::memcpy(&g[i * 2], &h, 2);
      }
    }
    optim::AdamHyper h;
    h.lr = 1e-3f * (1.0f + 0.01f * static_cast<float>(step));
    h.weight_decay = 0.01f;
    h.decoupled_weight_decay = c.decoupled;
    h.step = step;
    const float grad_scale = 0.5f;
    const DType half_dtype = c.half.value_or(DType::kBFloat16);

    // The grads buffer is reused: the synchronize below keeps the host from
    // overwriting it while the previous step's kernel may still read it.
    copy_async(dg.data(), g.data(), g.size(), stream.handle());
    fused_adam_device(h, dp.as<float>(), dg.data(), c.grad_dtype, dm.as<float>(), dv.as<float>(),
                      n, grad_scale, c.half ? dhalf.data() : nullptr, half_dtype, stream.handle());
    stream.synchronize();

    optim::AdamBuffers b;
    b.params = rp.data();
    b.grads = g.data();
    b.grad_dtype = c.grad_dtype;
    b.exp_avg = rm.data();
    b.exp_avg_sq = rv.data();
    b.n = n;
    b.grad_scale = grad_scale;
    b.half_out = c.half ? rhalf.data() : nullptr;
    b.half_dtype = half_dtype;
    optim::adam_step_reference(h, b);
  }

  download(p, dp, stream.handle());
  download(m, dm, stream.handle());
  download(v, dv, stream.handle());
  if (c.half) download(half, dhalf, stream.handle());
  stream.synchronize();
  EXPECT_TRUE(close_rel(p, rp, "params"));
  EXPECT_TRUE(close_rel(m, rm, "exp_avg"));
  EXPECT_TRUE(close_rel(v, rv, "exp_avg_sq"));
  if (c.half) {
    // The copy is the device's own params rounded (RNE), bit for bit, and
    // within one half ulp-ish of the reference's copy.
    std::size_t bad_rounding = 0, bad_vs_ref = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t want =
          *c.half == DType::kBFloat16 ? float_to_bf16(p[i]) : float_to_fp16(p[i]);
      if (half[i] != want) ++bad_rounding;
      const float a = *c.half == DType::kBFloat16 ? bf16_to_float(half[i]) : fp16_to_float(half[i]);
      const float r =
          *c.half == DType::kBFloat16 ? bf16_to_float(rhalf[i]) : fp16_to_float(rhalf[i]);
      const float ulp = *c.half == DType::kBFloat16 ? 0x1.0p-7f : 0x1.0p-10f;
      if (!(std::fabs(a - r) <= ulp * std::fabs(r))) ++bad_vs_ref;
    }
    EXPECT_EQ(bad_rounding, 0u) << "half copy is not the device params rounded to nearest even";
    EXPECT_EQ(bad_vs_ref, 0u) << "half copy differs from the reference's by more than one ulp";
  }
}

class FusedAdamDevice : public ::testing::TestWithParam<std::size_t> {};

TEST_P(FusedAdamDevice, MatchesCpuReferenceOver20Steps) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  const std::size_t n = GetParam();
  // Every grad dtype, each with no copy, a bf16 copy and an fp16 copy; AdamW
  // and Adam (L2) alternately.
  int k = 0;
  for (DType g : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (std::optional<DType> half :
         {std::optional<DType>{}, std::optional<DType>{DType::kBFloat16},
          std::optional<DType>{DType::kFloat16}}) {
      run_adam_case({n, g, half, (k++ % 2) == 0});
    }
  }
}

// 1: a grid of one thread; 1000003: a prime, so the last block is partial.
INSTANTIATE_TEST_SUITE_P(Sizes, FusedAdamDevice, ::testing::Values(1u, 1000003u));

// 20 steps of fused_lion_device and of optim::lion_step_reference from the
// same start and grads (a zero among them, so that some c are 0), bit for
// bit: params, m and the half copy.
void run_lion_case(std::size_t n, DType grad_dtype, std::optional<DType> half) {
  SCOPED_TRACE(::testing::Message() << "Lion n=" << n << " grads=" << dtype_name(grad_dtype)
                                    << " half=" << (half ? dtype_name(*half) : "none"));
  const std::size_t ge = element_size(grad_dtype);
  std::mt19937 rng(static_cast<unsigned>(n * 5 + static_cast<unsigned>(grad_dtype)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(n), m(n, 0.0f);
  for (float& x : p) x = normal(rng);
  std::vector<float> rp = p, rm = m;
  std::vector<std::uint16_t> rhalf(n), dhalf_host(n);
  std::vector<unsigned char> g(n * ge);
  CudaStream stream;
  DeviceBuffer dp(n * 4), dm(n * 4), dg(n * ge), dhalf(half ? n * 2 : 0);
  upload(dp, p, stream.handle());
  upload(dm, m, stream.handle());
  for (int step = 1; step <= 20; ++step) {
    for (std::size_t i = 0; i < n; ++i) {
      const float x = i % 13 == 4 ? 0.0f : std::ldexp(normal(rng), step % 5 - 2);
      if (grad_dtype == DType::kFloat32) {
        std::memcpy(&g[i * 4], &x, 4);
      } else {
        const std::uint16_t h = grad_dtype == DType::kBFloat16 ? float_to_bf16(x) : float_to_fp16(x);
        std::memcpy(&g[i * 2], &h, 2);
      }
    }
    optim::LionHyper h;
    h.lr = 1e-4f * (1.0f + 0.01f * static_cast<float>(step));
    h.beta2 = 0.99f;
    h.weight_decay = 0.1f;
    const DType half_dtype = half.value_or(DType::kBFloat16);
    copy_async(dg.data(), g.data(), g.size(), stream.handle());
    fused_lion_device(h, optim::LionBuffers{dp.as<float>(), dg.data(), grad_dtype, dm.as<float>(), n, 0.5f,
                                            half ? dhalf.data() : nullptr, half_dtype},
                      stream.handle());
    stream.synchronize();
    optim::lion_step_reference(h, optim::LionBuffers{rp.data(), g.data(), grad_dtype, rm.data(), n, 0.5f,
                                                     half ? rhalf.data() : nullptr, half_dtype});
  }
  download(p, dp, stream.handle());
  download(m, dm, stream.handle());
  if (half) download(dhalf_host, dhalf, stream.handle());
  stream.synchronize();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != rp[i] || m[i] != rm[i] || (half && dhalf_host[i] != rhalf[i])) {
      if (bad++ < 5) ADD_FAILURE() << "element " << i << ": p " << p[i] << " vs " << rp[i] << ", m " << m[i] << " vs " << rm[i];
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << n << " elements differ from the CPU reference";
}

class FusedLionDevice : public ::testing::TestWithParam<std::size_t> {};

TEST_P(FusedLionDevice, MatchesCpuReferenceBitForBitOver20Steps) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  for (DType g : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (std::optional<DType> half :
         {std::optional<DType>{}, std::optional<DType>{DType::kBFloat16}, std::optional<DType>{DType::kFloat16}}) {
      run_lion_case(GetParam(), g, half);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, FusedLionDevice, ::testing::Values(1u, 1000003u));

TEST(FusedLionDeviceArgs, NonFiniteAndZeroSigns) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  // c = 0.1 g here (m = 0): NaN and inf make their parameter NaN, a zero
  // gradient leaves its parameter where it was (no decay).
  std::vector<float> p{1.0f, 2.0f, 3.0f, 4.0f}, z(4, 0.0f), g{0.5f, NAN, 0.0f, INFINITY};
  DeviceBuffer dp(16), dm(16), dg(16);
  upload(dp, p, nullptr);
  upload(dm, z, nullptr);
  upload(dg, g, nullptr);
  optim::LionHyper h;
  h.lr = 0.25f;
  fused_lion_device(h, optim::LionBuffers{dp.as<float>(), dg.data(), DType::kFloat32, dm.as<float>(), 4}, nullptr);
  download(p, dp, nullptr);
  stream_synchronize(nullptr);
  EXPECT_EQ(p[0], 0.75f);
  EXPECT_TRUE(std::isnan(p[1]));
  EXPECT_EQ(p[2], 3.0f);
  EXPECT_TRUE(std::isnan(p[3]));
}

TEST(FusedAdamDeviceArgs, NonFiniteGradPoisonsOnlyItsElement) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  std::vector<float> p{1.0f, 2.0f, 3.0f}, z(3, 0.0f), g{0.5f, NAN, 0.25f};
  DeviceBuffer dp(12), dm(12), dv(12), dg(12);
  upload(dp, p, nullptr);
  upload(dm, z, nullptr);
  upload(dv, z, nullptr);
  upload(dg, g, nullptr);
  optim::AdamHyper h;
  fused_adam_device(h, dp.as<float>(), dg.data(), DType::kFloat32, dm.as<float>(), dv.as<float>(),
                    3, 1.0f, nullptr, DType::kBFloat16, nullptr);
  download(p, dp, nullptr);
  stream_synchronize(nullptr);
  EXPECT_TRUE(std::isfinite(p[0]));
  EXPECT_TRUE(std::isnan(p[1]));
  EXPECT_TRUE(std::isfinite(p[2]));
}

TEST(PinnedBuffer, RoundTripThroughDevice) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  constexpr std::size_t kBytes = (8u << 20) + 3;  // 8 MiB and an odd tail
  PinnedBuffer src(kBytes), dst(kBytes);
  ASSERT_NE(src.data(), nullptr);
  EXPECT_EQ(src.size(), kBytes);
  auto* s = src.as<unsigned char>();
  for (std::size_t i = 0; i < kBytes; ++i) s[i] = static_cast<unsigned char>(i * 131 + 7);
  std::memset(dst.data(), 0, kBytes);
  DeviceBuffer dev(kBytes);
  CudaStream stream;
  copy_async(dev.data(), src.data(), kBytes, stream.handle());
  copy_async(dst.data(), dev.data(), kBytes, stream.handle());
  stream.synchronize();
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), kBytes), 0);

  PinnedBuffer moved(std::move(src));
  EXPECT_EQ(moved.size(), kBytes);
  EXPECT_EQ(src.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
}

TEST(DeviceBuffer, CopiesFromPageableMemoryAndBack) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICE();
  std::vector<float> h(1000), back(1000, 0.0f);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(i) * 0.5f;
  DeviceBuffer d(h.size() * 4);
  upload(d, h, nullptr);
  download(back, d, nullptr);
  stream_synchronize(nullptr);
  EXPECT_EQ(h, back);
}

}  // namespace
}  // namespace zero::cuda
