// The parity oracle (DESIGN.md "How correctness is known"): stage s, offload
// on/off, N ranks, fp32/bf16 must match the single-process stage-0 run on the
// same global batch. Every rank computes that reference itself, in-process,
// with the single-process communicator.
#include <map>
#include <tuple>

#include <gtest/gtest.h>

#include "train_loop.h"
#include "zero/comm/communicator.h"

namespace zero::test {
namespace {

constexpr int kSteps = 10;
constexpr int kAccumulation = 2;

comm::Communicator& world_comm() {
  static std::unique_ptr<comm::Communicator> c = comm::make_communicator();
  return *c;
}

const RunResult& reference(ModelKind kind, bool bf16) {
  static std::map<std::pair<int, bool>, RunResult> cache;
  auto key = std::make_pair(static_cast<int>(kind), bf16);
  auto it = cache.find(key);
  if (it == cache.end()) {
    auto single = comm::make_single_process_communicator();
    config::Config cfg = make_config(0, false, bf16, 1, kGlobalBatch / kAccumulation, kAccumulation);
    it = cache.emplace(key, train(kind, cfg, *single, kSteps)).first;
  }
  return it->second;
}

using Case = std::tuple<ModelKind, bool /*bf16*/, int /*stage*/, bool /*offload*/>;

class Parity : public testing::TestWithParam<Case> {};

TEST_P(Parity, MatchesSingleProcessStage0) {
  auto [kind, bf16, stage, offload] = GetParam();
  comm::Communicator& comm = world_comm();
  const int world = comm.world_size();
  config::Config cfg =
      make_config(stage, offload, bf16, world, kGlobalBatch / kAccumulation / world, kAccumulation);
  RunResult got = train(kind, cfg, comm, kSteps);
  const RunResult& ref = reference(kind, bf16);

  // fp32: the only difference from the reference is the order of floating
  // point sums (gradients summed over ranks instead of over one batch, the
  // norm summed per partition), i.e. a few ulps per step, well within 1e-5
  // relative; atol (1e-5 = lr / 1000) covers parameters near zero, whose
  // small gradients Adam normalises, so that a rounding difference of the
  // gradient becomes a ~1e-4 relative difference of a 1e-2 step.
  // bf16: gradients are rounded to 8 bits of mantissa before the cross-rank
  // sum (and the sum itself rounds), so gradients differ by up to ~2^-8
  // relative. Adam normalises the update (|update| <= ~lr), so a perturbed
  // gradient changes each step's update by a small fraction of lr, except
  // where m is near zero. Over 10 steps of lr = 1e-2 that bounds the drift by
  // 10 * lr = 0.1 in the worst element, which is what we check, with a mean
  // drift of a tenth of it. (Offload accumulates micro-batch gradients in fp32
  // on the host while the stage-0 reference accumulates them in bf16, so the
  // offload runs sit at the far end of this bound.) The loss, an average,
  // moves much less: 2%.
  const double loss_rtol = bf16 ? 2e-2 : 1e-5;
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], loss_rtol * std::abs(ref.losses[i]) + 1e-7)
        << "loss of step " << i;
  }
  ASSERT_EQ(got.params.size(), ref.params.size());
  for (std::size_t i = 0; i < ref.params.size(); ++i) {
    const at::Tensor diff = (got.params[i] - ref.params[i]).abs();
    if (bf16) {
      EXPECT_LE(diff.max().item<double>(), 0.1) << "parameter " << i;
      EXPECT_LE(diff.mean().item<double>(), 1e-2) << "parameter " << i;
    } else {
      const at::Tensor bound = ref.params[i].abs() * 1e-5 + 1e-5;
      EXPECT_TRUE((diff <= bound).all().item<bool>())
          << "parameter " << i << ": max abs diff " << diff.max().item<double>();
    }
  }
  // The run really trained: the loss fell.
  EXPECT_LT(got.losses.back(), got.losses.front());
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  auto [kind, bf16, stage, offload] = info.param;
  return std::string(kind == ModelKind::kMlp ? "mlp" : "transformer") + (bf16 ? "_bf16" : "_fp32") +
         "_stage" + std::to_string(stage) + (offload ? "_offload" : "");
}

INSTANTIATE_TEST_SUITE_P(
    Stages, Parity,
    testing::Values(
        Case{ModelKind::kMlp, false, 0, false}, Case{ModelKind::kMlp, false, 1, false},
        Case{ModelKind::kMlp, false, 2, false}, Case{ModelKind::kMlp, false, 1, true},
        Case{ModelKind::kMlp, false, 2, true}, Case{ModelKind::kMlp, true, 0, false},
        Case{ModelKind::kMlp, true, 1, false}, Case{ModelKind::kMlp, true, 2, false},
        Case{ModelKind::kMlp, true, 1, true}, Case{ModelKind::kMlp, true, 2, true},
        Case{ModelKind::kTransformer, false, 0, false}, Case{ModelKind::kTransformer, false, 1, false},
        Case{ModelKind::kTransformer, false, 2, false}, Case{ModelKind::kTransformer, false, 1, true},
        Case{ModelKind::kTransformer, false, 2, true}, Case{ModelKind::kTransformer, true, 0, false},
        Case{ModelKind::kTransformer, true, 1, false}, Case{ModelKind::kTransformer, true, 2, false},
        Case{ModelKind::kTransformer, true, 1, true}, Case{ModelKind::kTransformer, true, 2, true}),
    case_name);

}  // namespace
}  // namespace zero::test
