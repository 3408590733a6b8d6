// Every compiled SIMD target this CPU supports against the scalar reference:
// sizes around the vector widths, unaligned pointers, every grad dtype, with
// and without the half copy-out, alone and through the thread pool.
#include "zero/optim/adam.h"

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "optim_test_util.h"
#include "zero/core/error.h"
#include "zero/optim/simd_target.h"
#include "zero/optim/thread_pool.h"

namespace zero::optim {
namespace {

using test::GradSpan;
using test::Span;

struct Case {
  std::size_t n = 0;
  DType grad_dtype = DType::kFloat32;
  std::optional<DType> half;  // copy-out dtype, if any
  bool decoupled = true;
  float weight_decay = 0.01f;
  std::size_t offset = 0;  // elements: 1 puts every buffer off vector alignment
  int steps = 100;
};

std::string describe(const Case& c) {
  std::ostringstream os;
  os << "n=" << c.n << " grads=" << dtype_name(c.grad_dtype)
     << " half=" << (c.half ? dtype_name(*c.half) : "none") << (c.decoupled ? " AdamW" : " Adam")
     << " wd=" << c.weight_decay << " offset=" << c.offset << " target=" << active_simd_target();
  return os.str();
}

std::uint16_t round_half(float f, DType t) {
  return t == DType::kBFloat16 ? float_to_bf16(f) : float_to_fp16(f);
}

// Runs c.steps steps on the active target (through `pool`) and on the
// reference from the same start, comparing after every step.
void run_case(const Case& c, ThreadPool* pool) {
  SCOPED_TRACE(describe(c));
  const std::size_t n = c.n;
  std::mt19937 rng(static_cast<unsigned>(n * 7 + c.offset));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  Span<float> p(n, c.offset), m(n, c.offset), v(n, c.offset);
  Span<float> rp(n, c.offset), rm(n, c.offset), rv(n, c.offset);
  Span<std::uint16_t> half(n, c.offset), rhalf(n, c.offset);
  GradSpan g(n, c.grad_dtype, c.offset);
  for (std::size_t i = 0; i < n; ++i) {
    rp[i] = p[i] = uni(rng);
    rm[i] = m[i] = 0.1f * uni(rng);
    rv[i] = v[i] = 0.01f * std::fabs(uni(rng));
  }

  // Drawing a million normals per step would cost the test far more than the
  // kernels: large cases draw from a pool of 4099 (a prime, so that the
  // window moves against every vector width) at a step-dependent shift.
  std::vector<float> pool_values(4099);
  for (float& x : pool_values) x = normal(rng);
  const bool pooled = n > 100000;
  for (int step = 1; step <= c.steps; ++step) {
    // Grads over several orders of magnitude, and a new lr every step.
    const float scale = std::ldexp(1.0f, (step % 7) - 3);
    for (std::size_t i = 0; i < n; ++i) {
      g.set(i, scale * (pooled ? pool_values[(i + 613 * static_cast<std::size_t>(step)) % 4099]
                               : normal(rng)));
    }
    AdamHyper h;
    h.lr = 1e-3f * (1.0f + 0.01f * static_cast<float>(step));
    h.weight_decay = c.weight_decay;
    h.decoupled_weight_decay = c.decoupled;
    h.step = step;

    AdamBuffers b;
    b.params = p.data();
    b.grads = g.data();
    b.grad_dtype = c.grad_dtype;
    b.exp_avg = m.data();
    b.exp_avg_sq = v.data();
    b.n = n;
    b.grad_scale = 0.75f;
    AdamBuffers rb = b;
    rb.params = rp.data();
    rb.exp_avg = rm.data();
    rb.exp_avg_sq = rv.data();
    if (c.half) {
      b.half_out = half.data();
      b.half_dtype = *c.half;
      rb.half_out = rhalf.data();
      rb.half_dtype = *c.half;
    }
    adam_step(h, b, pool);
    adam_step_reference(h, rb);
    // Large cases compare every 10th step: a difference stays in p, m and v,
    // so it is still seen there; comparing costs more than the kernel.
    if (pooled && step % 10 != 0 && step != c.steps) continue;  // (the last step always compared)

    std::size_t bad = test::count_mismatches(p.data(), rp.data(), n, "params") +
                      test::count_mismatches(m.data(), rm.data(), n, "exp_avg") +
                      test::count_mismatches(v.data(), rv.data(), n, "exp_avg_sq");
    if (c.half) {
      for (std::size_t i = 0; i < n; ++i) {
        // The copy is the target's own fp32 result rounded, bit for bit.
        if (half[i] != round_half(p[i], *c.half)) {
          if (bad++ < 5) ADD_FAILURE() << "half[" << i << "]=" << half[i] << " p=" << p[i];
        }
      }
    }
    ASSERT_EQ(bad, 0u) << "at step " << step;
  }
}

class AdamTarget : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { force_simd_target(GetParam()); }
  void TearDown() override { force_simd_target(""); }
};

TEST_P(AdamTarget, MatchesReferenceOnSmallSizes) {
  for (std::size_t n : {0, 1, 7, 15, 16, 17, 100}) {
    for (DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (std::optional<DType> half :
           {std::optional<DType>{}, std::optional{DType::kBFloat16}, std::optional{DType::kFloat16}}) {
        for (std::size_t offset : {0, 1}) {
          for (bool decoupled : {true, false}) {
            Case c{n, gd, half, decoupled, 0.01f, offset, 100};
            run_case(c, nullptr);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST_P(AdamTarget, MatchesReferenceWithoutWeightDecay) {
  for (bool decoupled : {true, false}) {
    Case c{33, DType::kFloat32, std::nullopt, decoupled, 0.0f, 1, 100};
    run_case(c, nullptr);
  }
}

TEST_P(AdamTarget, MatchesReferenceOnAMillionElementsThroughThreads) {
  for (DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (std::optional<DType> half :
         {std::optional<DType>{}, std::optional{DType::kBFloat16}, std::optional{DType::kFloat16}}) {
      ThreadPool pool(3);
      Case c{1000003, gd, half, true, 0.01f, 1, 2};
      run_case(c, &pool);
      if (HasFatalFailure()) return;
    }
  }
}

// The full 100-step trajectory at the large size, once per grad dtype: with
// the copy-out of the same 16-bit type (none for fp32 grads), aligned and
// unaligned buffers, AdamW and Adam (L2).
TEST_P(AdamTarget, HundredStepsOnAMillionElements) {
  ThreadPool pool(2);
  run_case(Case{1000003, DType::kFloat32, std::nullopt, true, 0.01f, 0, 100}, &pool);
  run_case(Case{1000003, DType::kBFloat16, DType::kBFloat16, false, 0.01f, 1, 100}, &pool);
  run_case(Case{1000003, DType::kFloat16, DType::kFloat16, true, 0.01f, 1, 100}, &pool);
}

TEST_P(AdamTarget, SameResultWithOneTwoAndThreeThreads) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (std::size_t n : {std::size_t{1000003}, 3 * kTileElements + 5}) {
      Case c{n, DType::kBFloat16, DType::kBFloat16, true, 0.01f, 1, n > 100000 ? 2 : 10};
      SCOPED_TRACE("threads=" + std::to_string(threads));
      run_case(c, &pool);
      if (HasFatalFailure()) return;
    }
  }
}

// half_out == grads (adam.h's one allowed overlap): each gradient is
// replaced by its updated parameter, and every result is bit for bit what
// separate buffers give, on the tail, across chunks and across threads.
TEST_P(AdamTarget, HalfOutMayBeTheGradsThemselves) {
  ThreadPool pool(3);
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (std::size_t n : {1, 17, 100003, 300001}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n));
      std::mt19937 rng(static_cast<unsigned>(n));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> p1(n), m1(n, 0.0f), v1(n, 0.0f);
      std::vector<std::uint16_t> g1(n), half1(n);
      for (std::size_t i = 0; i < n; ++i) {
        p1[i] = normal(rng);
        g1[i] = round_half(normal(rng), dt);
      }
      std::vector<float> p2 = p1, m2 = m1, v2 = v1;
      std::vector<std::uint16_t> g2 = g1;
      AdamHyper h;
      h.weight_decay = 0.01f;
      for (int step = 1; step <= 3; ++step) {
        h.step = step;
        AdamBuffers separate{p1.data(), g1.data(), dt, m1.data(), v1.data(), n, 0.5f, half1.data(), dt};
        adam_step(h, separate, &pool);
        AdamBuffers in_place{p2.data(), g2.data(), dt, m2.data(), v2.data(), n, 0.5f, g2.data(), dt};
        adam_step(h, in_place, &pool);
        ASSERT_EQ(p1, p2) << "step " << step;
        ASSERT_EQ(m1, m2) << "step " << step;
        ASSERT_EQ(v1, v2) << "step " << step;
        ASSERT_EQ(half1, g2) << "step " << step << ": the grads were not replaced by the updated parameters";
        g2 = g1;  // the next step's gradients, the same for both
      }
    }
  }
}

TEST_P(AdamTarget, NanGradPoisonsOnlyItsOwnElement) {
  for (DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (DType hd : {DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(std::string("grads=") + std::string(dtype_name(gd)) +
                   " half=" + std::string(dtype_name(hd)));
      const std::size_t n = 37;
      const std::size_t kNan = 5, kInf = 20;
      Span<float> p(n, 1), m(n, 1), v(n, 1), rp(n, 1), rm(n, 1), rv(n, 1);
      Span<std::uint16_t> half(n, 1);
      GradSpan g(n, gd, 1);
      for (std::size_t i = 0; i < n; ++i) {
        rp[i] = p[i] = 0.01f * static_cast<float>(i) - 0.2f;
        rm[i] = m[i] = rv[i] = v[i] = 0.0f;
        g.set(i, 0.1f * static_cast<float>(i % 5) - 0.2f);
      }
      g.set(kNan, std::numeric_limits<float>::quiet_NaN());
      g.set(kInf, std::numeric_limits<float>::infinity());
      AdamHyper h;
      h.weight_decay = 0.1f;
      AdamBuffers b{p.data(), g.data(), gd, m.data(), v.data(), n, 1.0f, half.data(), hd};
      AdamBuffers rb{rp.data(), g.data(), gd, rm.data(), rv.data(), n, 1.0f, nullptr, hd};
      adam_step(h, b);
      adam_step_reference(h, rb);
      for (std::size_t i = 0; i < n; ++i) {
        SCOPED_TRACE("element " + std::to_string(i));
        if (i == kNan || i == kInf) {
          EXPECT_TRUE(std::isnan(p[i]));  // inf grad: m/denom = inf/inf
          const float back = hd == DType::kBFloat16 ? bf16_to_float(half[i]) : fp16_to_float(half[i]);
          EXPECT_TRUE(std::isnan(back));
        } else {
          EXPECT_TRUE(std::isfinite(p[i]) && std::isfinite(m[i]) && std::isfinite(v[i]));
          EXPECT_TRUE(test::close(p[i], rp[i]));
          EXPECT_EQ(half[i], round_half(p[i], hd));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EverySupportedTarget, AdamTarget,
                         ::testing::ValuesIn(available_simd_targets()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(Adam, RejectsBadArguments) {
  float x = 0.0f;
  AdamBuffers b{&x, &x, DType::kFloat32, &x, &x, 1};
  AdamHyper h;
  h.step = 0;
  EXPECT_THROW(adam_step(h, b), zero::Error);
  EXPECT_THROW(adam_step_reference(h, b), zero::Error);
  h.step = 1;
  AdamBuffers missing = b;
  missing.exp_avg = nullptr;
  EXPECT_THROW(adam_step(h, missing), zero::Error);
  AdamBuffers fp32_half = b;
  fp32_half.half_out = &x;
  fp32_half.half_dtype = DType::kFloat32;
  EXPECT_THROW(adam_step(h, fp32_half), zero::Error);
  // n = 0 with null buffers is a no-op.
  EXPECT_NO_THROW(adam_step(h, AdamBuffers{}));
}

TEST(Adam, FirstStepMatchesClosedForm) {
  // From m = v = 0, step 1: m = (1-b1) g, v = (1-b2) g^2, and the bias
  // corrections cancel: p -= lr * g / (|g| + eps) ~ lr * sign(g).
  float p[3] = {1.0f, 1.0f, 1.0f}, g[3] = {0.5f, -2.0f, 1e-3f}, m[3] = {}, v[3] = {};
  AdamHyper h;
  h.lr = 0.1f;
  adam_step(h, AdamBuffers{p, g, DType::kFloat32, m, v, 3});
  EXPECT_NEAR(p[0], 0.9f, 1e-6f);
  EXPECT_NEAR(p[1], 1.1f, 1e-6f);
  EXPECT_NEAR(p[2], 0.9f, 1e-5f);
  EXPECT_FLOAT_EQ(m[0], 0.05f);
  EXPECT_EQ(v[1], (1.0f - 0.999f) * 4.0f);  // both products exact
}

TEST(Adam, WithoutBiasCorrectionStepsWithTheRawMoments) {
  // DeepSpeed's bias_correction: false. Two steps from m = v = 0 with the
  // same gradient g: m2 = (1-b1)(1+b1) g, v2 = (1-b2)(1+b2) g^2, and
  // p -= lr * m / (sqrt(v) + eps) each step, nothing divided by 1 - b^t.
  const float g0 = 0.5f, lr = 0.1f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  float p[1] = {1.0f}, g[1] = {g0}, m[1] = {}, v[1] = {};
  AdamHyper h;
  h.lr = lr;
  h.bias_correction = false;
  double want = 1.0, mm = 0.0, vv = 0.0;
  for (int t = 1; t <= 2; ++t) {
    h.step = t;
    adam_step(h, AdamBuffers{p, g, DType::kFloat32, m, v, 1});
    mm = b1 * mm + (1.0 - b1) * g0;
    vv = b2 * vv + (1.0 - b2) * g0 * g0;
    want -= lr * mm / (std::sqrt(vv) + eps);
  }
  EXPECT_NEAR(p[0], want, 1e-6);
  // With the corrections each of these steps moves p by about lr; without,
  // the first by lr * (1-b1)/sqrt(1-b2) = 3.16 lr and the second by
  // lr * 0.19/sqrt(0.001999) = 4.25 lr.
  EXPECT_NEAR(1.0 - want, (3.1623 + 4.2497) * lr, 1e-3);
}

}  // namespace
}  // namespace zero::optim
