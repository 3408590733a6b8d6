// The trainer's building blocks: corpus loading and its errors, the
// deterministic split and per-rank sampling, and the LR schedules.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <stdlib.h>  // mkdtemp
#include <sys/stat.h>  // mkfifo
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // unlink

#include <gtest/gtest.h>

#include "../support/deepspeed_lr_schedules.h"
#include "zero/ckpt/checkpoint_dir.h"
#include "zero/config/config.h"
#include "zero/core/error.h"
#include "zero/data/batch_sampler.h"
#include "zero/data/byte_tokenizer.h"
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

// A new, empty folder. (Not fs::remove_all: the copy libtorch.so exports
// crashes when a test binary links it.)
fs::path fresh_dir(const std::string& name) {
  std::string tmpl = (fs::temp_directory_path() / (name + "_XXXXXX")).string();
  ZERO_CHECK(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed for ", tmpl);
  return tmpl;
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
  // The bytes as read, not with the newline the corpus adds to a file.
  expect_error({write_file("one.txt", "x")}, "too small (1 bytes of text in 1 file(s))");
  std::string binary = text(5000);
  binary[100] = '\0';
  expect_error({write_file("bin.dat", binary)}, "looks binary");
  expect_error({}, "no corpus");
  // Neither a file nor a folder: refused by kind before a byte is read
  // (/dev/zero would be read until the memory runs out, a FIFO by one rank).
  expect_error({"/dev/zero"}, "/dev/zero\" is a character device, not a file or a folder");
  const fs::path fifo = fs::temp_directory_path() / "zero_train_corpus_fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error({fifo}, "is a pipe (FIFO), not a file or a folder");
  ::unlink(fifo.c_str());
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

// Links in a corpus folder (a dataset cache's snapshot is links to its
// blobs): a link to a file is read, once however many lead to it (and a
// path given twice is read once); links to folders and to nothing are
// counted, not followed.
TEST(Corpus, FolderReadsLinkedFilesOnce) {
  const fs::path dir = fresh_dir("zero_train_links"), blobs = fresh_dir("zero_train_blobs");
  fs::create_directories(dir / "sub");
  std::ofstream(blobs / "b1") << text(3000);
  std::ofstream(blobs / "b2") << text(2000);
  std::ofstream(dir / "own.txt") << text(1000);
  fs::create_symlink(blobs / "b1", dir / "one.txt");
  fs::create_symlink(blobs / "b2", dir / "sub" / "two.txt");
  fs::create_symlink(blobs / "b1", dir / "sub" / "one-again.txt");  // the same blob twice
  fs::create_symlink(blobs, dir / "to-a-folder");                    // not followed
  fs::create_symlink(blobs / "gone", dir / "dangling");              // to nothing
  data::Corpus c = data::load_corpus({dir, dir / "own.txt"});
  EXPECT_EQ(c.files, 3);  // own.txt, b1, b2
  EXPECT_EQ(c.duplicates, 2);  // b1 again, own.txt given again
  EXPECT_EQ(c.skipped_links, 2);
  EXPECT_EQ(c.train.size() + c.validation.size(), 3000u + 2000u + 1000u + 3u);  // (a newline ends each file)
  std::error_code ec;
  ckpt::remove_tree(dir, ec);
  ckpt::remove_tree(blobs, ec);
}

// A file reached twice by hard links is read once too; empty files are
// counted as files (and said); pipes and links to devices in a folder are
// skipped and counted, never read.
TEST(Corpus, FolderCountsWhatItSkips) {
  const fs::path dir = fresh_dir("zero_train_skips");
  std::ofstream(dir / "a.txt") << text(3000);
  ASSERT_EQ(::link((dir / "a.txt").c_str(), (dir / "hard.txt").c_str()), 0);
  std::ofstream(dir / "empty.txt") << "";
  ASSERT_EQ(::mkfifo((dir / "pipe").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", dir / "zeros");
  data::Corpus c = data::load_corpus({dir});
  EXPECT_EQ(c.files, 2);  // a.txt (hard.txt is the same file), empty.txt
  EXPECT_EQ(c.empty_files, 1);
  EXPECT_EQ(c.duplicates, 1);
  EXPECT_EQ(c.skipped_special, 1);
  EXPECT_EQ(c.skipped_links, 1);
  EXPECT_EQ(c.train.size() + c.validation.size(), 3001u);
  std::error_code ec;
  ckpt::remove_tree(dir, ec);
}

// A link loop named directly is not "missing"; a folder inside the corpus
// that cannot be listed is named (as root, tried as user nobody in a child
// process: root lists any folder).
TEST(Corpus, UnreadablePathsAreNamed) {
  const fs::path dir = fresh_dir("zero_train_unreadable");
  fs::create_symlink(dir / "loop_b", dir / "loop_a");
  fs::create_symlink(dir / "loop_a", dir / "loop_b");
  try {
    data::load_corpus({dir / "loop_a"});
    ADD_FAILURE() << "a link loop was read";
  } catch (const ::zero::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be read: Too many levels of symbolic links"), std::string::npos)
        << e.what();
  }
  fs::remove(dir / "loop_a");
  fs::remove(dir / "loop_b");
  fs::create_directories(dir / "open" / "closed");
  std::ofstream(dir / "open" / "a.txt") << text(3000);
  std::ofstream(dir / "open" / "closed" / "b.txt") << text(3000);
  ::chmod((dir / "open" / "closed").c_str(), 0);
  ::chmod(dir.c_str(), 0755);
  ::chmod((dir / "open").c_str(), 0755);
  ::chmod((dir / "open" / "a.txt").c_str(), 0644);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    std::string message = "(read)";
    try {
      data::load_corpus({dir / "open"});
    } catch (const std::exception& e) {
      message = e.what();
    }
    (void)!::write(fds[1], message.data(), message.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string message;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) message.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not become user nobody";
  EXPECT_NE(message.find("cannot list the corpus folder"), std::string::npos) << message;
  EXPECT_NE(message.find("closed"), std::string::npos) << message;
  EXPECT_NE(message.find("check its permissions"), std::string::npos) << message;
  ::chmod((dir / "open" / "closed").c_str(), 0755);
  std::error_code ec;
  ckpt::remove_tree(dir, ec);
}

TEST(ByteTokenizer, Utf8RoundTripsAndSamplingDecodes) {
  // Non-ASCII: two-, three- and four-byte UTF-8 sequences.
  const std::string text = "na\u00efve caf\u00e9 \u2014 \u65e5\u672c\u8a9e \U0001F600\n";
  const std::vector<std::int64_t> ids = data::encode_bytes(text);
  EXPECT_EQ(ids.size(), text.size());  // one token per byte
  for (std::int64_t id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, data::kByteVocabSize);
  }
  EXPECT_EQ(ids[2], 0xC3);  // first byte of U+00EF, as an unsigned token
  EXPECT_EQ(data::decode_bytes(ids), text);
  // Sampling decodes token ids one byte each, whatever it drew: a cut
  // character stays a partial byte sequence, not something else.
  std::vector<std::int64_t> cut(ids.begin(), ids.begin() + 3);
  EXPECT_EQ(data::decode_bytes(cut), text.substr(0, 3));
  std::vector<std::int64_t> all(256);
  for (int i = 0; i < 256; ++i) all[static_cast<std::size_t>(i)] = i;
  EXPECT_EQ(data::encode_bytes(data::decode_bytes(all)), all);
  EXPECT_THROW(data::decode_bytes({65, 256}), ::zero::Error);
  EXPECT_THROW(data::decode_bytes({-1}), ::zero::Error);
  // The corpus keeps UTF-8 bytes as they are.
  std::string long_text;
  while (long_text.size() < 4000) long_text += text;
  data::Corpus c = data::load_corpus({write_file("utf8.txt", long_text)});
  EXPECT_EQ(std::string(c.train.begin(), c.train.end()) + std::string(c.validation.begin(), c.validation.end()),
            long_text);
}

TEST(Corpus, FolderSplitIsDeterministic) {
  const fs::path dir = fresh_dir("zero_train_split");
  fs::create_directories(dir / "sub");
  // Written out of name order; the folder is read sorted, so the bytes do not
  // depend on the directory's listing order.
  std::ofstream(dir / "c.txt") << "third file\n" << text(3000);
  std::ofstream(dir / "a.txt") << "first file\n" << text(2500);
  std::ofstream(dir / "sub" / "b.txt") << "nested file\n" << text(2000);
  const data::Corpus first = data::load_corpus({dir});
  const data::Corpus second = data::load_corpus({dir});
  EXPECT_EQ(first.files, 3);
  EXPECT_EQ(first.train, second.train);
  EXPECT_EQ(first.validation, second.validation);
  const std::string all = std::string(first.train.begin(), first.train.end()) +
                          std::string(first.validation.begin(), first.validation.end());
  EXPECT_LT(all.find("first file"), all.find("third file"));  // a.txt, c.txt, sub/b.txt (path order)
  EXPECT_LT(all.find("third file"), all.find("nested file"));
}

TEST(Corpus, DefaultReadsOnlyTopLevelFortunes) {
  // A folder laid out like /usr/share/games/fortunes with fortunes-off and a
  // translation installed: text files, strfile's .dat index, .u8 symlinks,
  // and subfolders.
  const fs::path dir = fresh_dir("zero_train_fortunes");
  fs::create_directories(dir / "off");
  fs::create_directories(dir / "de");
  std::ofstream(dir / "zippy") << text(2000);
  std::ofstream(dir / "art") << text(2000);
  std::ofstream(dir / "art.dat", std::ios::binary) << std::string(64, '\0');
  fs::create_symlink("art", dir / "art.u8");
  std::ofstream(dir / "off" / "art") << text(2000);
  std::ofstream(dir / "de" / "kinder") << text(2000);
  const std::vector<fs::path> files = data::default_corpus_files(dir);
  EXPECT_EQ(files, (std::vector<fs::path>{dir / "art", dir / "zippy"}));
  EXPECT_EQ(data::load_corpus(files).files, 2);
  // A missing default folder is reported by load_corpus with the fix.
  EXPECT_EQ(data::default_corpus_files("/nonexistent/fortunes"), std::vector<fs::path>{"/nonexistent/fortunes"});
  // The installed package, when present: no index, no symlink, nothing nested.
  for (const fs::path& f : data::default_corpus_files()) {
    EXPECT_NE(f.extension(), ".dat") << f;
    EXPECT_NE(f.extension(), ".u8") << f;
    EXPECT_EQ(f.parent_path(), data::default_corpus_path()) << f;
  }
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

// Expected values from DeepSpeed's deepspeed/runtime/lr_schedules.py,
// worked by hand (k = last_batch_iteration, W = max(2, warmup_num_steps)):
//   warm-up (all three): min + (max-min) * (linear: k/W; log: ln(k+1)/ln W)
//   WarmupDecayLR after: min + (max-min) * max(0, (T-k) / max(1, T-W))
//   WarmupCosineLR after: max * (c + (1-c) * (1 + cos(pi (k-W+1)/(T-W))) / 2)
TEST(LrSchedule, FollowsDeepSpeedsSchedules) {
  config::SchedulerConfig s;
  s.type = "WarmupCosineLR";
  s.warmup_num_steps = 10;
  s.total_num_steps = 110;
  s.warmup_type = "linear";
  s.cos_min_ratio = 0.1f;
  LrSchedule cos(s, 1e-3f);
  EXPECT_FLOAT_EQ(cos.lr(0), 0.0f);
  EXPECT_FLOAT_EQ(cos.lr(5), 0.5e-3f);
  EXPECT_NEAR(cos.lr(10), 1e-3 * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 1 / 100))), 1e-9);
  EXPECT_NEAR(cos.lr(59), 1e-3 * (0.1 + 0.9 * 0.5), 1e-9);  // (59-10+1)/100 = 1/2
  EXPECT_NEAR(cos.lr(109), 1e-4, 1e-9);
  EXPECT_NEAR(cos.lr(500), 1e-4, 1e-9);  // held at the floor past T
  // The probe's case: lr 1e-3, warm-up 2, T 6, ratios 0.1.
  s.warmup_num_steps = 2;
  s.total_num_steps = 6;
  LrSchedule short_cos(s, 1e-3f);
  EXPECT_NEAR(short_cos.lr(2), 1e-3 * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4))), 1e-9);  // 8.68e-4
  EXPECT_NEAR(short_cos.lr(5), 1e-4, 1e-9);

  s.type = "WarmupLR";
  s.warmup_num_steps = 10;
  s.warmup_type = "log";
  s.warmup_min_lr = 0.0f;
  LrSchedule log_warm(s, 1e-3f);
  EXPECT_NEAR(log_warm.lr(4), 1e-3 * std::log(5.0) / std::log(10.0), 1e-9);
  EXPECT_FLOAT_EQ(log_warm.lr(50), 1e-3f);
  // warmup_num_steps 0 and 1 warm up over 2 steps, as in DeepSpeed.
  s.warmup_num_steps = 0;
  s.warmup_min_lr = 1e-4f;
  EXPECT_FLOAT_EQ(LrSchedule(s, 1e-3f).lr(0), 1e-4f);
  EXPECT_FLOAT_EQ(LrSchedule(s, 1e-3f).lr(1), 1e-3f);  // ln 2 / ln 2
  s.warmup_type = "linear";
  s.warmup_num_steps = 1;
  EXPECT_FLOAT_EQ(LrSchedule(s, 1e-3f).lr(1), 1e-4f + 0.9e-3f * 0.5f);

  // WarmupDecayLR ends at warmup_min_lr, not 0: min 1e-4, max 1e-3, W 2, T 4.
  s.type = "WarmupDecayLR";
  s.warmup_num_steps = 2;
  s.total_num_steps = 4;
  s.warmup_max_lr = 1e-3f;
  LrSchedule decay(s, 1e-3f);
  EXPECT_NEAR(decay.lr(2), 1e-3, 1e-9);
  EXPECT_NEAR(decay.lr(3), 5.5e-4, 1e-9);
  EXPECT_NEAR(decay.lr(4), 1e-4, 1e-9);
  EXPECT_NEAR(decay.lr(40), 1e-4, 1e-9);
  s.warmup_min_lr = 0.0f;
  s.warmup_num_steps = 10;
  s.total_num_steps = 110;
  EXPECT_NEAR(LrSchedule(s, 1e-3f).lr(60), 0.5e-3, 1e-9);
  EXPECT_NEAR(LrSchedule(s, 1e-3f).lr(110), 0.0, 1e-9);

  s.type = "";
  EXPECT_FLOAT_EQ(LrSchedule(s, 2e-3f).lr(1000), 2e-3f);
}

