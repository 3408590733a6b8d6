// Lion: every supported SIMD target against the scalar reference, bit for
// bit; the sign's edge cases (zero, NaN, inf) element by element.
#include "zero/optim/lion.h"

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
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

void run_case(std::size_t n, DType gd, std::optional<DType> half, float wd, std::size_t offset, int steps,
              ThreadPool* pool) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " grads=" << dtype_name(gd) << " half="
                                    << (half ? dtype_name(*half) : "none") << " wd=" << wd << " offset=" << offset
                                    << " target=" << active_simd_target());
  std::mt19937 rng(static_cast<unsigned>(n + 17));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  Span<float> p(n, offset), m(n, offset), rp(n, offset), rm(n, offset);
  Span<std::uint16_t> h(n, offset), rh(n, offset);
  GradSpan g(n, gd, offset);
  for (std::size_t i = 0; i < n; ++i) {
    rp[i] = p[i] = uni(rng);
    rm[i] = m[i] = i % 7 == 3 ? 0.0f : 0.1f * uni(rng);  // some zero momenta
  }
  std::vector<float> pool_values(4099);  // as in adagrad_test.cpp: large cases draw from a pool
  for (float& x : pool_values) x = uni(rng);
  const bool pooled = n > 100000;
  for (int step = 1; step <= steps; ++step) {
    for (std::size_t i = 0; i < n; ++i) {
      float v = pooled ? pool_values[(i + 613 * static_cast<std::size_t>(step)) % 4099] : uni(rng);
      if (i % 11 == 5) v = 0.0f;  // with a zero momentum: c = 0, sign 0
      g.set(i, v);
    }
    LionHyper hy;
    hy.lr = 1e-3f / static_cast<float>(step);
    hy.beta1 = 0.9f;
    hy.beta2 = 0.99f;
    hy.weight_decay = wd;
    LionBuffers b{p.data(), g.data(), gd, m.data(), n, 0.5f};
    LionBuffers rb{rp.data(), g.data(), gd, rm.data(), n, 0.5f};
    if (half) {
      b.half_out = h.data();
      rb.half_out = rh.data();
      b.half_dtype = rb.half_dtype = *half;
    }
    lion_step(hy, b, pool);
    lion_step_reference(hy, rb);
    if (pooled && step % 10 != 0 && step != steps) continue;  // a difference stays in p and m
    std::size_t bad = test::count_mismatches(p.data(), rp.data(), n, "params", 0.0f) +
                      test::count_mismatches(m.data(), rm.data(), n, "exp_avg", 0.0f);
    if (half) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t want = *half == DType::kBFloat16 ? float_to_bf16(p[i]) : float_to_fp16(p[i]);
        if ((h[i] != want || rh[i] != want) && bad++ < 5) ADD_FAILURE() << "half[" << i << "]";
      }
    }
    ASSERT_EQ(bad, 0u) << "at step " << step;
  }
}

class LionTarget : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { force_simd_target(GetParam()); }
  void TearDown() override { force_simd_target(""); }
};

