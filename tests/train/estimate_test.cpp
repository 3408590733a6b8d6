// zero-estimate's formulas against the engine's measured ledger (within 5%),
// and the ZeRO paper's worked example.
#include <gtest/gtest.h>
#include <torch/utils.h>

#include "zero/comm/communicator.h"
#include "zero/engine/engine.h"
#include "zero/models/gpt.h"
#include "zero/zero/memory_estimate.h"

namespace zero {
namespace {

TEST(Estimate, PaperExample) {
  // Psi = 7.5B, N = 64, mixed-precision Adam: 120, 31.4 and 16.6 GB per rank.
  EstimateInput in;
  in.params = 7'500'000'000;
  in.world = 64;
  in.bucket_numel = 1;
  const double gb = 1e9;
  in.stage = 0;
  EXPECT_NEAR(estimate_memory(in).device_model_states() / gb, 120.0, 0.05);
  in.stage = 1;
  EXPECT_NEAR(estimate_memory(in).device_model_states() / gb, 31.4, 0.05);
  in.stage = 2;
  EXPECT_NEAR(estimate_memory(in).device_model_states() / gb, 16.6, 0.05);
}

TEST(Estimate, MatchesTheEngineLedger) {
  auto comm = comm::make_communicator();
  const models::GptConfig g = models::gpt_preset("gpt2-tiny");
  for (int stage : {0, 1, 2}) {
    for (bool offload : {false, true}) {
      if (offload && stage == 0) continue;
      for (bool dpu : {false, true}) {
        if (dpu && !offload) continue;
        torch::manual_seed(0);
        auto model = std::make_shared<models::Gpt>(g);
        config::Config cfg;
        cfg.train_micro_batch_size_per_gpu = 1;
        cfg.gradient_accumulation_steps = 1;
        cfg.train_batch_size = comm->world_size();
        cfg.bf16.enabled = true;
        cfg.zero_optimization.stage = stage;
        cfg.zero_optimization.offload_optimizer.device = offload ? "cpu" : "none";
        cfg.zero_optimization.offload_optimizer.delayed_param_update = dpu;
        Engine engine(model, cfg, *comm);
        EstimateInput in;
        in.params = engine.num_parameters();
        EXPECT_EQ(in.params, g.num_parameters());
        in.world = comm->world_size();
        in.stage = stage;
        in.offload = offload;
        in.dpu = dpu;
        const MemoryEstimate e = estimate_memory(in);
        const auto s = engine.ledger().snapshot();
        const double dev = static_cast<double>(s.model_state_bytes(memory::Tier::kDevice));
        const double host = static_cast<double>(s.model_state_bytes(memory::Tier::kHost));
        EXPECT_NEAR(dev, e.device_model_states(), 0.05 * e.device_model_states())
            << "stage " << stage << " offload " << offload;
        EXPECT_NEAR(host, e.host_model_states(), 0.05 * e.host_model_states() + 1)
            << "stage " << stage << " offload " << offload << " dpu " << dpu;
      }
    }
  }
}

}  // namespace
}  // namespace zero
