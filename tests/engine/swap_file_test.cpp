// The NVMe tier's swap file (zero/offload/swap_file.h) on its own: what is
// written reads back, block by block over several I/O threads, with reads
// and writes in flight together; misuse and bad folders are named; the file
// is unlinked at once (its space is the process's until it ends), never
// opened through a link, and its lock file refuses a second user. And the
// byte ranges at any position that checkpoints stream through it
// (zero/offload/swap_stream.h), against a copy of the file in memory.
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "zero/core/error.h"
#include "zero/offload/swap_file.h"
#include "zero/offload/swap_stream.h"

namespace zero::offload {
namespace {
namespace fs = std::filesystem;

struct AlignedBuffer {
  explicit AlignedBuffer(std::size_t bytes)
      : data(static_cast<char*>(std::aligned_alloc(SwapFile::kAlign, bytes))), size(bytes) {}
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data;
  std::size_t size;
};

fs::path temp_dir(const std::string& what) {
  const fs::path d = fs::temp_directory_path() / ("zero_swap_" + what + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SwapFile, WhatIsWrittenReadsBackAcrossThreadsAndBlocks) {
  const fs::path dir = temp_dir("roundtrip");
  constexpr std::size_t kSlot = 5 * SwapFile::kAlign, kSlots = 24;
  {
    SwapFile f(dir / "state.swap", kSlot * kSlots, SwapFile::Options{3, 2 * SwapFile::kAlign});
    EXPECT_EQ(f.size(), kSlot * kSlots);
    // Unlinked already: nothing to leave behind, whatever ends the process.
    EXPECT_FALSE(fs::exists(dir / "state.swap"));
    EXPECT_TRUE(fs::exists(dir / "state.swap.lock"));
    // Every slot its own pattern, written from two buffers in turn, with
    // reads of earlier slots in flight beside the writes.
    std::vector<std::unique_ptr<AlignedBuffer>> out;
    std::vector<SwapFile::Ticket> writes;
    for (std::size_t s = 0; s < kSlots; ++s) {
      out.push_back(std::make_unique<AlignedBuffer>(kSlot));
      for (std::size_t i = 0; i < kSlot; ++i) out.back()->data[i] = static_cast<char>((s * 131 + i * 7) % 251);
      writes.push_back(f.write(s * kSlot, out.back()->data, kSlot));
    }
    for (SwapFile::Ticket t : writes) f.wait(t);
    AlignedBuffer in0(kSlot), in1(kSlot);
    for (std::size_t s = 0; s + 1 < kSlots; s += 2) {
      std::memset(in0.data, 0, kSlot);
      std::memset(in1.data, 0, kSlot);
      const SwapFile::Ticket a = f.read(s * kSlot, in0.data, kSlot), b = f.read((s + 1) * kSlot, in1.data, kSlot);
      f.wait(b);
      f.wait(a);
      EXPECT_EQ(std::memcmp(in0.data, out[s]->data, kSlot), 0) << "slot " << s;
      EXPECT_EQ(std::memcmp(in1.data, out[s + 1]->data, kSlot), 0) << "slot " << s + 1;
    }
    // A ticket is waited for once.
    EXPECT_NE(error_of([&] { f.wait(writes.front()); }).find("unknown or was waited for already"), std::string::npos);
    f.wait_all();
  }
  EXPECT_FALSE(fs::exists(dir / "state.swap.lock"));  // removed with the SwapFile
  fs::remove_all(dir);
}

// A read the drive cannot answer (here: the unlinked file cut short through
// /proc/self/fd, as a failing drive returns less) names the file and what
// it holds: the optimizer state by default, the parameters where the owner
// says so.
TEST(SwapFile, AFailedReadNamesWhatTheFileHolds) {
  const fs::path dir = temp_dir("failed_read");
  for (const char* contents : {"", "this rank's partition of the parameters"}) {
    SwapFile::Options o;
    if (*contents) o.contents = contents;
    SwapFile f(dir / "state.swap", 4 * SwapFile::kAlign, o);
    AlignedBuffer buf(SwapFile::kAlign);
    std::memset(buf.data, 7, SwapFile::kAlign);
    f.wait(f.write(0, buf.data, SwapFile::kAlign));
    int cut = 0;
    for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const std::string target = fs::read_symlink(e.path(), ec).string();
      if (!ec && target.find("state.swap") != std::string::npos && target.find(".lock") == std::string::npos) {
        cut += ::ftruncate(std::stoi(e.path().filename().string()), 0) == 0;
      }
    }
    ASSERT_EQ(cut, 1) << "the swap file's descriptor";
    const std::string e = error_of([&] { f.wait(f.read(2 * SwapFile::kAlign, buf.data, SwapFile::kAlign)); });
    EXPECT_NE(e.find("state.swap': reading 4096 bytes at offset 8192 failed: the file ends early"), std::string::npos)
        << e;
    EXPECT_NE(e.find(std::string("What the file holds there (") + (*contents ? contents : "the optimizer state") +
                     ") is lost"), std::string::npos) << e;
  }
  fs::remove_all(dir);
}

// Ranges at any offset and of any length, written one after another (some
// continuing the last one, some crossing many blocks, some inside one) through
// one or two buffers smaller than many of them: the file ends as the copy in
// memory that took the same writes, the bytes around each range kept; and
// read_span() reads any range back.
TEST(SwapStream, RangesAtAnyOffsetKeepTheBytesAroundThem) {
  const fs::path dir = temp_dir("stream");
  constexpr std::size_t kBytes = 40 * SwapFile::kAlign, kBuffer = 3 * SwapFile::kAlign;
  for (const int buffers : {1, 2}) {
    SCOPED_TRACE(std::to_string(buffers) + " buffer(s)");
    SwapFile f(dir / "stream.swap", kBytes, SwapFile::Options{2, 2 * SwapFile::kAlign});
    std::vector<char> want(kBytes);
    std::mt19937 rng(42 + buffers);
    for (char& c : want) c = static_cast<char>(rng());
    {
      AlignedBuffer all(kBytes);
      std::memcpy(all.data, want.data(), kBytes);
      f.wait(f.write(0, all.data, kBytes));
    }
    AlignedBuffer a(kBuffer), b(kBuffer);
    SwapStreamWriter writer(f, {a.data, buffers == 2 ? b.data : nullptr}, kBuffer);
    AlignedBuffer got(kBytes);
    // The file against the copy (after finish(): every write done).
    auto check = [&](int round) {
      writer.finish();
      f.wait(f.read(0, got.data, kBytes));
      std::size_t differ = 0;
      for (std::size_t i = 0; i < kBytes; ++i) differ += got.data[i] != want[i];
      EXPECT_EQ(differ, 0u) << "bytes of the file differ from the writes after round " << round;
    };
    std::size_t next = 0;
    for (int round = 0; round < 400; ++round) {
      // A third of the ranges continue the last one (gathered into its
      // request), a third begin a little after it (a new request begun in
      // the last one's final block, taken from its buffer), a third anywhere.
      const bool follows = (round % 3 == 1 || round % 97 == 1) && next < kBytes;
      const std::size_t gap = 1 + rng() % 64;
      const bool near = !follows && round % 3 == 2 && next + gap < kBytes;
      const std::size_t pos = follows ? next : near ? next + gap : rng() % kBytes;
      const std::size_t len = 1 + rng() % std::min<std::size_t>(kBytes - pos, round % 5 == 0 ? 9 * SwapFile::kAlign : 700);
      std::vector<char> src(len);
      for (char& c : src) c = static_cast<char>(rng());
      std::size_t done = 0;
      while (done < len) done += writer.write(pos + done, src.data() + done, len - done);
      std::memcpy(want.data() + pos, src.data(), len);
      next = pos + len;
      if (round % 97 == 0) {
        // Used again after finish(), its buffers used for other things
        // meanwhile (and the next range continues this one).
        check(round);
        std::memset(a.data, 0x5a, kBuffer);
        std::memset(b.data, 0xa5, kBuffer);
      } else if (round % 97 == 1) {
        check(round);
      }
    }
    check(400);
    for (int round = 0; round < 100; ++round) {
      const std::size_t pos = rng() % kBytes, len = 1 + rng() % (kBytes - pos);
      const auto [from, took] = read_span(f, pos, len, a.data, kBuffer);
      ASSERT_GE(took, 1u);
      ASSERT_LE(took, len);
      EXPECT_EQ(std::memcmp(from, want.data() + pos, took), 0) << "read_span(" << pos << ", " << len << ")";
      if (took < len) {
        EXPECT_GT(pos % SwapFile::kAlign + took, kBuffer - SwapFile::kAlign) << "read less than the buffer holds";
      }
    }
  }
  fs::remove_all(dir);
}

TEST(SwapFile, MisalignedAndOutOfRangeRequestsAreRefused) {
  const fs::path dir = temp_dir("misuse");
  SwapFile f(dir / "s.swap", 4 * SwapFile::kAlign);
  AlignedBuffer buf(2 * SwapFile::kAlign);
  EXPECT_NE(error_of([&] { f.read(100, buf.data, SwapFile::kAlign); }).find("not aligned"), std::string::npos);
  EXPECT_NE(error_of([&] { f.read(0, buf.data + 8, SwapFile::kAlign); }).find("not aligned"), std::string::npos);
  EXPECT_NE(error_of([&] { f.write(0, buf.data, 100); }).find("not aligned"), std::string::npos);
  EXPECT_NE(error_of([&] { f.write(3 * SwapFile::kAlign, buf.data, 2 * SwapFile::kAlign); }).find("past the end"),
            std::string::npos);
  EXPECT_NE(error_of([] { SwapFile g("/tmp/x.swap", 100); }).find("multiple of 4096"), std::string::npos);
  fs::remove_all(dir);
}

TEST(SwapFile, BadFoldersAndASecondUserAreNamed) {
  const fs::path dir = temp_dir("folders");
  const std::string missing = error_of([&] { SwapFile f(dir / "no" / "such" / "s.swap", SwapFile::kAlign); });
  EXPECT_NE(missing.find("is not a folder that exists"), std::string::npos) << missing;
  EXPECT_NE(missing.find("mkdir -p " + (dir / "no" / "such").string()), std::string::npos) << missing;
  { std::FILE* f = std::fopen((dir / "afile").c_str(), "w"); std::fclose(f); }
  const std::string file = error_of([&] { SwapFile f(dir / "afile" / "s.swap", SwapFile::kAlign); });
  EXPECT_NE(file.find("is a file, not a folder"), std::string::npos) << file;
  const std::string tilde = error_of([&] { SwapFile f("~/no_such_zero_dir/s.swap", SwapFile::kAlign); });
  EXPECT_NE(tilde.find("does not expand '~'"), std::string::npos) << tilde;
  {
    SwapFile first(dir / "s.swap", 2 * SwapFile::kAlign);
    AlignedBuffer buf(SwapFile::kAlign);
    std::memset(buf.data, 7, SwapFile::kAlign);
    first.wait(first.write(SwapFile::kAlign, buf.data, SwapFile::kAlign));
    const std::string taken = error_of([&] { SwapFile second(dir / "s.swap", 2 * SwapFile::kAlign); });
    EXPECT_NE(taken.find("in use by another running process or engine"), std::string::npos) << taken;
    // The refused one touched neither the first one's file nor its lock.
    ASSERT_TRUE(fs::exists(dir / "s.swap.lock"));
    std::memset(buf.data, 0, SwapFile::kAlign);
    first.wait(first.read(SwapFile::kAlign, buf.data, SwapFile::kAlign));
    EXPECT_EQ(buf.data[0], 7);
    EXPECT_EQ(buf.data[SwapFile::kAlign - 1], 7);
  }
  // A file (and a lock) left by a job of an older build that died is replaced.
  { std::FILE* f = std::fopen((dir / "left.swap").c_str(), "w"); std::fputs("old", f); std::fclose(f); }
  { std::FILE* f = std::fopen((dir / "left.swap.lock").c_str(), "w"); std::fclose(f); }
  {
    SwapFile again(dir / "left.swap", SwapFile::kAlign);
    EXPECT_FALSE(fs::exists(dir / "left.swap"));
  }
  EXPECT_FALSE(fs::exists(dir / "left.swap.lock"));
  // A link in the swap file's place is removed, never written through; one
  // in the lock's place is refused.
  { std::FILE* f = std::fopen((dir / "precious").c_str(), "w"); std::fputs("precious data", f); std::fclose(f); }
  fs::create_symlink(dir / "precious", dir / "linked.swap");
  { SwapFile linked(dir / "linked.swap", 4 * SwapFile::kAlign); }
  EXPECT_EQ(fs::file_size(dir / "precious"), std::strlen("precious data"));
  EXPECT_FALSE(fs::is_symlink(dir / "linked.swap"));
  fs::create_symlink(dir / "precious", dir / "lock_linked.swap.lock");
  const std::string link = error_of([&] { SwapFile f(dir / "lock_linked.swap", SwapFile::kAlign); });
  EXPECT_NE(link.find("symbolic link"), std::string::npos) << link;
  EXPECT_EQ(fs::file_size(dir / "precious"), std::strlen("precious data"));
  fs::remove_all(dir);
}

TEST(SwapFile, NoRoomIsAnErrorAtConstruction) {
  const fs::path dir = temp_dir("room");
  struct rlimit old {};
  getrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 64 * 1024;
  setrlimit(RLIMIT_FSIZE, &lim);
  const std::string e = error_of([&] { SwapFile f(dir / "big.swap", 1 << 20); });
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_NE(e.find("cannot allocate 1048576 bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("free"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir / "big.swap"));  // nothing left behind
  EXPECT_FALSE(fs::exists(dir / "big.swap.lock"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zero::offload
