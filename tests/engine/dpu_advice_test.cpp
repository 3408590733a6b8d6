// When the delayed update's CPU step is the bound (src/engine/dpu_advice.h):
// the note and the offload_optimizer.ratio it names, from the H200's own
// timing (docs/PERFORMANCE.md) and cases around it. Built from the part's
// source alone (no LibTorch).
#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "../../src/engine/dpu_advice.h"

namespace zero::detail {
namespace {

TEST(DpuAdvice, TheH200sStepNamesTheRatioThatFitsTheCpuStepInForwardAndBackward) {
  // 4.54B, ZeRO-2 + offload + DPU: a step of 889 ms; forward and backward
  // end on the device at 492 ms, the CPU step of 890 ms 398 ms later:
  // 492 / 890 = 0.553.
  const DpuTiming t{889.0, 398.0, 890.0, 1.0};
  ASSERT_TRUE(dpu_ratio_to_fit(t).has_value());
  EXPECT_DOUBLE_EQ(*dpu_ratio_to_fit(t), 0.55);
  const auto note = dpu_bound_note(t);
  ASSERT_TRUE(note.has_value());
  EXPECT_NE(note->find("CPU optimizer step (890 ms) outlasts forward and backward (492 ms)"), std::string::npos) << *note;
  EXPECT_NE(note->find("each step waits 398 ms (45%)"), std::string::npos) << *note;
  EXPECT_NE(note->find("offload_optimizer.ratio 0.55 (now 1.00)"), std::string::npos) << *note;
  EXPECT_NE(note->find("--offload-ratio 0.55"), std::string::npos) << *note;
}

TEST(DpuAdvice, AShareAlreadyOnTheDeviceScalesFromIt) {
  // The CPU steps 70% in 600 ms; forward and backward take 500: 0.7 * 500 / 600 = 0.583.
  const DpuTiming t{666.0, 100.0, 600.0, 0.7};
  EXPECT_DOUBLE_EQ(dpu_ratio_to_fit(t).value_or(-1), 0.55);
  const auto note = dpu_bound_note(t);
  ASSERT_TRUE(note.has_value());
  EXPECT_NE(note->find("offload_optimizer.ratio 0.55 (now 0.70)"), std::string::npos) << *note;
}

TEST(DpuAdvice, NothingWhenTheCpuStepIsHidden) {
  EXPECT_FALSE(dpu_bound_note({600.0, 59.0, 500.0, 1.0}).has_value()) << "a wait under a tenth of the step";
  EXPECT_FALSE(dpu_bound_note({600.0, 0.0, 500.0, 1.0}).has_value());
  // A wait longer than the CPU step: not the CPU step's (a device share
  // would not shorten it).
  EXPECT_FALSE(dpu_bound_note({1000.0, 600.0, 500.0, 1.0}).has_value());
  // The CPU step of 500 ms ends 200 ms after forward and backward (300 ms):
  // the bound; 0.6 of the state on the CPU would fit.
  EXPECT_DOUBLE_EQ(dpu_ratio_to_fit({1000.0, 200.0, 500.0, 1.0}).value_or(-1), 0.6);
}

TEST(DpuAdvice, TheRatioStaysWithinAZeroExclusiveShare) {
  // Forward and backward of 10 ms against a CPU step of a second: 0.01, at least 0.05.
  EXPECT_DOUBLE_EQ(dpu_ratio_to_fit({1000.0, 990.0, 1000.0, 1.0}).value_or(-1), 0.05);
  EXPECT_DOUBLE_EQ(dpu_ratio_to_fit({1000.0, 1000.0, 1000.0, 1.0}).value_or(-1), 0.05);
}

TEST(DpuAdvice, TimingThatSaysNothingGivesNothing) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(dpu_ratio_to_fit({0.0, 0.0, 0.0, 1.0}).has_value());
  EXPECT_FALSE(dpu_ratio_to_fit({889.0, 397.0, 0.0, 1.0}).has_value()) << "no CPU step timed";
  EXPECT_FALSE(dpu_ratio_to_fit({nan, 397.0, 890.0, 1.0}).has_value());
  EXPECT_FALSE(dpu_ratio_to_fit({889.0, nan, 890.0, 1.0}).has_value());
  EXPECT_FALSE(dpu_ratio_to_fit({889.0, 397.0, 890.0, 0.0}).has_value());
}

}  // namespace
}  // namespace zero::detail
