// 100-step trajectories of adam_step / adagrad_step against LibTorch's own
// torch::optim::Adam, AdamW and Adagrad, and of lion_step against Lion in
// LibTorch operations (tests/support/torch_lion.h; LibTorch has no Lion): weight decay on and off, a new lr
// every step (set through param_groups()[0].options(), as a scheduler does),
// grads in every dtype (LibTorch gets the same values widened to fp32).
//
// LibTorch's CPU kernels fuse some multiply-adds (vec::fmadd) where ours round
// each operation, so the two differ by an ulp here and there; the tolerance
// is 1e-6 relative (see max_rel_diff for values that cancel to near zero).
#include <ATen/ATen.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "zero/core/half.h"
#include "zero/optim/adagrad.h"
#include "zero/optim/adam.h"
#include "zero/optim/lion.h"
#include "zero/optim/thread_pool.h"
#include "../support/torch_lion.h"

namespace zero::optim {
namespace {

constexpr std::size_t kN = 1003;  // several vectors plus a tail
constexpr int kSteps = 100;
constexpr double kRel = 1e-6;

// Largest |a - b| / max(|a|, |b|, floor) over the elements, floor =
// floor_fraction times the tensor's largest |b|; NaN on a NaN mismatch. The floor is there because
// LibTorch fuses some multiply-adds (vec::fmadd in add_ with alpha, and
// whatever its compiler contracts) where we round each operation: a one-ulp
// difference in a value of the tensor's scale is ~1e-9 absolute, which is a
// large relative change of an element that has cancelled to near zero
// (seen: 2.7e-6 at |p| = 7e-4). Above 1% of the scale the test is plainly
// relative.
double max_rel_diff(const float* a, const at::Tensor& b_tensor, double floor_fraction = 0.01) {
  const at::Tensor bc = b_tensor.contiguous();
  const float* b = bc.data_ptr<float>();
  float scale = 0.0f;
  for (std::size_t i = 0; i < kN; ++i) {
    if (std::isfinite(b[i])) scale = std::max(scale, std::fabs(b[i]));
  }
  const double floor = floor_fraction * scale;
  double worst = 0.0;
  for (std::size_t i = 0; i < kN; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      if (std::isnan(a[i]) != std::isnan(b[i])) return NAN;
      continue;
    }
    const double diff = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (diff == 0.0) continue;
    const double rel = diff / std::max({static_cast<double>(std::fabs(a[i])),
                                        static_cast<double>(std::fabs(b[i])), floor});
    worst = std::max(worst, rel);
  }
  return worst;
}

// The grads of one step: values as `dtype` can hold them (so ours, reading
// the raw dtype, and LibTorch, reading fp32, see the same numbers).
struct StepGrads {
  std::vector<std::uint16_t> half;
  std::vector<float> full;  // the same values widened, times grad_scale for LibTorch
  std::vector<float> raw32;
};

StepGrads make_grads(std::mt19937& rng, DType dtype, float grad_scale, int step) {
  std::normal_distribution<float> normal(0.0f, std::ldexp(1.0f, step % 5 - 2));
  StepGrads g;
  g.half.resize(kN);
  g.full.resize(kN);
  g.raw32.resize(kN);
  for (std::size_t i = 0; i < kN; ++i) {
    float v = normal(rng);
    if (dtype == DType::kBFloat16) {
      g.half[i] = float_to_bf16(v);
      v = bf16_to_float(g.half[i]);
    } else if (dtype == DType::kFloat16) {
      g.half[i] = float_to_fp16(v);
      v = fp16_to_float(g.half[i]);
    }
    g.raw32[i] = v;
    g.full[i] = v * grad_scale;  // our kernel scales in fp32 the same way
  }
  return g;
}

enum class Kind { kAdam, kAdamW };

void adam_trajectory(Kind kind, float weight_decay, DType grad_dtype, ThreadPool* pool) {
  SCOPED_TRACE(::testing::Message() << (kind == Kind::kAdamW ? "AdamW" : "Adam")
                                    << " wd=" << weight_decay
                                    << " grads=" << dtype_name(grad_dtype));
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> p(kN), m(kN, 0.0f), v(kN, 0.0f);
  for (float& x : p) x = uni(rng);

  at::Tensor tp = at::from_blob(p.data(), {static_cast<long>(kN)}, at::kFloat).clone();
  tp.set_requires_grad(true);
  const float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, grad_scale = 0.5f;
  std::unique_ptr<torch::optim::Optimizer> opt;
  // LibTorch's options are doubles: give it exactly our float values.
  if (kind == Kind::kAdamW) {
    opt = std::make_unique<torch::optim::AdamW>(
        std::vector<at::Tensor>{tp},
        torch::optim::AdamWOptions(1e-3).betas({beta1, beta2}).eps(eps).weight_decay(
            weight_decay));
  } else {
    opt = std::make_unique<torch::optim::Adam>(
        std::vector<at::Tensor>{tp},
        torch::optim::AdamOptions(1e-3).betas({beta1, beta2}).eps(eps).weight_decay(
            weight_decay));
  }

  double worst = 0.0;
  for (int step = 1; step <= kSteps; ++step) {
    const float lr = 1e-3f * (1.0f + 0.5f * std::sin(0.3f * static_cast<float>(step)));
    StepGrads g = make_grads(rng, grad_dtype, grad_scale, step);

    auto& group_options = opt->param_groups()[0].options();
    if (kind == Kind::kAdamW) {
      static_cast<torch::optim::AdamWOptions&>(group_options).lr(lr);
    } else {
      static_cast<torch::optim::AdamOptions&>(group_options).lr(lr);
    }
    tp.mutable_grad() = at::from_blob(g.full.data(), {static_cast<long>(kN)}, at::kFloat).clone();
    opt->step();

    AdamHyper h;
    h.lr = lr;
    h.beta1 = beta1;
    h.beta2 = beta2;
    h.eps = eps;
    h.weight_decay = weight_decay;
    h.decoupled_weight_decay = kind == Kind::kAdamW;
    h.step = step;
    AdamBuffers b;
    b.params = p.data();
    b.grads = grad_dtype == DType::kFloat32 ? static_cast<const void*>(g.raw32.data())
                                            : static_cast<const void*>(g.half.data());
    b.grad_dtype = grad_dtype;
    b.exp_avg = m.data();
    b.exp_avg_sq = v.data();
    b.n = kN;
    b.grad_scale = grad_scale;
    adam_step(h, b, pool);

    const double d = max_rel_diff(p.data(), tp.detach());
    ASSERT_FALSE(std::isnan(d)) << "NaN mismatch at step " << step;
    worst = std::max(worst, d);
    ASSERT_LE(d, kRel) << "params at step " << step;
  }
  // The moments too, at the end (LibTorch keeps them in its state).
  auto& state = opt->state().at(tp.unsafeGetTensorImpl());
  at::Tensor exp_avg, exp_avg_sq;
  if (kind == Kind::kAdamW) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(*state);
    exp_avg = s.exp_avg();
    exp_avg_sq = s.exp_avg_sq();
  } else {
    auto& s = static_cast<torch::optim::AdamParamState&>(*state);
    exp_avg = s.exp_avg();
    exp_avg_sq = s.exp_avg_sq();
  }
  EXPECT_LE(max_rel_diff(v.data(), exp_avg_sq), kRel);
  // m = b1*m + (1-b1)*g is a running sum whose terms cancel every step, and
  // LibTorch fuses that multiply-add: m agrees to 1e-6 of its tensor's scale
  // (its elements near zero differ by a few ulps of that scale).
  EXPECT_LE(max_rel_diff(m.data(), exp_avg, 1.0), kRel);
  ::testing::Test::RecordProperty("max_rel_params_diff", std::to_string(worst));
}