// The rate DeepSpeed applies: it steps the scheduler after each optimizer
// step taken, so the step after n others runs at lr(n - 1), and the first at
// the value set when the scheduler was built (lr_schedules.py: WarmupLR's
// get_lr() below iteration 0 is min_lrs; WarmupCosineLR's is 0).
TEST(LrSchedule, AppliedRateIsDeepSpeedsAfterEachStepTaken) {
  config::SchedulerConfig s;
  s.type = "WarmupLR";
  s.warmup_type = "linear";
  s.warmup_num_steps = 4;
  s.warmup_min_lr = 1e-4f;
  s.warmup_max_lr = 1e-2f;
  const LrSchedule warm(s, 1e-2f);
  EXPECT_FLOAT_EQ(warm.applied(0), 1e-4f);
  EXPECT_FLOAT_EQ(warm.applied(1), warm.lr(0));
  EXPECT_FLOAT_EQ(warm.applied(1), 1e-4f);
  EXPECT_FLOAT_EQ(warm.applied(3), 1e-4f + (1e-2f - 1e-4f) * 2.0f / 4.0f);
  EXPECT_FLOAT_EQ(warm.applied(9), 1e-2f);
  s.type = "WarmupDecayLR";
  s.total_num_steps = 20;
  EXPECT_FLOAT_EQ(LrSchedule(s, 1e-2f).applied(0), 1e-4f);
  s.type = "WarmupCosineLR";
  s.warmup_min_lr = 0.0f;
  const LrSchedule cosine(s, 1e-2f);
  EXPECT_EQ(cosine.applied(0), 0.0f);
  EXPECT_FLOAT_EQ(cosine.applied(5), cosine.lr(4));
  s.type = "";
  EXPECT_FLOAT_EQ(LrSchedule(s, 2e-3f).applied(0), 2e-3f);
}

