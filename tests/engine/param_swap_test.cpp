// ParamSwap (the parameters' NVMe tier, src/engine/param_swap.h) on its own:
// chunks written and read back through fewer buffers than chunks, the reads
// following the last pass's order, a queued copy out of a buffer waited for
// before the buffer is written again, a publish that failed part-way
// dropped, passes of gathers with no publish (evaluation) followed too, and
// the partition's bytes streamed from and to the file (checkpoints).
// ParamSwap is private to zero_engine, so the test includes its header from src/.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <filesystem>
#include <thread>
#include <string>
#include <vector>

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <gtest/gtest.h>

#include "../../src/engine/param_swap.h"
#include "zero/zero/flat_layout.h"
#include "zero/zero/memory_plan.h"

namespace zero::detail {
namespace {

namespace fs = std::filesystem;

// Five parameters of five units: five buckets of different sizes.
struct Fixture {
  FlatLayout layout{{1000, 3000, 500, 2000, 700}, 1 << 20, 1, 1, kPlanAlignElements, {0, 1, 2, 3, 4}};
  fs::path dir = fs::temp_directory_path() / ("zero_param_swap_test_" + std::to_string(::getpid()));
  std::unique_ptr<ParamSwap> swap;

  explicit Fixture(std::size_t count) {
    fs::create_directories(dir);
    std::size_t largest = 0;
    for (const Bucket& b : layout.buckets()) largest = std::max(largest, param_region_bytes(b, 4));
    at::Tensor slots = at::empty({static_cast<std::int64_t>(count * largest + kSwapAlignBytes)}, at::kByte);
    swap = std::make_unique<ParamSwap>(layout, at::kFloat, slots, dir / "params.swap", offload::SwapFile::Options{});
  }
  ~Fixture() {
    swap.reset();
    fs::remove_all(dir);
  }
  int buckets() const { return static_cast<int>(layout.buckets().size()); }
  // Bucket b's chunk as version v of the parameters.
  at::Tensor values(int b, int v) const {
    const auto n = static_cast<std::int64_t>(layout.buckets()[static_cast<std::size_t>(b)].chunk);
    return at::arange(n, at::kFloat).add_(100000.0 * b + 0.5 * v);
  }
  void write_all(int v) {
    for (int b = 0; b < buckets(); ++b) swap->write(b, 0, values(b, v));
    swap->flush();
  }
  // Every bucket gathered in `order`, each checked against version v.
  void gather(const std::vector<int>& order, int v) {
    for (int b : order) {
      EXPECT_TRUE(swap->chunk(b).equal(values(b, v))) << "bucket " << b;
      swap->done_with(b);
    }
  }
};

TEST(ParamSwap, ChunksComeBackAsWrittenThroughFewerBuffers) {
  Fixture f(2);
  ASSERT_EQ(f.buckets(), 5);
  f.write_all(0);
  f.gather({0, 1, 2, 3, 4, 4, 3, 2, 1, 0}, 0);
  f.write_all(1);
  f.gather({4, 2, 0, 1, 3}, 1);
  EXPECT_TRUE(f.swap->read_copy(3).equal(f.values(3, 1)));
  // A chunk written in pieces, in any order.
  const at::Tensor v2 = f.values(1, 2);
  const std::int64_t half = v2.numel() / 2;
  f.swap->write(1, static_cast<std::size_t>(half), v2.narrow(0, half, v2.numel() - half));
  f.swap->write(1, 0, v2.narrow(0, 0, half));
  f.swap->flush();
  EXPECT_TRUE(f.swap->read_copy(1).equal(v2));
}

TEST(ParamSwap, ReadsAheadInTheLastPassOrder) {
  Fixture f(3);
  f.write_all(0);
  const std::vector<int> order = {0, 1, 2, 3, 4, 4, 3, 2, 1, 0};
  f.gather(order, 0);
  f.swap->flush();  // the pass ends (a publish with nothing to write)
  (void)f.swap->take_counters();
  f.gather(order, 0);
  const ParamSwap::Counters c = f.swap->take_counters();
  EXPECT_GT(c.read_ahead, 0u);
  EXPECT_LE(c.read_ahead, c.reads);
  // Reads are fewer than gathers: a chunk used again soon is still held.
  EXPECT_LT(c.reads, order.size());
}

// A gather whose chunk was read ahead and is there waits for nothing: only
// reads not done yet count as waits.
TEST(ParamSwap, ReadsDoneAheadAreNotWaitedFor) {
  Fixture f(3);
  f.write_all(0);
  const std::vector<int> order = {0, 1, 2, 3, 4};
  f.gather(order, 0);
  f.swap->flush();
  (void)f.swap->take_counters();
  for (int b : order) {
    EXPECT_TRUE(f.swap->chunk(b).equal(f.values(b, 0))) << "bucket " << b;
    f.swap->done_with(b);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the reads ahead finish meanwhile
  }
  const ParamSwap::Counters c = f.swap->take_counters();
  EXPECT_GT(c.read_ahead, 0u);
  EXPECT_LT(c.waited, c.reads) << "reads done ahead were counted as waits";
}

TEST(ParamSwap, GathersWithNoPublishFollowTheirOwnOrder) {
  Fixture f(2);
  f.write_all(0);
  const std::vector<int> order = {0, 1, 2, 3, 4};
  f.gather(order, 0);
  (void)f.swap->take_counters();
  // Evaluation: forward only, no step. A pass ends after a bound (8 gathers
  // per bucket and 256); the reads then follow it.
  for (int pass = 0; pass < 80; ++pass) f.gather(order, 0);
  EXPECT_GT(f.swap->take_counters().read_ahead, 0u);
}

TEST(ParamSwap, AQueuedCopyOutOfABufferIsWaitedForBeforeItIsReused) {
  Fixture f(2);
  f.write_all(0);
  int waits = 0;
  bool copied = false;
  at::Tensor src = f.swap->chunk(0);
  const at::Tensor expected = f.values(0, 0);
  // The copy runs only when waited for, as the deferred gather lane's does.
  at::Tensor dst = at::empty_like(src);
  f.swap->done_with(0, [&] {
    ++waits;
    dst.copy_(src);
    copied = true;
  });
  f.gather({1, 2, 3, 4}, 0);  // the buffer of bucket 0 is taken for others
  EXPECT_EQ(waits, 1);
  ASSERT_TRUE(copied);
  EXPECT_TRUE(dst.equal(expected));
}

TEST(ParamSwap, APublishThatFailedPartWayIsDropped) {
  Fixture f(2);
  f.write_all(0);
  // Part of bucket 3's new chunk, then the publish fails.
  f.swap->write(3, 0, f.values(3, 1).narrow(0, 0, 96));
  // A gather or a checkpoint reads the file's chunk, as before the publish.
  EXPECT_TRUE(f.swap->read_copy(3).equal(f.values(3, 0)));
  f.swap->write(3, 0, f.values(3, 1).narrow(0, 0, 96));
  f.gather({3}, 0);
  // A load (every chunk whole) or the next publish writes it anew.
  f.swap->write(3, 0, f.values(3, 1).narrow(0, 0, 96));
  f.swap->discard_partial();
  f.write_all(2);
  f.gather({0, 1, 2, 3, 4}, 2);
}

// A checkpoint streams the partition's bytes: ranges at any byte, across
// chunks, read back as written, and a chunk a buffer held before a load is
// gathered as the load wrote it (the buffers are emptied, not stale).
TEST(ParamSwap, PartitionBytesStreamFromAndToTheFile) {
  Fixture f(2);
  f.write_all(0);
  f.gather({0, 1}, 0);  // (buffers now hold chunks 0 and 1)
  std::vector<char> want;
  for (int b = 0; b < f.buckets(); ++b) {
    const at::Tensor v = f.values(b, 0);
    const char* p = static_cast<const char*>(v.data_ptr());
    want.insert(want.end(), p, p + v.nbytes());
  }
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    const std::size_t pos = rng() % want.size(), len = 1 + rng() % std::min<std::size_t>(want.size() - pos, 9000);
    std::vector<char> src(len);
    for (char& c : src) c = static_cast<char>(rng());
    f.swap->write_bytes(pos, src.data(), len);
    std::memcpy(want.data() + pos, src.data(), len);
  }
  f.swap->finish_writes();
  std::size_t at = 0;
  for (int b = 0; b < f.buckets(); ++b) {
    const at::Tensor got = f.swap->chunk(b);
    EXPECT_EQ(std::memcmp(got.data_ptr(), want.data() + at, got.nbytes()), 0) << "bucket " << b;
    at += got.nbytes();
    f.swap->done_with(b);
  }
  // Read back in pieces of any size, as a save does.
  f.swap->settle_writes();
  at::Tensor mem = at::empty({static_cast<std::int64_t>(3 * kSwapAlignBytes)}, at::kByte);
  char* buf = swap_aligned(static_cast<char*>(mem.data_ptr()));
  for (std::size_t pos = 0; pos < want.size();) {
    const std::size_t n = 1 + rng() % 5000;
    const auto [from, took] = f.swap->read_bytes(pos, std::min(n, want.size() - pos), buf, 2 * kSwapAlignBytes);
    ASSERT_GE(took, 1u);
    ASSERT_EQ(std::memcmp(from, want.data() + pos, took), 0) << "bytes from " << pos;
    pos += took;
  }
}

}  // namespace
}  // namespace zero::detail
