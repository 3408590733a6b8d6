// The memory plan's split of an offloaded partition (offload_optimizer.ratio):
// where the host share ends, and that the buffers of each share follow it.
#include "zero/zero/memory_plan.h"

#include <cmath>
#include <cstdlib>

#include <gtest/gtest.h>

namespace zero {
namespace {

MemoryPlan offload_plan(std::size_t numel, double ratio) {
  PlanInput in;
  in.numels = {numel};
  in.stage = 2;
  in.offload = true;
  in.offload_ratio = ratio;
  return plan_memory(in);
}

// The split is the multiple of 64 nearest to ratio x partition, or the whole
// partition where that is nearer; the host buffers hold [0, split), the
// device share's the rest.
TEST(MemoryPlan, OffloadSplitIsTheNearestAlignedPointOrTheWholePartition) {
  for (std::size_t numel : {32u, 100u, 1000u, 4096u, 100003u}) {
    for (double ratio : {0.0, 0.01, 0.2, 0.5, 0.7, 0.93, 0.99, 1.0}) {
      const MemoryPlan p = offload_plan(numel, ratio);
      const std::size_t part = p.layout.partition_numel();
      const std::size_t split = p.offload_split;
      const std::string what = "numel " + std::to_string(numel) + " ratio " + std::to_string(ratio);
      ASSERT_LE(split, part) << what;
      EXPECT_TRUE(split % kSplitAlignElements == 0 || split == part) << what;
      // No other candidate is nearer to what was asked.
      const double want = ratio * static_cast<double>(part);
      const double err = std::abs(static_cast<double>(split) - want);
      for (std::size_t c = 0; c <= part; c += kSplitAlignElements) {
        EXPECT_LE(err, std::abs(static_cast<double>(c) - want)) << what << " candidate " << c;
      }
      EXPECT_LE(err, std::abs(static_cast<double>(part) - want)) << what;
      if (ratio == 1.0) {
        EXPECT_EQ(split, part) << what;
      }
      if (ratio == 0.0) {
        EXPECT_EQ(split, 0u) << what;
      }
      auto elements = [&](Buffer b) { return p[b].present ? p[b].elements : 0u; };
      EXPECT_EQ(elements(Buffer::kMaster), split) << what;
      EXPECT_EQ(elements(Buffer::kHostGrads0), split) << what;
      EXPECT_EQ(elements(Buffer::kDevMaster), part - split) << what;
      EXPECT_EQ(elements(Buffer::kDevExpAvgSq), part - split) << what;
    }
  }
  // A partition shorter than one alignment step goes where most of it was asked to.
  const MemoryPlan tiny = offload_plan(32, 0.99);
  EXPECT_EQ(tiny.offload_split, tiny.layout.partition_numel());
  EXPECT_EQ(offload_plan(32, 0.01).offload_split, 0u);
}

}  // namespace
}  // namespace zero
