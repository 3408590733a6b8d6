// src/engine/out_of_memory.cpp: an allocator's out-of-memory error becomes
// one that says what was asked for and what zerocpp holds. The device case
// is checked here with the CUDA caching allocator's own exception type and
// message (no GPU needed: the translation reads the exception, not the
// device); faults.host_oom runs the host case end to end.
#include <new>
#include <string>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "out_of_memory.h"
#include "zero/core/error.h"
#include "zero/core/pinned_host_allocator.h"
#include "zero/memory/memory_ledger.h"

namespace {

using zero::memory::Kind;
using zero::memory::MemoryLedger;
using zero::memory::Tier;

std::string translated(const std::exception& e, const MemoryLedger& ledger) {
  try {
    zero::detail::rethrow_if_out_of_memory(e, "running backward", ledger);
  } catch (const zero::Error& z) {
    return z.what();
  }
  return "";
}

TEST(OutOfMemory, TheDeviceAllocatorsErrorNamesWhatWasAskedAndHeld) {
  MemoryLedger ledger;
  auto params = ledger.add(Tier::kDevice, Kind::kHalfParams, std::int64_t{1} << 30, "params", false);
  auto master = ledger.add(Tier::kHost, Kind::kFp32Master, std::int64_t{2} << 30, "master", false);
  const c10::OutOfMemoryError e(
      c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
      "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.13 GiB "
      "is free.\nIncluding non-PyTorch memory, this process has 78.05 GiB memory in use.");
  const std::string what = translated(e, ledger);
  EXPECT_NE(what.find("out of device memory while running backward: an allocation of 2.00 GiB failed"),
            std::string::npos) << what;
  EXPECT_NE(what.find("zerocpp holds 1.00 GiB on the device"), std::string::npos) << what;
  EXPECT_NE(what.find("2.00 GiB on the host"), std::string::npos) << what;
  EXPECT_NE(what.find("offload_optimizer.device=\"cpu\""), std::string::npos) << what;
  EXPECT_NE(what.find("The allocator said: CUDA out of memory. Tried to allocate 2.00 GiB"), std::string::npos) << what;
  EXPECT_EQ(what.find("Including non-PyTorch"), std::string::npos) << what;  // its first line only
}

TEST(OutOfMemory, PinnedHostMemoryIsNamedWithItsBound) {
  // What zero_cuda's allocator throws when cudaHostAlloc has no memory
  // (src/cuda/register_for_engine.cpp).
  MemoryLedger ledger;
  auto master = ledger.add(Tier::kHost, Kind::kFp32Master, std::int64_t{3} << 30, "master", false);
  const std::string what = translated(zero::PinnedHostOutOfMemory(std::size_t{6} << 30), ledger);
  EXPECT_NE(what.find("out of pinned host memory while running backward: an allocation of 6442450944 bytes failed"),
            std::string::npos) << what;
  EXPECT_NE(what.find("zerocpp holds 3.00 GiB on the host"), std::string::npos) << what;
  EXPECT_NE(what.find("cannot be swapped"), std::string::npos) << what;
  EXPECT_NE(what.find("offload_optimizer.ratio below 1"), std::string::npos) << what;
  // Not the device's advice: the device is not what ran out.
  EXPECT_EQ(what.find("offload_optimizer.device=\"cpu\""), std::string::npos) << what;
}

TEST(OutOfMemory, HostAllocationFailureAndOtherErrors) {
  MemoryLedger ledger;
  const std::string host = translated(std::bad_alloc(), ledger);
  EXPECT_NE(host.find("out of host memory while running backward: an allocation of unknown size failed; zerocpp "
                      "holds nothing yet"), std::string::npos) << host;
  // Not out of memory, or ours (which say what they need already): left alone.
  EXPECT_EQ(translated(std::runtime_error("shape mismatch"), ledger), "");
  EXPECT_EQ(translated(zero::Error("device budget: out of memory"), ledger), "");
}

}  // namespace