TEST(TorchParity, AdamWMatchesLibTorch) {
  ThreadPool pool(2);
  for (float wd : {0.0f, 0.05f}) {
    for (DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      adam_trajectory(Kind::kAdamW, wd, gd, &pool);
    }
  }
}

TEST(TorchParity, AdamWithL2MatchesLibTorch) {
  for (float wd : {0.0f, 0.05f}) {
    for (DType gd : {DType::kFloat32, DType::kBFloat16}) {
      adam_trajectory(Kind::kAdam, wd, gd, nullptr);
    }
  }
}

TEST(TorchParity, AdagradMatchesLibTorch) {
  for (float wd : {0.0f, 0.05f}) {
    for (float lr_decay : {0.0f, 0.01f}) {
      SCOPED_TRACE(::testing::Message() << "wd=" << wd << " lr_decay=" << lr_decay);
      std::mt19937 rng(7);
      std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
      std::vector<float> p(kN), sum(kN, 0.0f);
      for (float& x : p) x = uni(rng);
      at::Tensor tp = at::from_blob(p.data(), {static_cast<long>(kN)}, at::kFloat).clone();
      tp.set_requires_grad(true);
      const float eps = 1e-10f;
      torch::optim::Adagrad opt(
          std::vector<at::Tensor>{tp},
          torch::optim::AdagradOptions(1e-2).lr_decay(lr_decay).weight_decay(wd).eps(eps));
      for (int step = 1; step <= kSteps; ++step) {
        const float lr = 1e-2f * (1.0f + 0.5f * std::cos(0.2f * static_cast<float>(step)));
        StepGrads g = make_grads(rng, DType::kFloat32, 1.0f, step);
        static_cast<torch::optim::AdagradOptions&>(opt.param_groups()[0].options()).lr(lr);
        tp.mutable_grad() =
            at::from_blob(g.full.data(), {static_cast<long>(kN)}, at::kFloat).clone();
        opt.step();
        AdagradHyper h;
        h.lr = lr;
        h.eps = eps;
        h.weight_decay = wd;
        h.lr_decay = lr_decay;
        h.step = step;
        adagrad_step(h, AdagradBuffers{p.data(), g.raw32.data(), DType::kFloat32, sum.data(), kN});
        ASSERT_LE(max_rel_diff(p.data(), tp.detach()), kRel) << "params at step " << step;
      }
      auto& state =
          static_cast<torch::optim::AdagradParamState&>(*opt.state().at(tp.unsafeGetTensorImpl()));
      EXPECT_LE(max_rel_diff(sum.data(), state.sum()), kRel);
    }
  }
}

