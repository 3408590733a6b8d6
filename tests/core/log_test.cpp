#include "zero/core/log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Seen {
  zero::LogLevel level;
  std::string topic;
  std::string text;
};

// Installs a sink that keeps what it is given; gives the previous one back.
class Collect {
 public:
  Collect() {
    previous_ = zero::set_log_sink([this](const zero::LogRecord& r) {
      seen.push_back({r.level, std::string(r.topic), std::string(r.text)});
    });
  }
  ~Collect() { zero::set_log_sink(std::move(previous_)); }
  std::vector<Seen> seen;

 private:
  zero::LogSink previous_;
};

TEST(Log, TheSinkGetsLevelTopicAndText) {
  Collect c;
  zero::log(zero::LogLevel::warning, zero::log_topic::checkpoint, "checkpoint x: something");
  zero::detail::log_info(zero::log_topic::engine, "stage %d, %s", 2, "fp32");
  zero::detail::log_warning(zero::log_topic::step, "step %lld skipped", 7LL);
  ASSERT_EQ(c.seen.size(), 3u);
  EXPECT_EQ(c.seen[0].level, zero::LogLevel::warning);
  EXPECT_EQ(c.seen[0].topic, "checkpoint");
  EXPECT_EQ(c.seen[0].text, "checkpoint x: something");
  EXPECT_EQ(c.seen[1].level, zero::LogLevel::info);
  EXPECT_EQ(c.seen[1].topic, "engine");
  EXPECT_EQ(c.seen[1].text, "stage 2, fp32");
  EXPECT_EQ(c.seen[2].level, zero::LogLevel::warning);
  EXPECT_EQ(c.seen[2].topic, "step");
  EXPECT_EQ(c.seen[2].text, "step 7 skipped");
}

TEST(Log, ALeadingProgramNameIsTheDefaultSinksNotTheText) {
  Collect c;
  zero::log(zero::LogLevel::info, zero::log_topic::engine, "zerocpp: stage 3: 4 units");
  ASSERT_EQ(c.seen.size(), 1u);
  EXPECT_EQ(c.seen[0].text, "stage 3: 4 units");
}

TEST(Log, ALongFormattedTextIsWhole) {
  Collect c;
  const std::string long_name(5000, 'w');
  zero::detail::log_warning(zero::log_topic::config, "config warning: %s ends", long_name.c_str());
  ASSERT_EQ(c.seen.size(), 1u);
  EXPECT_EQ(c.seen[0].text, "config warning: " + long_name + " ends");
}

TEST(Log, SettingASinkReturnsThePreviousOne) {
  int first = 0, second = 0;
  zero::LogSink before = zero::set_log_sink([&](const zero::LogRecord&) { ++first; });
  zero::log(zero::LogLevel::info, zero::log_topic::engine, "a");
  zero::LogSink was_first = zero::set_log_sink([&](const zero::LogRecord&) { ++second; });
  zero::log(zero::LogLevel::info, zero::log_topic::engine, "b");
  ASSERT_TRUE(was_first);
  zero::set_log_sink(std::move(was_first));
  zero::log(zero::LogLevel::info, zero::log_topic::engine, "c");
  zero::set_log_sink(std::move(before));
  EXPECT_EQ(first, 2);
  EXPECT_EQ(second, 1);
}

TEST(Log, TheDefaultSinkWritesOneLineToStderr) {
  const zero::LogSink before = zero::set_log_sink(nullptr);
  testing::internal::CaptureStderr();
  zero::detail::log_warning(zero::log_topic::checkpoint, "warning: %s", "other settings");
  const std::string said = testing::internal::GetCapturedStderr();
  zero::set_log_sink(before);
  EXPECT_EQ(said, "zerocpp: warning: other settings\n");
}

TEST(Log, ASinkThatThrowsDoesNotFailTheCaller) {
  const zero::LogSink before = zero::set_log_sink([](const zero::LogRecord&) { throw std::runtime_error("full"); });
  EXPECT_NO_THROW(zero::log(zero::LogLevel::warning, zero::log_topic::comm, "x"));
  EXPECT_NO_THROW(zero::detail::log_info(zero::log_topic::comm, "%d", 1));
  zero::set_log_sink(before);
}

TEST(Log, CallsFromManyThreadsReachTheSinkOneAtATime) {
  int inside = 0, most = 0, calls = 0;
  const zero::LogSink before = zero::set_log_sink([&](const zero::LogRecord&) {
    most = std::max(most, ++inside);
    ++calls;
    std::this_thread::yield();
    --inside;
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 200; ++i) zero::detail::log_info(zero::log_topic::step, "%d", i);
    });
  }
  for (std::thread& t : threads) t.join();
  zero::set_log_sink(before);
  EXPECT_EQ(calls, 800);
  EXPECT_EQ(most, 1);
}

}  // namespace
