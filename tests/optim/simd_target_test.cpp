#include "zero/optim/simd_target.h"

#include <algorithm>
#include <cstdlib>

#include <gtest/gtest.h>

#include "zero/core/error.h"

namespace zero::optim {
namespace {

TEST(SimdTarget, ListsTargetsAndForcesEach) {
  const std::vector<std::string> targets = available_simd_targets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(active_simd_target(), targets.front());  // the best, unless ZERO_SIMD_TARGET says otherwise
  for (const std::string& t : targets) {
    force_simd_target(t);
    EXPECT_EQ(active_simd_target(), t);
  }
  force_simd_target("");
  EXPECT_EQ(active_simd_target(), targets.front());
}

TEST(SimdTarget, UnknownNameIsAnErrorListingTheValidOnes) {
  const std::string before = active_simd_target();
  try {
    force_simd_target("AVX9000");
    FAIL() << "no error";
  } catch (const zero::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("AVX9000"), std::string::npos) << msg;
    for (const std::string& t : available_simd_targets()) {
      EXPECT_NE(msg.find(t), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(active_simd_target(), before);
}

// ZERO_SIMD_TARGET is read once, at the first kernel call or query, so these
// run in a fresh process (gtest's threadsafe death-test style re-executes the
// binary with only this test) where nothing has resolved the target yet.
TEST(SimdTargetDeathTest, EnvironmentVariableForcesATarget) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string last = available_simd_targets().back();
  setenv("ZERO_SIMD_TARGET", last.c_str(), 1);
  EXPECT_EXIT(std::exit(active_simd_target() == last ? 7 : 1), ::testing::ExitedWithCode(7), "");
  setenv("ZERO_SIMD_TARGET", "NOT_A_TARGET", 1);
  EXPECT_EXIT(
      {
        try {
          active_simd_target();
        } catch (const zero::Error& e) {
          std::exit(std::string(e.what()).find("valid") != std::string::npos ? 8 : 2);
        }
        std::exit(1);
      },
      ::testing::ExitedWithCode(8), "");
  unsetenv("ZERO_SIMD_TARGET");
}

}  // namespace
}  // namespace zero::optim
