// Internal to zerocpp (namespace detail: no stability promise to users):
// shared by zero_optim and zero_cuda, published here so that no library
// includes another's private sources.
//
// The per-step scalars of each optimizer, computed once per call in double and
// rounded to float, the way LibTorch turns its double options into the float
// scalars its kernels use. The SIMD kernels and the scalar references both
// take them from here, so they agree on every rounding of the setup.
#pragma once

#include "zero/optim/adagrad.h"
#include "zero/optim/adam.h"
#include "zero/optim/lion.h"

namespace zero::optim::detail {

struct AdamScalars {
  float grad_scale = 1.0f;
  float l2 = 0.0f;           // Adam (L2): g += l2 * p; 0 for AdamW
  float decay = 1.0f;        // AdamW: p *= decay = 1 - lr * wd; 1 for Adam
  float beta1 = 0.0f;
  float one_minus_beta1 = 0.0f;
  float beta2 = 0.0f;
  float one_minus_beta2 = 0.0f;
  float inv_sqrt_bc2 = 1.0f; // 1 / sqrt(1 - beta2^step): a multiply, not a divide, per element
  float eps = 0.0f;
  float step_size = 0.0f;    // lr / (1 - beta1^step)
};

struct AdagradScalars {
  float grad_scale = 1.0f;
  float l2 = 0.0f;           // g += l2 * p (0: off)
  float clr = 0.0f;          // lr / (1 + (step - 1) * lr_decay)
  float eps = 0.0f;
};

struct LionScalars {
  float grad_scale = 1.0f;
  float lr = 0.0f;
  float decay = 1.0f;        // p *= decay = 1 - lr * wd
  float beta1 = 0.0f;
  float one_minus_beta1 = 0.0f;
  float beta2 = 0.0f;
  float one_minus_beta2 = 0.0f;
};

// Check the arguments (zero::Error naming the bad one) and derive the scalars.
AdamScalars adam_scalars(const AdamHyper& hyper, const AdamBuffers& buffers);
AdagradScalars adagrad_scalars(const AdagradHyper& hyper, const AdagradBuffers& buffers);
LionScalars lion_scalars(const LionHyper& hyper, const LionBuffers& buffers);

}  // namespace zero::optim::detail
