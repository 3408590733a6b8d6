// Where the engine finds the Adam kernel for parameters on an accelerator.
//
// The engine layer never links zero_cuda (docs/gpu.md, "The isolation rule"),
// yet its optimizer step must run zero_cuda's fused kernel when the module is
// on a GPU. zero_cuda registers that kernel here at static initialisation
// (src/cuda/register_for_engine.cpp; linking zero_cuda pulls the registrar
// in), and the engine looks it up when it is given a module on a GPU. A
// program that did not link zero_cuda finds nothing and gets an error that
// says so.
#pragma once

#include "zero/optim/adam.h"

namespace zero::optim {

// Enqueues one Adam/AdamW step (adam.h's maths and buffer contract, every
// buffer in device memory of the current device) on `stream` (a
// cudaStream_t as void*) and returns without waiting.
using DeviceAdamFn = void (*)(const AdamHyper& hyper, const AdamBuffers& buffers, void* stream);

// Registers the kernel (the last registration wins). Thread-safe.
void register_device_adam(DeviceAdamFn fn);
// The registered kernel, or nullptr when none is linked in.
DeviceAdamFn device_adam();

}  // namespace zero::optim
