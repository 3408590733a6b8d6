// The shard writer and reader (src/ckpt/shard_io.cpp, block_io.cpp): every
// size around the block and alignment boundaries, in each I/O mode, on a
// disk folder and on tmpfs (no O_DIRECT there); what they record against a
// checksum computed here; ranges, sinks, damage, truncation, a full disk.
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "zero/ckpt/checkpoint_dir.h"
#include "zero/ckpt/crc32c.h"
#include "zero/ckpt/shard_io.h"
#include "zero/core/error.h"
#include "zero/core/log.h"

namespace ck = zero::ckpt;
namespace fs = std::filesystem;

namespace {

// A folder of its own under `base`, removed at the end.
struct TempDir {
  fs::path path;
  explicit TempDir(const fs::path& base) {
    path = base / ("zero_shard_io_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    ck::remove_tree(path, ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

std::vector<char> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::vector<char> v(n);
  for (std::size_t i = 0; i < n; i += 8) {
    const std::uint64_t w = gen();
    std::memcpy(v.data() + i, &w, std::min<std::size_t>(8, n - i));
  }
  return v;
}

// The table-driven CRC-32C, bit by bit: a reference beside the library's.
std::uint32_t crc_bitwise(const std::vector<char>& data) {
  std::uint32_t c = ~0u;
  for (char ch : data) {
    c ^= static_cast<unsigned char>(ch);
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

std::vector<char> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}


class ShardIo : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (std::strlen(GetParam()) > 0) {
      setenv("ZERO_CKPT_IO", GetParam(), 1);
    } else {
      unsetenv("ZERO_CKPT_IO");
    }
  }
  void TearDown() override { unsetenv("ZERO_CKPT_IO"); }
};

// Writes `sections` (name → bytes) in pieces of `piece` bytes; checks the
// file and its record; reads it back whole and in ranges.
void round_trip(const fs::path& dir, const std::vector<std::vector<char>>& sections, std::size_t piece) {
  const fs::path file = dir / "shard.bin";
  ck::FileRecord rec;
  {
    ck::ShardWriter w(file);
    for (std::size_t i = 0; i < sections.size(); ++i) {
      w.begin_section("s" + std::to_string(i), "u8");
      const std::vector<char>& s = sections[i];
      for (std::size_t off = 0; off < s.size(); off += piece) w.write(s.data() + off, std::min(piece, s.size() - off));
      w.end_section();
    }
    rec = w.finish(3);
  }
  std::vector<char> all;
  for (const auto& s : sections) all.insert(all.end(), s.begin(), s.end());
  ASSERT_EQ(fs::file_size(file), all.size());
  EXPECT_EQ(rec.bytes, all.size());
  EXPECT_EQ(rec.rank, 3);
  EXPECT_EQ(read_all(file), all);
  // (crc32c itself is checked against the bitwise reference below.)
  EXPECT_EQ(rec.crc32c, all.size() < 100000 ? crc_bitwise(all) : ck::crc32c(0, all.data(), all.size()));
  ASSERT_EQ(rec.sections.size(), sections.size());
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < sections.size(); ++i) {
    EXPECT_EQ(rec.sections[i].offset, offset);
    EXPECT_EQ(rec.sections[i].bytes, sections[i].size());
    offset += sections[i].size();
  }
  // Whole sections, and ranges across the block boundaries, in any order.
  std::vector<std::vector<char>> got(sections.size());
  std::vector<ck::ReadRange> ranges;
  for (std::size_t i = sections.size(); i-- > 0;) {
    got[i].assign(sections[i].size(), 0);
    ranges.push_back({rec.sections[i].offset, rec.sections[i].bytes, got[i].data()});
  }
  std::mt19937 gen(7);
  std::vector<std::vector<char>> pieces;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> where;
  for (int k = 0; k < 8 && !all.empty(); ++k) {
    const std::uint64_t a = gen() % all.size(), n = 1 + gen() % std::min<std::uint64_t>(all.size() - a, 3 * ck::kIoBlock);
    where.emplace_back(a, n);
  }
  where.emplace_back(0, all.size());
  pieces.reserve(where.size());
  for (const auto& [a, n] : where) {
    pieces.emplace_back(n, 0);
    ranges.push_back({a, n, pieces.back().data()});
  }
  ck::read_file(file, rec, ranges);
  for (std::size_t i = 0; i < sections.size(); ++i) EXPECT_EQ(got[i], sections[i]) << "section " << i;
  for (std::size_t k = 0; k < where.size(); ++k) {
    EXPECT_TRUE(std::equal(pieces[k].begin(), pieces[k].end(), all.begin() + static_cast<std::ptrdiff_t>(where[k].first)))
        << "range " << k << " at " << where[k].first;
  }
  // Through a sink, without the checksum: the same bytes, in order.
  if (!all.empty()) {
    std::vector<char> sunk;
    ck::read_file(file, rec, {{0, all.size(), nullptr}}, /*verify=*/false,
                  [&](std::size_t r, std::uint64_t off, const void* data, std::size_t n) {
                    EXPECT_EQ(r, 0u);
                    EXPECT_EQ(off, sunk.size());
                    sunk.insert(sunk.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
                  });
    EXPECT_EQ(sunk, all);
  }
  fs::remove(file);
}

TEST(Crc32c, KnownValueAndIncremental) {
  const char* check = "123456789";
  EXPECT_EQ(ck::crc32c(0, check, 9), 0xE3069283u);
  const std::vector<char> data = random_bytes(100003, 1);
  const std::uint32_t whole = ck::crc32c(0, data.data(), data.size());
  EXPECT_EQ(whole, crc_bitwise(data));
  for (std::size_t cut : {0, 1, 7, 8, 9, 4096, 100002}) {
    EXPECT_EQ(ck::crc32c(ck::crc32c(0, data.data(), cut), data.data() + cut, data.size() - cut), whole) << cut;
  }
}

TEST_P(ShardIo, SizesAroundTheBlocksRoundTrip) {
  TempDir dir(fs::temp_directory_path());
  const std::size_t B = ck::kIoBlock;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{4097}, B - 1, B,
                        B + 1, ck::kIoRing * B + 12345}) {
    SCOPED_TRACE(n);
    round_trip(dir.path, {random_bytes(n, static_cast<unsigned>(n))}, std::size_t{1} << 20);
  }
  // Many sections of odd sizes, written in odd pieces: the ring wraps
  // several times.
  std::vector<std::vector<char>> sections;
  for (int i = 0; i < 7; ++i) sections.push_back(random_bytes(B + 333 * static_cast<std::size_t>(i) * 1001, 10u + static_cast<unsigned>(i)));
  sections.push_back(random_bytes(5, 99));
  round_trip(dir.path, sections, 777777);
}

