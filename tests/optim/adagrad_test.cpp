// Adagrad: every supported SIMD target against the scalar reference.
#include "zero/optim/adagrad.h"

#include <cmath>
#include <optional>
#include <random>

#include <gtest/gtest.h>

#include "optim_test_util.h"
#include "zero/core/error.h"
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
  for (int step = 1; step <= steps; ++step) {
    for (std::size_t i = 0; i < n; ++i) g.set(i, uni(rng));
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
        run_case(n, gd, half, 0.01f, 0.0f, 1, 100, nullptr);
        if (HasFatalFailure()) return;
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