// Lion's update is +-lr per element: a parameter equals the reference's
// exactly unless a sign differed (c within an ulp of zero, where LibTorch's
// fused multiply-add and our rounding part ways), which would show as an
// lr-sized difference far above kRel.
TEST(TorchParity, LionMatchesTorchOperations) {
  ThreadPool pool(2);
  for (float wd : {0.0f, 0.5f}) {
    for (DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(::testing::Message() << "wd=" << wd << " grads=" << dtype_name(gd));
      std::mt19937 rng(9);
      std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
      std::vector<float> p(kN), m(kN, 0.0f);
      for (float& x : p) x = uni(rng);
      at::Tensor tp = at::from_blob(p.data(), {static_cast<long>(kN)}, at::kFloat).clone();
      tp.set_requires_grad(true);
      const float beta1 = 0.9f, beta2 = 0.99f, grad_scale = 0.5f;
      test::TorchLion opt(std::vector<at::Tensor>{tp},
                          test::TorchLionOptions(1e-4).beta1(beta1).beta2(beta2).weight_decay(wd));
      for (int step = 1; step <= kSteps; ++step) {
        const float lr = 1e-4f * (1.0f + 0.5f * std::sin(0.3f * static_cast<float>(step)));
        StepGrads g = make_grads(rng, gd, grad_scale, step);
        opt.param_groups()[0].options().set_lr(lr);
        tp.mutable_grad() = at::from_blob(g.full.data(), {static_cast<long>(kN)}, at::kFloat).clone();
        opt.step();
        LionHyper h;
        h.lr = lr;
        h.beta1 = beta1;
        h.beta2 = beta2;
        h.weight_decay = wd;
        LionBuffers b;
        b.params = p.data();
        b.grads = gd == DType::kFloat32 ? static_cast<const void*>(g.raw32.data())
                                        : static_cast<const void*>(g.half.data());
        b.grad_dtype = gd;
        b.exp_avg = m.data();
        b.n = kN;
        b.grad_scale = grad_scale;
        lion_step(h, b, &pool);
        ASSERT_LE(max_rel_diff(p.data(), tp.detach()), kRel) << "params at step " << step;
      }
      auto& state = static_cast<test::TorchLionState&>(*opt.state().at(tp.unsafeGetTensorImpl()));
      // As Adam's m: a running sum whose terms cancel, to 1e-6 of its scale.
      EXPECT_LE(max_rel_diff(m.data(), state.exp_avg(), 1.0), kRel);
    }
  }
}

}  // namespace
}  // namespace zero::optim
