// Adagrad: every supported SIMD target against the scalar reference.
#include "zero/optim/adagrad.h"

#include <cmath>
#include <limits>
#include <string>
#include <optional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "optim_test_util.h"
#include "zero/core/error.h"
#include "zero/core/half.h"
#include "zero/optim/simd_target.h"
#include "zero/optim/thread_pool.h"

namespace zero::optim {
namespace {

using test::GradSpan;
using test::Span;

void run_case(std::size_t n, DType gd, std::optional<DType> half, float wd, float lr_decay,
              std::size_t offset, int steps, ThreadPool* pool) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " grads=" << dtype_name(gd) << " half="
                                    << (half ? dtype_name(*half) : "none") << " wd=" << wd
                                    << " lr_decay=" << lr_decay << " offset=" << offset
                                    << " target=" << active_simd_target());
  std::mt19937 rng(static_cast<unsigned>(n + 11));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  Span<float> p(n, offset), s(n, offset), rp(n, offset), rs(n, offset);
  Span<std::uint16_t> h(n, offset), rh(n, offset);
  GradSpan g(n, gd, offset);
  for (std::size_t i = 0; i < n; ++i) {
    rp[i] = p[i] = uni(rng);
    rs[i] = s[i] = 0.1f * std::fabs(uni(rng));
  }
  // Large cases draw from a pool of 4099 values (a prime) at a step-dependent
  // shift: a million fresh draws per step would cost more than the kernels.
  std::vector<float> pool_values(4099);
  for (float& x : pool_values) x = uni(rng);
  const bool pooled = n > 100000;
  for (int step = 1; step <= steps; ++step) {
    for (std::size_t i = 0; i < n; ++i) {
      g.set(i, pooled ? pool_values[(i + 613 * static_cast<std::size_t>(step)) % 4099] : uni(rng));
    }
    AdagradHyper hy;
    hy.lr = 1e-2f / static_cast<float>(step);
    hy.weight_decay = wd;
    hy.lr_decay = lr_decay;
    hy.step = step;
    AdagradBuffers b{p.data(), g.data(), gd, s.data(), n, 0.5f};
    AdagradBuffers rb{rp.data(), g.data(), gd, rs.data(), n, 0.5f};
    if (half) {
      b.half_out = h.data();
      rb.half_out = rh.data();
      b.half_dtype = rb.half_dtype = *half;
    }
    adagrad_step(hy, b, pool);
    adagrad_step_reference(hy, rb);
    if (pooled && step % 10 != 0 && step != steps) continue;  // a difference stays in p and sum
    std::size_t bad = test::count_mismatches(p.data(), rp.data(), n, "params") +
                      test::count_mismatches(s.data(), rs.data(), n, "state_sum");
    if (half) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t want =
            *half == DType::kBFloat16 ? float_to_bf16(p[i]) : float_to_fp16(p[i]);
        if (h[i] != want && bad++ < 5) ADD_FAILURE() << "half[" << i << "]";
      }
    }
    ASSERT_EQ(bad, 0u) << "at step " << step;
  }
}

class AdagradTarget : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { force_simd_target(GetParam()); }
  void TearDown() override { force_simd_target(""); }
};

