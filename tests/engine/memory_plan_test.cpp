// The memory plan's split of an offloaded partition (offload_optimizer.ratio):
// where the host share ends, and that the buffers of each share follow it.
// Muon's plan: which matrices each rank gathers, from where, and its work.
#include "zero/zero/memory_plan.h"

#include "zero/zero/muon_plan.h"

#include <algorithm>
#include <cmath>
#include <vector>
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

// Three matrices in one bucket over two ranks (packed back to front: [4, 10]
// at 0, [6, 10] at 40, [10, 10] at 100; padded to 256, chunks of 128): the
// square one lies across the chunks, 28 elements at the end of rank 0's and
// 72 at the start of rank 1's, so every rank gathers those ends and
// nothing else; the other two are rank 0's own.
TEST(MuonPlan, SharedMatricesAreGatheredFromTheEndsOfTheChunks) {
  const FlatLayout layout({100, 60, 40}, 1000, 2, 2, kPlanAlignElements);
  ASSERT_EQ(layout.buckets().size(), 1u);
  ASSERT_EQ(layout.buckets()[0].chunk, 128u);
  const std::vector<MuonMatrix> m = {muon_matrix(0, {10, 10}), muon_matrix(1, {6, 10}), muon_matrix(2, {4, 10})};
  const auto r0 = plan_muon(layout, 0, m), r1 = plan_muon(layout, 1, m);
  ASSERT_EQ(r0.size(), 1u);
  ASSERT_EQ(r1.size(), 1u);
  for (const auto* p : {&r0[0], &r1[0]}) {  // (the same collectives on both ranks)
    EXPECT_EQ(p->head, 72u);
    EXPECT_EQ(p->tail, 28u);
    EXPECT_EQ(p->gather_ranges(128), (std::vector<std::pair<std::size_t, std::size_t>>{{0, 72}, {100, 128}}));
  }
  EXPECT_EQ(r0[0].shared, std::vector<std::size_t>{0});
  EXPECT_EQ(r0[0].local, (std::vector<std::size_t>{1, 2}));
  EXPECT_EQ(r1[0].shared, std::vector<std::size_t>{0});
  EXPECT_TRUE(r1[0].local.empty());
  // Rank 1 holds elements [0, 72) of the square matrix, at the start of its chunk.
  ASSERT_EQ(r1[0].parts.size(), 1u);
  EXPECT_EQ(r1[0].parts[0].in_param, 28u);
  EXPECT_EQ(r1[0].parts[0].in_chunk, 0u);
  EXPECT_EQ(r1[0].parts[0].n, 72u);

  // Work (fp32 elements): the square matrix whole (100) and its standard
  // iteration (3X + 2n^2 = 500) is the most; while gathering, 100 + one
  // window of 72 sent and two received.
  EXPECT_EQ(muon_window_elements(r0[0], 128, 2, kMuonGatherWindowBytes), 72u);
  EXPECT_EQ(muon_work_elements(layout, r0, m, kMuonGatherWindowBytes, true), 600u);
  EXPECT_EQ(muon_work_elements(layout, r1, m, kMuonGatherWindowBytes, false), 600u);
  // Gram on the wide [6, 10] (X = 60, S = 36): max(3X + 2S, 2X + 5S) = 300.
  EXPECT_EQ(muon_ns_workspace_elements(m[1], true), 300u);
  EXPECT_EQ(muon_ns_workspace_elements(m[1], false), 252u);
  // Small windows: 40 bytes over two ranks is 5 elements each.
  EXPECT_EQ(muon_window_elements(r0[0], 128, 2, 40), 5u);

  // Where the ends meet, the whole chunk is gathered in one range.
  const FlatLayout one({300}, 1000, 2, 2, kPlanAlignElements);
  const auto spans = plan_muon(one, 0, {muon_matrix(0, {30, 10})});
  EXPECT_EQ(spans[0].gather_ranges(one.buckets()[0].chunk),
            (std::vector<std::pair<std::size_t, std::size_t>>{{0, one.buckets()[0].chunk}}));
  // One rank: nothing lies across chunks, nothing is gathered.
  const FlatLayout alone({100, 60, 40}, 1000, 1, 1, kPlanAlignElements);
  const auto solo = plan_muon(alone, 0, m);
  EXPECT_FALSE(solo[0].gathers());
  EXPECT_EQ(solo[0].local.size(), 3u);
}

