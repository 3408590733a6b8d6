// The engine's delayed-update part (src/engine/delayed_update.h) on its own:
// a job that throws reaches the caller on this and every later wait(), and
// what the destructor drops is said on stderr. White-box: the part is
// private to zero_engine, so the test includes its header from src/.
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "../../src/engine/delayed_update.h"

namespace zero::detail {
namespace {

TEST(DelayedUpdate, WarmupStepsAreOrdinary) {
  DelayedUpdate off(false, 0);
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.should_delay(100));
  DelayedUpdate on(true, 3);
  EXPECT_TRUE(on.enabled());
  EXPECT_FALSE(on.should_delay(2));
  EXPECT_TRUE(on.should_delay(3));
}

TEST(DelayedUpdate, LastJobMsIsHowLongTheJobRan) {
  DelayedUpdate d(true, 0);
  EXPECT_EQ(d.last_job_ms(), 0.0);
  d.submit([] { std::this_thread::sleep_for(std::chrono::milliseconds(60)); }, 1);
  d.wait();
  EXPECT_GE(d.last_job_ms(), 55.0);
  EXPECT_LT(d.last_job_ms(), 60000.0);
  d.applied();
  d.submit([] {}, 2);
  d.wait();
  EXPECT_LT(d.last_job_ms(), 55.0) << "the last job's, not the longest";
}

TEST(DelayedUpdate, AFailedJobSticksOnEveryLaterWait) {
  DelayedUpdate d(true, 0);
  d.submit([] { throw std::runtime_error("the CPU step failed"); }, 7);
  EXPECT_TRUE(d.pending());
  for (int i = 0; i < 3; ++i) {
    try {
      d.wait();
      FAIL() << "wait " << i << " returned: the failure must stick";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "the CPU step failed");
    }
    // Nothing half written is published: no update is pending after a failure.
    EXPECT_FALSE(d.pending());
  }
}

// What the job wrote is what the caller reads after wait(), step after step
// (TSan checks the happens-before the worker's hand-off must give).
TEST(DelayedUpdate, JobWritesAreVisibleAfterWait) {
  DelayedUpdate d(true, 0);
  std::vector<float> state(4096, 0.0f);
  for (int step = 1; step <= 200; ++step) {
    d.submit([&state, step] {
      for (float& x : state) x += static_cast<float>(step);
    }, step);
    d.wait();
    ASSERT_EQ(state.front(), static_cast<float>(step * (step + 1) / 2));
    ASSERT_EQ(state.back(), state.front());
    d.applied();
  }
}

// The main thread copies each bucket up as soon as the job has stepped it:
// wait_for(n) must return once n buckets are done (with their writes
// visible), and must not block forever when the job ends short of n.
TEST(DelayedUpdate, ProgressReleasesEachBucketAsItIsDone) {
  DelayedUpdate d(true, 0);
  constexpr int kBuckets = 64;
  std::vector<int> written(kBuckets, 0);
  for (int step = 1; step <= 20; ++step) {
    d.submit([&, step] {
      for (int b = 0; b < kBuckets; ++b) {
        written[static_cast<std::size_t>(b)] = step;
        d.advance();
      }
    }, step);
    for (int b = 0; b < kBuckets; ++b) {
      ASSERT_TRUE(d.wait_for(static_cast<std::size_t>(b) + 1)) << "step " << step << ", bucket " << b;
      ASSERT_EQ(written[static_cast<std::size_t>(b)], step) << "bucket " << b << " released before it was written";
    }
    d.wait();
    d.applied();
  }
}

TEST(DelayedUpdate, ProgressEndsWithAJobThatStopsShort) {
  DelayedUpdate d(true, 0);
  d.submit([&] {
    d.advance();
    d.advance();
    throw std::runtime_error("failed in bucket 2");
  }, 1);
  EXPECT_TRUE(d.wait_for(2));
  EXPECT_FALSE(d.wait_for(3)) << "the job ended after 2 buckets";
  EXPECT_THROW(d.wait(), std::runtime_error);

  DelayedUpdate quiet(true, 0);
  quiet.submit([] {}, 1);  // a job that reports nothing (e.g. no buckets)
  EXPECT_FALSE(quiet.wait_for(1));
  quiet.wait();
  quiet.applied();
  // A new job starts counting from zero.
  quiet.submit([&] { quiet.advance(); }, 2);
  EXPECT_TRUE(quiet.wait_for(1));
  quiet.wait();
  quiet.applied();
}

TEST(DelayedUpdate, DestructorSaysWhatItDropped) {
  testing::internal::CaptureStderr();
  {
    DelayedUpdate d(true, 0);
    std::atomic<bool> ran{false};
    d.submit([&] { ran = true; }, 12);
    d.wait();
    EXPECT_TRUE(ran);
    EXPECT_TRUE(d.pending());  // finished but not applied
  }
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("the update of step 12 was dropped"), std::string::npos) << err;
  EXPECT_NE(err.find("engine.flush()"), std::string::npos) << err;

  testing::internal::CaptureStderr();
  {
    DelayedUpdate d(true, 0);
    d.submit([] { throw std::runtime_error("disk on fire"); }, 3);
  }
  err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("the delayed update failed and was dropped: disk on fire"), std::string::npos) << err;

  testing::internal::CaptureStderr();
  {
    DelayedUpdate d(true, 0);
    d.submit([] {}, 4);
    d.wait();
    d.applied();
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "") << "an applied update is not reported";
}

}  // namespace
}  // namespace zero::detail