// tmpfs has no O_DIRECT: the same files through the page cache.
TEST_P(ShardIo, TmpfsWithoutDirectIo) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  TempDir dir("/dev/shm");
  round_trip(dir.path, {random_bytes(ck::kIoBlock + 4097, 3), random_bytes(12, 4)}, std::size_t{1} << 20);
}

TEST_P(ShardIo, DamageTruncationAndMissingFilesAreNamed) {
  TempDir dir(fs::temp_directory_path());
  const fs::path file = dir.path / "shard.bin";
  const std::vector<char> data = random_bytes(2 * ck::kIoBlock + 100, 5);
  ck::FileRecord rec;
  {
    ck::ShardWriter w(file);
    w.begin_section("a", "u8");
    w.write(data.data(), data.size());
    w.end_section();
    rec = w.finish(0);
  }
  std::vector<char> out(data.size());
  const auto expect_error = [&](const std::string& needle) {
    try {
      ck::read_file(file, rec, {{0, out.size(), out.data()}});
      ADD_FAILURE() << "no error (expected " << needle << ")";
    } catch (const zero::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
    }
  };
  {  // a bit flipped in the last block
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(data.size() - 3));
    const char b = static_cast<char>(data[data.size() - 3] ^ 0x04);
    f.write(&b, 1);
  }
  expect_error("is damaged: its CRC-32C");
  fs::resize_file(file, data.size() - 1);
  expect_error("truncated");
  EXPECT_THROW(ck::check_file(file, rec), zero::Error);
  fs::remove(file);
  expect_error("a shard is missing");
  EXPECT_THROW(ck::check_file(file, rec), zero::Error);
}

// A full disk mid-file (the file size limit stands in: write() fails with
// EFBIG as it fails with ENOSPC): an error that names the file, from
// write() or finish(), never a file that looks whole.
TEST_P(ShardIo, AFullDiskIsAnError) {
  TempDir dir(fs::temp_directory_path());
  const fs::path file = dir.path / "shard.bin";
  const std::vector<char> data = random_bytes(3 * ck::kIoBlock, 6);
  struct rlimit old {};
  getrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = ck::kIoBlock + 4096;
  setrlimit(RLIMIT_FSIZE, &lim);
  try {
    ck::ShardWriter w(file);
    w.begin_section("a", "u8");
    w.write(data.data(), data.size());
    w.end_section();
    (void)w.finish(0);
    ADD_FAILURE() << "a write past the file size limit did not fail";
  } catch (const zero::Error& e) {
    EXPECT_NE(std::string(e.what()).find("writing checkpoint file " + file.string() + " failed after"),
              std::string::npos) << e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
}

// A value that is neither mode (a typo, another case) is said once, with
// the two values, and the default used: the files are the same.
TEST(ShardIoMode, AnUnknownValueIsSaidOnceAndTheDefaultUsed) {
  std::vector<std::string> said;
  const zero::LogSink before = zero::set_log_sink([&](const zero::LogRecord& r) {
    if (r.level == zero::LogLevel::warning) said.emplace_back(r.text);
  });
  setenv("ZERO_CKPT_IO", "Buffered", 1);
  TempDir dir(fs::temp_directory_path());
  round_trip(dir.path, {random_bytes(100000, 5)}, 4096);
  round_trip(dir.path, {random_bytes(5000, 6)}, 4096);
  unsetenv("ZERO_CKPT_IO");
  zero::set_log_sink(before);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("ZERO_CKPT_IO=Buffered is not 'direct' or 'buffered'"), std::string::npos) << said[0];
}

INSTANTIATE_TEST_SUITE_P(Modes, ShardIo, ::testing::Values("", "direct", "buffered"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::strlen(info.param) ? std::string(info.param) : std::string("default");
                         });

}  // namespace
