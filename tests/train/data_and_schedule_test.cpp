// The trainer's building blocks: corpus loading and its errors, the
// deterministic split and per-rank sampling, and the LR schedules.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "zero/core/error.h"
#include "zero/data/batch_sampler.h"
#include "zero/data/text_corpus.h"
#include "zero/engine/lr_schedule.h"

namespace zero {
namespace {

namespace fs = std::filesystem;

fs::path write_file(const std::string& name, const std::string& bytes) {
  const fs::path dir = fs::temp_directory_path() / "zero_train_test";
  fs::create_directories(dir);
  const fs::path p = dir / name;
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

std::string text(std::size_t n) {
  std::string s;
  const std::string words = "the quick brown fox jumps over the lazy dog\n";
  while (s.size() < n) s += words;
  return s.substr(0, n);
}

TEST(Corpus, SplitsDeterministicallyAndRoundTripsBytes) {
  std::string t = text(10000);
  t.back() = '\n';  // a document that ends in a newline is kept byte for byte
  const fs::path p = write_file("a.txt", t);
  data::Corpus c = data::load_corpus({p}, 0.1);
  EXPECT_EQ(c.train.size() + c.validation.size(), t.size());
  EXPECT_EQ(c.validation.size(), 1000u);
  EXPECT_EQ(std::string(c.train.begin(), c.train.end()) + std::string(c.validation.begin(), c.validation.end()), t);
  EXPECT_GT(c.unigram_entropy_nats(), 1.0);
  EXPECT_LT(c.unigram_entropy_nats(), std::log(256.0));
}

TEST(Corpus, ErrorsNameTheProblem) {
  auto expect_error = [](const std::vector<fs::path>& paths, const std::string& needle) {
    try {
      data::load_corpus(paths);
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const ::zero::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({"/nonexistent/corpus.txt"}, "does not exist");
  expect_error({write_file("empty.txt", "")}, "empty or too small");
  std::string binary = text(5000);
  binary[100] = '\0';
  expect_error({write_file("bin.dat", binary)}, "looks binary");
  expect_error({}, "no corpus");
}

TEST(Corpus, FolderSkipsBinaryFiles) {
  const fs::path dir = fs::temp_directory_path() / "zero_train_folder";
  fs::create_directories(dir);
  std::ofstream(dir / "a.txt") << text(3000);
  std::string binary(3000, '\0');
  std::ofstream(dir / "a.dat", std::ios::binary) << binary;
  data::Corpus c = data::load_corpus({dir});
  EXPECT_EQ(c.files, 1);
  EXPECT_EQ(c.skipped_binary, 1);
}

TEST(BatchSampler, RanksTileTheGlobalBatchWhateverTheWorldSize) {
  // One rank with micro 8 sees the same sequences as 4 ranks with micro 2.
  data::BatchSampler one(100000, 64, 8, 2, 1, 0, 7);
  for (std::int64_t step : {0, 5}) {
    for (std::int64_t j = 0; j < 2; ++j) {
      std::vector<std::int64_t> all = one.offsets(step, j), split;
      for (int r = 0; r < 4; ++r) {
        data::BatchSampler s(100000, 64, 2, 2, 4, r, 7);
        auto o = s.offsets(step, j);
        // Rank r's micro-batch j holds global indices j*micro*world + r*micro + i.
        split.insert(split.end(), o.begin(), o.end());
      }
      // Same multiset of sequences for the micro-batch pair (j) of the global batch.
      EXPECT_EQ(std::multiset<std::int64_t>(all.begin(), all.end()),
                std::multiset<std::int64_t>(split.begin(), split.end()));
    }
  }
  // Resumable: offsets depend on the step only; different steps differ.
  EXPECT_EQ(one.offsets(3, 1), data::BatchSampler(100000, 64, 8, 2, 1, 0, 7).offsets(3, 1));
  EXPECT_NE(one.offsets(3, 1), one.offsets(4, 1));
  for (auto o : one.offsets(9, 0)) EXPECT_LE(o + 65, 100000);
  EXPECT_THROW(data::BatchSampler(10, 64, 1, 1, 1, 0, 1), ::zero::Error);
}

TEST(LrSchedule, WarmupCosineAndDeepSpeedShapes) {
  config::SchedulerConfig s;
  s.type = "WarmupCosineLR";
  s.warmup_num_steps = 10;
  s.total_num_steps = 110;
  s.warmup_type = "linear";
  s.cos_min_ratio = 0.1f;
  LrSchedule cos(s, 1e-3f);
  EXPECT_FLOAT_EQ(cos.lr(0), 0.0f);
  EXPECT_FLOAT_EQ(cos.lr(5), 0.5e-3f);
  EXPECT_FLOAT_EQ(cos.lr(10), 1e-3f);
  EXPECT_NEAR(cos.lr(60), 1e-3 * (0.1 + 0.9 * 0.5), 1e-9);
  EXPECT_NEAR(cos.lr(110), 1e-4, 1e-9);
  s.type = "WarmupLR";
  s.warmup_type = "log";
  s.warmup_min_lr = 0.0f;
  LrSchedule log_warm(s, 1e-3f);
  EXPECT_NEAR(log_warm.lr(4), 1e-3 * std::log(5.0) / std::log(10.0), 1e-9);
  EXPECT_FLOAT_EQ(log_warm.lr(50), 1e-3f);
  s.type = "WarmupDecayLR";
  s.warmup_type = "linear";
  LrSchedule decay(s, 1e-3f);
  EXPECT_NEAR(decay.lr(60), 0.5e-3, 1e-9);
  EXPECT_NEAR(decay.lr(110), 0.0, 1e-9);
  s.type = "";
  EXPECT_FLOAT_EQ(LrSchedule(s, 2e-3f).lr(1000), 2e-3f);
}

}  // namespace
}  // namespace zero
