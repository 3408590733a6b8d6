// Where the engine's tensors live, and the device-generic stream, event and
// pinned-host helpers its parts share. LibTorch's c10::Stream and c10::Event
// only: no CUDA header (docs/gpu.md, "The isolation rule").
#pragma once

#include <cstddef>
#include <memory>
#include <optional>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

namespace zero::detail {

struct DeviceContext {
  c10::Device device{c10::kCPU};
  // ZeRO-Offload on a GPU: the stream that moves gradients down and
  // parameters up beside the compute.
  std::optional<c10::Stream> copy_stream;
  // With offload_optimizer.publish_in_backward: the parameters' way up, a
  // stream of its own, so that it runs beside the gradients going down on
  // copy_stream (the two directions of the link at once). Unset: copy_stream.
  std::optional<c10::Stream> upload_stream;

  bool on_accelerator() const { return !device.is_cpu(); }
  // The stream the module's work runs on now (LibTorch's current stream).
  c10::Stream current_stream() const;
  // Its native handle: a cudaStream_t as void* on CUDA.
  void* native_stream() const { return current_stream().native_handle(); }
  // A stream of the device's pool, for copies beside the compute.
  c10::Stream side_stream() const;
  // An event recorded on `stream` now.
  std::shared_ptr<c10::Event> record_on(const c10::Stream& stream) const;
  // n elements of `dtype` in host memory: pageable on the CPU; on a GPU
  // pinned, of exactly that size (zero/core/pinned_host_allocator.h), or
  // LibTorch's pinned allocator when none is registered.
  at::Tensor host_tensor(std::size_t n, c10::ScalarType dtype) const;
};

}  // namespace zero::detail