// OneCycle and LRRangeTest, read from the "scheduler" section DeepSpeed
// read: the rate and betas of the step after n taken are DeepSpeed 0.19.8's
// own (tests/support/deepspeed_lr_schedules.h, printed by its
// lr_schedules.py: the cycle rising and falling, in stairs, the decay after
// it, momentum the other way with beta2 0.99, the range test's growth).
TEST(LrSchedule, OneCycleAndRangeTestFollowDeepSpeed) {
  namespace ds = test::deepspeed_schedules;
  const std::pair<const char*, const ds::Case*> cases[] = {{"OneCycle with decay", &ds::kOneCycleDecay},
                                                           {"OneCycle in stairs", &ds::kOneCycleStairs},
                                                           {"OneCycle without momentum", &ds::kOneCycleNoMomentum},
                                                           {"LRRangeTest", &ds::kRangeTest},
                                                           {"LRRangeTest in stairs", &ds::kRangeTestStairs}};
  for (const auto& [name, c] : cases) {
    // The optimizer the reference stepped: torch's Adam, lr 0.123, betas (0.9, 0.999).
    const config::Config cfg = config::parse_config(
        std::string(R"({"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 0.123}}, "scheduler": )") +
            c->scheduler_json + "}",
        1);
    const LrSchedule sched(cfg.scheduler, cfg.optimizer.lr);
    for (std::size_t n = 0; n < c->rows.size(); ++n) {
      const ds::Row& want = c->rows[n];
      const auto taken = static_cast<std::int64_t>(n);
      EXPECT_NEAR(sched.applied(taken), want.lr, 1e-6 * want.lr) << name << ", after " << n << " steps";
      const std::optional<LrSchedule::Betas> b = sched.applied_betas(taken);
      const float beta1 = b ? b->beta1 : cfg.optimizer.beta1, beta2 = b ? b->beta2 : cfg.optimizer.beta2;
      EXPECT_NEAR(beta1, want.beta1, 1e-6) << name << ", after " << n << " steps";
      EXPECT_NEAR(beta2, want.beta2, 1e-6) << name << ", after " << n << " steps";
    }
  }
}

