// Every config shipped in examples/configs parses without warnings, for
// several world sizes, and survives a to_json round trip.
#include <filesystem>

#include "config_test_util.h"

namespace {

namespace fs = std::filesystem;
using zero::config::Config;
using zero::config::load_config;
using zero::config::parse_config;
using zero::config::to_json;
using zero::config::testing::all_warnings;

fs::path example(const char* name) { return fs::path(ZERO_SOURCE_DIR) / "examples/configs" / name; }

TEST(ExampleConfigs, AllParse) {
  std::size_t count = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(ZERO_SOURCE_DIR) / "examples/configs")) {
    if (entry.path().extension() != ".json") continue;
    ++count;
    for (int world : {1, 2, 4, 8}) {
      SCOPED_TRACE(entry.path().string() + " world " + std::to_string(world));
      Config c = load_config(entry.path(), world);
      EXPECT_TRUE(c.warnings.empty()) << all_warnings(c);
      EXPECT_EQ(c.train_batch_size,
                c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * world);
      Config back = parse_config(to_json(c).dump(), world);
      EXPECT_EQ(back, c);
    }
  }
  EXPECT_GE(count, 5u);
}

TEST(ExampleConfigs, SayWhatTheirNamesSay) {
  EXPECT_EQ(load_config(example("stage0.json"), 2).zero_optimization.stage, 0);
  EXPECT_EQ(load_config(example("stage1.json"), 2).zero_optimization.stage, 1);
  EXPECT_EQ(load_config(example("stage2.json"), 2).zero_optimization.stage, 2);
  const Config muon = load_config(example("stage2_offload_muon.json"), 2);
  EXPECT_EQ(muon.optimizer.type, "Muon");
  EXPECT_EQ(muon.optimizer.adam_lr, 3e-4f);
  EXPECT_EQ(muon.zero_optimization.offload_optimizer.device, "cpu");

  Config off = load_config(example("stage2_offload.json"), 2);
  EXPECT_EQ(off.zero_optimization.stage, 2);
  EXPECT_EQ(off.zero_optimization.offload_optimizer.device, "cpu");
  EXPECT_FALSE(off.zero_optimization.offload_optimizer.delayed_param_update);
  EXPECT_TRUE(off.bf16.enabled);

  Config dpu = load_config(example("stage2_offload_dpu.json"), 2);
  EXPECT_EQ(dpu.zero_optimization.offload_optimizer.device, "cpu");
  EXPECT_TRUE(dpu.zero_optimization.offload_optimizer.delayed_param_update);
  EXPECT_TRUE(dpu.bf16.enabled);

  Config infinity = load_config(example("stage3_infinity.json"), 2);
  EXPECT_EQ(infinity.zero_optimization.stage, 3);
  EXPECT_EQ(infinity.zero_optimization.offload_optimizer.device, "nvme");
  EXPECT_EQ(infinity.zero_optimization.offload_param.device, "nvme");
  EXPECT_FALSE(infinity.zero_optimization.offload_param.nvme_path.empty());
  EXPECT_TRUE(infinity.zero_optimization.offload_optimizer.delayed_param_update);
}

}  // namespace
