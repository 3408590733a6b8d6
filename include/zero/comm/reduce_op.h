// Reductions of the communicators, and the element-wise kernel that carries
// them out for every DType.
//
// Accuracy of the 16-bit types (bf16, fp16): each pairwise combination widens
// both operands to fp32, combines them in fp32 and rounds the result back to
// nearest, ties to even. A sum over N ranks therefore rounds N-1 times (the
// MPI algorithm picks the pairing; every rank gets the same bits), so it can
// differ from the exactly-rounded sum by a few ulps of the 16-bit type. Sums
// of values whose partial sums are all representable are exact. Callers that
// need better accuracy reduce fp32 buffers.
//
// kMax: if either operand is NaN the result is NaN (a canonical quiet NaN, so
// that every rank gets the same bits whatever the pairing); max(-0, +0) is +0
// in either order. These hold for fp32 too (MPI's own MPI_MAX leaves NaN
// handling to the implementation, so zerocpp uses its own op for it).
#pragma once

#include <cstddef>
#include <string_view>

#include "zero/core/dtype.h"

namespace zero::comm {

enum class ReduceOp { kSum, kMax };

std::string_view reduce_op_name(ReduceOp op);  // "sum", "max"

// inout[i] = op(in[i], inout[i]) for i in [0, count), elements of `dtype`.
// This is the function the MPI backend registers with MPI_Op_create for the
// 16-bit types, and its reference.
void reduce_into(ReduceOp op, DType dtype, const void* in, void* inout, std::size_t count);

}  // namespace zero::comm