// zero-train prints the schedule it trains with: the numbers of lr().
TEST(LrSchedule, DescribesItselfInWords) {
  config::SchedulerConfig s;
  EXPECT_EQ(LrSchedule(s, 2e-3f).describe(), "constant 0.002");
  s.type = "WarmupCosineLR";
  s.warmup_num_steps = 30;
  s.total_num_steps = 300;
  s.warmup_type = "linear";
  s.cos_min_ratio = 0.1f;
  const LrSchedule cos(s, 3e-3f);
  EXPECT_EQ(cos.describe(), "linear warm-up from 0 to 0.003 over 30 steps, then cosine down to 0.0003 at step 300");
  EXPECT_NEAR(cos.lr(299), 3e-4, 1e-9);
  s.warmup_min_lr = 3e-3f;  // zero-train's --warmup 0 --min-lr-ratio 1
  s.cos_min_ratio = 1.0f;
  EXPECT_EQ(LrSchedule(s, 3e-3f).describe(), "constant 0.003");
  s.warmup_min_lr = 0.0f;  // --warmup 1: DeepSpeed warms up over 2 at least
  s.warmup_num_steps = 1;
  EXPECT_EQ(LrSchedule(s, 3e-3f).describe(),
            "linear warm-up from 0 to 0.003 over 2 steps (DeepSpeed's least), then cosine down to 0.003 at step 300");
  s.warmup_min_lr = 3e-3f;
  s.type = "WarmupLR";
  s.warmup_min_lr = 0.0f;
  s.warmup_num_steps = 1000;
  s.warmup_type = "log";
  EXPECT_EQ(LrSchedule(s, 1e-3f).describe(), "log warm-up from 0 to 0.001 over 1000 steps, then constant");
  s.type = "WarmupDecayLR";
  s.warmup_min_lr = 1e-5f;
  s.total_num_steps = 5000;
  EXPECT_EQ(LrSchedule(s, 1e-3f).describe(),
            "log warm-up from 1e-05 to 0.001 over 1000 steps, then linear decay to 1e-05 at step 5000");
  s = config::SchedulerConfig{};
  s.type = "OneCycle";
  s.one_cycle.cycle_min_lr = 1e-4f;
  s.one_cycle.cycle_max_lr = 1e-3f;
  s.one_cycle.cycle_first_step_size = 100;
  s.one_cycle.cycle_second_step_size = 50;
  s.one_cycle.cycle_second_stair_count = 5;
  EXPECT_EQ(LrSchedule(s, 1e-3f).describe(),
            "one cycle from 0.0001 to 0.001 over 100 steps and back over 50 in 5 stairs, then constant 0.0001; "
            "beta1 from 0.9 to 0.8 and back, beta2 0.99");
  s.one_cycle.cycle_momentum = false;
  s.one_cycle.decay_step_size = 10;
  s.one_cycle.decay_lr_rate = 0.5f;
  EXPECT_EQ(LrSchedule(s, 1e-3f).describe(),
            "one cycle from 0.0001 to 0.001 over 100 steps and back over 50 in 5 stairs, then 0.0001 / (1 + 0.5 per "
            "10 steps)");
  s.type = "LRRangeTest";
  s.range_test.min_lr = 1e-5f;
  s.range_test.step_size = 100;
  s.range_test.step_rate = 2.0f;
  EXPECT_EQ(LrSchedule(s, 1e-3f).describe(), "range test from 1e-05, growing by 2e-05 every 100 steps");
}

}  // namespace
}  // namespace zero
