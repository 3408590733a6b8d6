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
#include <utility>

#include <ATen/Tensor.h>

namespace zero::detail {

enum class NsMethod { kGram, kStandard };

// The orthogonalized, scaled update of `v` (2-D, any floating dtype), in
// fp32 on v's device.
at::Tensor muon_orthogonalize(const at::Tensor& v, NsMethod method);

// The parameter's shape as the matrix Muon orthogonalizes: [rows, cols] for
// a matrix, [size(0), the product of the rest] for more dimensions (a
// convolution's filters, as Keller Jordan's Muon treats them).
std::pair<std::int64_t, std::int64_t> muon_matrix_shape(c10::IntArrayRef shape);

}  // namespace zero::detail
