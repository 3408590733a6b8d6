// zero_cuda where no device is needed: argument checks that run before any
// CUDA call, empty buffers, and (on a machine without a device) that CUDA
// failures arrive as zero::Error with the call, file:line and CUDA's text.
// Runs everywhere zero_cuda is built.
#include <string>

#include <gtest/gtest.h>

#include "zero/core/pinned_host_allocator.h"
#include "zero/optim/device_kernel_registry.h"

#include "zero/core/error.h"
#include "zero/cuda/device_adam.h"
#include "zero/cuda/device_buffer.h"
#include "zero/cuda/device_info.h"
#include "zero/cuda/pinned_buffer.h"
#ifdef ZERO_HAVE_NCCL
#include "zero/comm/communicator.h"
#include "zero/cuda/nccl_communicator.h"
#endif

namespace zero::cuda {
namespace {

// Linking zero_cuda registers its device Adam and pinned host allocator for
// the engine (src/cuda/register_for_engine.cpp, pulled in by the link
// option of zero_cuda): without them the engine refuses a GPU module.
TEST(CudaHost, LinkingZeroCudaRegistersWhatTheEngineNeeds) {
  EXPECT_NE(zero::optim::device_adam(), nullptr);
  EXPECT_NE(zero::optim::device_lion(), nullptr);
  ASSERT_NE(zero::pinned_host_allocator(), nullptr);
  EXPECT_NE(zero::pinned_host_allocator()->allocate, nullptr);
  EXPECT_NE(zero::pinned_host_allocator()->release, nullptr);
}

TEST(CudaHost, DeviceCountNeverThrows) {
  int n = -1;
  EXPECT_NO_THROW(n = cuda_device_count());
  EXPECT_GE(n, 0);
  EXPECT_EQ(n, cuda_device_count());  // the probe leaves no error behind
}

TEST(CudaHost, FusedAdamChecksArgumentsBeforeAnyCudaCall) {
  float x = 0.0f;  // never dereferenced: every call below throws first
  optim::AdamHyper h;
  h.step = 0;
  EXPECT_THROW(fused_adam_device(h, &x, &x, DType::kFloat32, &x, &x, 1, 1.0f, nullptr,
                                 DType::kBFloat16, nullptr),
               Error);
  h.step = 1;
  EXPECT_THROW(fused_adam_device(h, nullptr, &x, DType::kFloat32, &x, &x, 1, 1.0f, nullptr,
                                 DType::kBFloat16, nullptr),
               Error);
  EXPECT_THROW(fused_adam_device(h, &x, &x, DType::kFloat32, &x, &x, 1, 1.0f, &x,
                                 DType::kFloat32, nullptr),
               Error);
  // n == 0 is a no-op, null pointers allowed, no CUDA call (so no device needed).
  EXPECT_NO_THROW(fused_adam_device(h, nullptr, nullptr, DType::kBFloat16, nullptr, nullptr, 0,
                                    1.0f, nullptr, DType::kBFloat16, nullptr));
}

TEST(CudaHost, EmptyBuffersMakeNoCudaCall) {
  DeviceBuffer d(0);
  PinnedBuffer p(0);
  EXPECT_EQ(d.data(), nullptr);
  EXPECT_EQ(d.size(), 0u);
  EXPECT_EQ(p.data(), nullptr);
  EXPECT_EQ(p.size(), 0u);
  EXPECT_NO_THROW(copy_async(nullptr, nullptr, 0, nullptr));
}

// What a user without a GPU sees: an error naming the call and the cause.
TEST(CudaHost, WithoutADeviceCudaFailuresAreZeroErrors) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  try {
    DeviceBuffer d(64);
    FAIL() << "cudaMalloc succeeded without a device";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUDA call failed: cudaMalloc"), std::string::npos) << what;
    EXPECT_NE(what.find("device_buffer.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("cudaError"), std::string::npos) << what;  // e.g. cudaErrorInsufficientDriver
  }
  EXPECT_THROW(PinnedBuffer(64), Error);
  EXPECT_THROW(cuda_device_synchronize(), Error);
}

#ifdef ZERO_HAVE_NCCL
TEST(CudaHost, NcclCommunicatorWithoutADeviceIsAnErrorNotAHang) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  auto bootstrap = comm::make_single_process_communicator();
  try {
    (void)make_nccl_communicator(*bootstrap, 0);
    FAIL() << "make_nccl_communicator succeeded without a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not a CUDA device"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
}  // namespace zero::cuda