// The plan counts Muon's work on the device in the optimizer step, not
// beside backward's buckets: the peak is the larger of the two.
TEST(MuonPlan, TheMemoryPlanCountsTheWorkInTheStep) {
  PlanInput in;
  in.numels = {100, 60, 40};
  in.world = 2;
  in.stage = 2;
  in.bucket_numel = 1000;
  const std::int64_t without = plan_memory(in).peak(memory::Tier::kDevice);
  in.muon = {muon_matrix(0, {10, 10}), muon_matrix(1, {6, 10}), muon_matrix(2, {4, 10})};
  const MemoryPlan p = plan_memory(in);
  ASSERT_TRUE(p[Buffer::kMuonWork].present);
  EXPECT_EQ(p[Buffer::kMuonWork].bytes(), 600 * 4);
  EXPECT_EQ(p[Buffer::kMuonWork].lifetime, Lifetime::kStep);
  EXPECT_EQ(p[Buffer::kMuonWork].kind, memory::Kind::kWorkspace);
  const std::int64_t held = p.persistent(memory::Tier::kDevice);
  EXPECT_EQ(p.peak(memory::Tier::kDevice), std::max(without, held + 600 * 4));
}

// Stage 3: the kept buckets (no unit) go out after every unit's, at the end
// of backward, so all of them are budgeted beside the units' three largest.
TEST(MemoryPlan, Stage3BudgetsEveryKeptBucketBesideTheUnitsThreeLargest) {
  PlanInput in;
  in.numels = {300, 20, 300, 20, 300, 20, 300, 20, 5000, 64};
  in.groups = {0, 0, 1, 1, 2, 2, 3, 3, -1, -1};
  in.world = 2;
  in.stage = 3;
  in.bucket_numel = 200;
  in.element_bytes = 4;
  const MemoryPlan p = plan_memory(in);
  std::size_t kept = 0;
  std::vector<std::size_t> units;
  for (const Bucket& b : p.layout.buckets()) {
    if (b.group < 0) {
      kept += b.padded;
    } else {
      units.push_back(b.padded);
    }
  }
  std::sort(units.rbegin(), units.rend());
  ASSERT_GT(units.size(), static_cast<std::size_t>(kPlanLiveBuckets));
  ASSERT_GT(kept, units[0]);
  std::size_t want = kept;
  for (int i = 0; i < kPlanLiveBuckets; ++i) want += units[static_cast<std::size_t>(i)];
  ASSERT_TRUE(p[Buffer::kBuckets].present);
  EXPECT_EQ(p[Buffer::kBuckets].bytes(), static_cast<std::int64_t>(want * 4));
  // Units of frozen parameters only (adapters on a partitioned base): they
  // gather in backward too, so every trainable bucket is kept, all budgeted.
  PlanInput adapters = in;
  adapters.groups.assign(in.numels.size(), -1);
  adapters.frozen_numels = {4000, 4000};
  adapters.frozen_groups = {0, 1};
  const MemoryPlan a = plan_memory(adapters);
  ASSERT_TRUE(has_units(a));
  std::size_t all_kept = 0;
  for (const Bucket& b : a.layout.buckets()) all_kept += b.padded;
  EXPECT_EQ(a[Buffer::kBuckets].bytes(), static_cast<std::int64_t>(all_kept * 4));
  // Without units (stage 2) the three largest of all.
  in.stage = 2;
  in.groups.clear();
  const MemoryPlan q = plan_memory(in);
  std::vector<std::size_t> all;
  for (const Bucket& b : q.layout.buckets()) all.push_back(b.padded);
  std::sort(all.rbegin(), all.rend());
  EXPECT_EQ(q[Buffer::kBuckets].bytes(), static_cast<std::int64_t>((all[0] + all[1] + all[2]) * 4));
}

}  // namespace
}  // namespace zero
