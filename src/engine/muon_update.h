// Muon's orthogonalization (Jordan et al. 2024, "Muon: MomentUm
// Orthogonalized by Newton-Schulz"), as DeepSpeed's muon_update computes it
// (deepspeed/runtime/zero/muon/original_muon.py): five steps of the quintic
// Newton-Schulz iteration with coefficients (3.4445, -4.7750, 2.0315) on the
// matrix divided by its Frobenius norm (+ 1e-7), on its transpose where it
// has more rows than columns, then scaled by sqrt(max(1, rows / cols)).
//
// DeepSpeed iterates in fp16 ("gram") or bf16 ("standard") where the
// device has them; zerocpp in fp32 everywhere (so the two methods agree to
// about 1e-6). "gram" (Tri Dao's Gram Newton-Schulz, with its restart at
// the third step) iterates on the small square X·Xᵀ instead of X, fewer
// FLOPs for a wide matrix; a square one takes the standard iteration.
#pragma once

#include <cstdint>

#include <ATen/Tensor.h>

namespace zero::detail {

enum class NsMethod { kGram, kStandard };

// The Newton-Schulz iteration on each matrix of `v` (its last two
// dimensions; any before them are a batch), in fp32 on v's device; not
// scaled.
at::Tensor muon_orthogonalize(const at::Tensor& v, NsMethod method);

// The update of a parameter of shape `shape` (two or more dimensions) from
// its look-ahead `v` (flat, shape's elements), flat, as DeepSpeed's
// muon_update makes it: a matrix orthogonalized whole; a convolution's
// filters (four dimensions) as [size(0), the rest], scaled by their last two
// (kernel) dimensions; three or five and more as a batch of their last two.
at::Tensor muon_update_direction(const at::Tensor& v, c10::IntArrayRef shape, NsMethod method);

}  // namespace zero::detail