TEST_P(AdagradTarget, MatchesReference) {
  for (std::size_t n : {0, 1, 7, 15, 16, 17, 100}) {
    for (DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (std::optional<DType> half :
           {std::optional<DType>{}, std::optional{DType::kBFloat16}, std::optional{DType::kFloat16}}) {
        for (std::size_t offset : {0, 1}) {
          run_case(n, gd, half, 0.01f, 0.0f, offset, 100, nullptr);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  run_case(33, DType::kFloat32, std::nullopt, 0.0f, 0.1f, 0, 100, nullptr);
}

TEST_P(AdagradTarget, MatchesReferenceThroughThreads) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    run_case(1000003, DType::kBFloat16, DType::kBFloat16, 0.01f, 0.01f, 1, 2, &pool);
    if (HasFatalFailure()) return;
  }
}

TEST_P(AdagradTarget, HundredStepsOnAMillionElements) {
  ThreadPool pool(2);
  run_case(1000003, DType::kFloat32, std::nullopt, 0.01f, 0.0f, 0, 100, &pool);
  run_case(1000003, DType::kBFloat16, DType::kBFloat16, 0.0f, 0.01f, 1, 100, &pool);
  run_case(1000003, DType::kFloat16, DType::kFloat16, 0.01f, 0.0f, 1, 100, &pool);
}

TEST_P(AdagradTarget, NanGradPoisonsOnlyItsOwnElement) {
  for (DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (DType hd : {DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(std::string("grads=") + std::string(dtype_name(gd)) +
                   " half=" + std::string(dtype_name(hd)));
      const std::size_t n = 37, kNan = 5, kInf = 20;
      Span<float> p(n, 1), s(n, 1), rp(n, 1), rs(n, 1);
      Span<std::uint16_t> half(n, 1);
      GradSpan g(n, gd, 1);
      for (std::size_t i = 0; i < n; ++i) {
        rp[i] = p[i] = 0.01f * static_cast<float>(i) - 0.2f;
        rs[i] = s[i] = 0.0f;
        g.set(i, 0.1f * static_cast<float>(i % 5) - 0.2f);
      }
      g.set(kNan, std::numeric_limits<float>::quiet_NaN());
      g.set(kInf, std::numeric_limits<float>::infinity());
      AdagradHyper hy;
      hy.weight_decay = 0.1f;
      adagrad_step(hy, AdagradBuffers{p.data(), g.data(), gd, s.data(), n, 1.0f, half.data(), hd});
      adagrad_step_reference(hy, AdagradBuffers{rp.data(), g.data(), gd, rs.data(), n, 1.0f});
      for (std::size_t i = 0; i < n; ++i) {
        SCOPED_TRACE("element " + std::to_string(i));
        const float back = hd == DType::kBFloat16 ? bf16_to_float(half[i]) : fp16_to_float(half[i]);
        if (i == kNan || i == kInf) {
          EXPECT_TRUE(std::isnan(p[i]));  // inf grad: inf / (sqrt(inf) + eps) = inf/inf
          EXPECT_TRUE(std::isnan(back));
        } else {
          EXPECT_TRUE(std::isfinite(p[i]) && std::isfinite(s[i]));
          EXPECT_TRUE(test::close(p[i], rp[i]));
          EXPECT_EQ(half[i], hd == DType::kBFloat16 ? float_to_bf16(p[i]) : float_to_fp16(p[i]));
        }
      }
    }
  }
}

// half_out == grads (adagrad.h's one allowed overlap): in place equals separate
// buffers bit for bit (optim_test_util.h).
TEST_P(AdagradTarget, HalfOutMayBeTheGradsThemselves) {
  ThreadPool pool(3);
  AdagradHyper h;
  h.weight_decay = 0.01f;
  test::expect_half_out_may_be_the_grads(0.1f, [&](int step, float* p, std::uint16_t* g, DType dt, float* sum,
                                                   std::size_t n, std::uint16_t* half) {
    h.step = step;
    adagrad_step(h, AdagradBuffers{p, g, dt, sum, n, 0.5f, half, dt}, &pool);
  });
}

INSTANTIATE_TEST_SUITE_P(EverySupportedTarget, AdagradTarget,
                         ::testing::ValuesIn(available_simd_targets()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(Adagrad, RejectsBadArguments) {
  float x = 0.0f;
  AdagradHyper h;
  h.step = 0;
  EXPECT_THROW(adagrad_step(h, AdagradBuffers{&x, &x, DType::kFloat32, &x, 1}), zero::Error);
  h.step = 1;
  EXPECT_THROW(adagrad_step(h, AdagradBuffers{&x, nullptr, DType::kFloat32, &x, 1}), zero::Error);
  EXPECT_NO_THROW(adagrad_step(h, AdagradBuffers{}));
}

}  // namespace
}  // namespace zero::optim