TEST_P(LionTarget, MatchesReference) {
  for (std::size_t n : {0, 1, 7, 15, 16, 17, 100}) {
    for (DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (std::optional<DType> half :
           {std::optional<DType>{}, std::optional{DType::kBFloat16}, std::optional{DType::kFloat16}}) {
        for (std::size_t offset : {0, 1}) {
          for (float wd : {0.0f, 0.1f}) {
            run_case(n, gd, half, wd, offset, 50, nullptr);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST_P(LionTarget, MatchesReferenceThroughThreads) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    run_case(1000003, DType::kBFloat16, DType::kBFloat16, 0.1f, 1, 2, &pool);
    if (HasFatalFailure()) return;
  }
}

TEST_P(LionTarget, HundredStepsOnAMillionElements) {
  ThreadPool pool(2);
  run_case(1000003, DType::kFloat32, std::nullopt, 0.1f, 0, 100, &pool);
  run_case(1000003, DType::kFloat16, DType::kFloat16, 0.0f, 1, 100, &pool);
}

// Each element on its own: the step is lr against sign(c) (c = 0.5 m +
// 0.5 g here, exact in fp32), none where c is +-0, and a parameter made NaN
// where c is not finite, its neighbours untouched.
TEST_P(LionTarget, SignOfEachElement) {
  const float kNan = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
  struct Element {
    float m, g;
    float want_step;  // p - p_new; NaN: p_new must be NaN
  };
  const std::vector<Element> cases = {
      {0.0f, 1.0f, 0.5f},    {0.0f, -2.0f, -0.5f}, {0.0f, 0.0f, 0.0f},     {-0.0f, -0.0f, 0.0f},
      {1.0f, -1.0f, 0.0f},   {1.0f, -3.0f, -0.5f}, {-1.0f, 0.5f, -0.5f},   {0.0f, 1e-30f, 0.5f},
      {0.0f, kNan, kNan},    {0.0f, kInf, kNan},   {0.0f, -kInf, kNan},    {kInf, 0.0f, kNan},
      {1e-30f, 0.0f, 0.5f},  {-1e-30f, 0.0f, -0.5f}, {2.0f, 3.0f, 0.5f},   {-2.0f, -3.0f, -0.5f},
      {0.5f, 0.25f, 0.5f},   {0.0f, 1.0f, 0.5f},   {-1.0f, 1.0f, 0.0f},
  };
  for (DType gd : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(std::string("grads=") + std::string(dtype_name(gd)));
    const std::size_t n = cases.size();
    Span<float> p(n, 1), m(n, 1), rp(n, 1), rm(n, 1);
    GradSpan g(n, gd, 1);
    for (std::size_t i = 0; i < n; ++i) {
      rp[i] = p[i] = 3.0f;
      rm[i] = m[i] = cases[i].m;
      g.set(i, cases[i].g);
    }
    LionHyper hy;
    hy.lr = 0.5f;
    hy.beta1 = 0.5f;
    lion_step(hy, LionBuffers{p.data(), g.data(), gd, m.data(), n});
    lion_step_reference(hy, LionBuffers{rp.data(), g.data(), gd, rm.data(), n});
    for (std::size_t i = 0; i < n; ++i) {
      SCOPED_TRACE(::testing::Message() << "element " << i << ": m=" << cases[i].m << " g=" << cases[i].g);
      if (std::isnan(cases[i].want_step)) {
        EXPECT_TRUE(std::isnan(p[i])) << p[i];
      } else {
        EXPECT_EQ(3.0f - p[i], cases[i].want_step);
      }
      EXPECT_TRUE(std::isnan(p[i]) ? std::isnan(rp[i]) : p[i] == rp[i]);
    }
  }
}

TEST_P(LionTarget, DecoupledWeightDecay) {
  // Zero gradient and momentum: only the decay moves p, by lr * wd * p.
  const std::size_t n = 21;
  Span<float> p(n, 0), m(n, 0);
  GradSpan g(n, DType::kFloat32, 0);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(i) - 10.0f;
    m[i] = 0.0f;
    g.set(i, 0.0f);
  }
  LionHyper hy;
  hy.lr = 0.1f;
  hy.weight_decay = 0.5f;
  lion_step(hy, LionBuffers{p.data(), g.data(), DType::kFloat32, m.data(), n});
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(p[i], (static_cast<float>(i) - 10.0f) * static_cast<float>(1.0 - 0.1 * 0.5)) << i;
  }
}

// half_out == grads (lion.h's one allowed overlap): in place equals separate
// buffers bit for bit (optim_test_util.h).
TEST_P(LionTarget, HalfOutMayBeTheGradsThemselves) {
  ThreadPool pool(3);
  LionHyper h;
  h.weight_decay = 0.1f;
  test::expect_half_out_may_be_the_grads(0.0f, [&](int, float* p, std::uint16_t* g, DType dt, float* m, std::size_t n,
                                                   std::uint16_t* half) {
    lion_step(h, LionBuffers{p, g, dt, m, n, 0.5f, half, dt}, &pool);
  });
}

INSTANTIATE_TEST_SUITE_P(EverySupportedTarget, LionTarget, ::testing::ValuesIn(available_simd_targets()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(Lion, RejectsBadArguments) {
  float x = 0.0f;
  LionHyper h;
  EXPECT_THROW(lion_step(h, LionBuffers{&x, nullptr, DType::kFloat32, &x, 1}), zero::Error);
  EXPECT_THROW(lion_step(h, LionBuffers{&x, &x, DType::kFloat32, nullptr, 1}), zero::Error);
  std::uint16_t half = 0;
  EXPECT_THROW(lion_step(h, LionBuffers{&x, &x, DType::kFloat32, &x, 1, 1.0f, &half, DType::kFloat32}), zero::Error);
  EXPECT_NO_THROW(lion_step(h, LionBuffers{}));
}

}  // namespace
}  // namespace zero::optim
