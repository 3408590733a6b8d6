// CPU Adagrad over one contiguous partition, as torch.optim.Adagrad:
//
//   g    = grad * grad_scale  (+ weight_decay * p when weight_decay != 0)
//   clr  = lr / (1 + (step - 1) * lr_decay)
//   sum += g * g
//   p   -= clr * g / (sqrt(sum) + eps)
//
// clr is computed once in double and rounded to float. Buffer contract as for
// AdamBuffers (adam.h): n elements each, no alignment needed, grads read only,
// params and state_sum updated in place, optional rounded half copy of p.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/core/dtype.h"

namespace zero::optim {

class ThreadPool;

struct AdagradHyper {
  float lr = 1e-2f;
  float eps = 1e-10f;
  float weight_decay = 0.0f;
  float lr_decay = 0.0f;
  std::int64_t step = 1;  // the step number after increment (1 for the first step)
};

struct AdagradBuffers {
  float* params = nullptr;
  const void* grads = nullptr;
  DType grad_dtype = DType::kFloat32;
  float* state_sum = nullptr;
  std::size_t n = 0;
  float grad_scale = 1.0f;
  void* half_out = nullptr;
  DType half_dtype = DType::kBFloat16;
};

void adagrad_step(const AdagradHyper& hyper, const AdagradBuffers& buffers,
                  ThreadPool* pool = nullptr);
void adagrad_step_reference(const AdagradHyper& hyper, const AdagradBuffers& buffers);

}  // namespace zero::optim
