// Where the engine finds the optimizer kernels for parameters on an
// accelerator (Adam and Lion).
//
// The engine layer never links zero_cuda (docs/gpu.md, "The isolation rule"),
// yet its optimizer step must run zero_cuda's fused kernels when the module is
// on a GPU. zero_cuda registers them here at static initialisation
// (src/cuda/register_for_engine.cpp; linking zero_cuda pulls the registrar
// in), and the engine looks them up when it is given a module on a GPU. A
// program that did not link zero_cuda finds nothing and gets an error that
// says so.
#pragma once

#include "zero/optim/adam.h"
#include "zero/optim/lion.h"

namespace zero::optim {

// Each enqueues one step (adam.h's or lion.h's maths and buffer contract,
// every buffer in device memory of the current device) on `stream` (a
// cudaStream_t as void*) and returns without waiting.
using DeviceAdamFn = void (*)(const AdamHyper& hyper, const AdamBuffers& buffers, void* stream);
using DeviceLionFn = void (*)(const LionHyper& hyper, const LionBuffers& buffers, void* stream);

// Registers a kernel (the last registration wins). Thread-safe.
void register_device_adam(DeviceAdamFn fn);
void register_device_lion(DeviceLionFn fn);
// The registered kernel, or nullptr when none is linked in.
DeviceAdamFn device_adam();
DeviceLionFn device_lion();

}  // namespace zero::optim
