// CudaStream: an owned CUDA stream, for code that must not include CUDA
// headers. handle() is the cudaStream_t as void*, what every zero_cuda call
// that takes a `void* stream` expects.
#pragma once

namespace zero::cuda {

class CudaStream {
 public:
  // A stream on the current device that does not synchronise with the legacy
  // default stream (cudaStreamNonBlocking): order against other streams with
  // events, as the NCCL communicator does. Throws zero::Error.
  CudaStream();
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  void* handle() const { return stream_; }
  // Blocks until the work enqueued so far is done.
  void synchronize() const;

 private:
  void* stream_ = nullptr;
};

// Blocks until the work enqueued on `stream` so far is done
// (cudaStreamSynchronize; nullptr is the legacy default stream).
void stream_synchronize(void* stream);

}  // namespace zero::cuda
