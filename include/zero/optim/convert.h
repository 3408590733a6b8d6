// Converts a span between fp32, bf16 and fp16, vectorised and threaded like
// the optimizer kernels (the engine copies grads and params between
// precisions with it).
//
// Narrowing rounds to nearest, ties to even, keeps NaN a NaN and overflows to
// inf: bit for bit zero::float_to_bf16 / zero::float_to_fp16 (core/half.h).
// bf16 <-> fp16 goes through fp32 (exact widening, one rounding). Equal dtypes
// copy. src and dst must not overlap.
#pragma once

#include <cstddef>

#include "zero/core/dtype.h"

namespace zero::optim {

class ThreadPool;

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n,
             ThreadPool* pool = nullptr);

}  // namespace zero::optim
