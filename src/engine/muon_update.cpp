#include "muon_update.h"

#include <cmath>

#include "zero/core/error.h"

namespace zero::detail {
namespace {

constexpr int kSteps = 5;
constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315;

at::Tensor mT(const at::Tensor& x) { return x.transpose(-2, -1); }

// X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ, kSteps times.
at::Tensor standard_iteration(at::Tensor x) {
  for (int i = 0; i < kSteps; ++i) {
    const at::Tensor a = x.matmul(mT(x));
    const at::Tensor b = a.mul(kB).add_(a.matmul(a), kC);
    x = b.matmul(x).add_(x, kA);
  }
  return x;
}

// The same product for a wide X (n < m), as DeepSpeed's
// zeropower_via_gram_newtonschulz: Q accumulates the polynomial in
// R = X·Xᵀ (n × n), X is multiplied once at the restart and once at the end.
at::Tensor gram_iteration(at::Tensor x) {
  constexpr int kRestartAt = 2;
  at::Tensor r = x.matmul(mT(x));
  at::Tensor q;
  for (int i = 0; i < kSteps; ++i) {
    if (i == kRestartAt) {
      x = q.matmul(x);
      r = x.matmul(mT(x));
      q = at::Tensor();
    }
    const at::Tensor z = r.mul(kB).add_(r.matmul(r), kC);
    if (!q.defined()) {
      q = z.clone();
      q.diagonal(0, -2, -1).add_(kA);
    } else {
      q = z.matmul(q).add_(q, kA);
    }
    if (i < kSteps - 1 && i + 1 != kRestartAt) {
      const at::Tensor rz = z.matmul(r).add_(r, kA);
      r = z.matmul(rz).add_(rz, kA);
    }
  }
  return q.matmul(x);
}

double aspect_scale(std::int64_t rows, std::int64_t cols) {
  return rows > cols ? std::sqrt(static_cast<double>(rows) / static_cast<double>(cols)) : 1.0;
}

}  // namespace

at::Tensor muon_orthogonalize(const at::Tensor& v, NsMethod method) {
  ZERO_CHECK(v.dim() >= 2, "Muon orthogonalizes matrices; got a tensor of ", v.dim(), " dimensions");
  const bool tall = v.size(-2) > v.size(-1);
  at::Tensor x = v.to(at::kFloat);
  if (tall) x = mT(x);
  x = x.div(x.norm(2, {-2, -1}, /*keepdim=*/true).add(1e-7));
  // (X is n × m with n <= m now; a square one gains nothing from Gram.)
  x = method == NsMethod::kGram && x.size(-2) < x.size(-1) ? gram_iteration(x) : standard_iteration(x);
  if (tall) x = mT(x);
  return x;
}

at::Tensor muon_update_direction(const at::Tensor& v, c10::IntArrayRef shape, NsMethod method) {
  const std::size_t d = shape.size();
  ZERO_CHECK(d >= 2, "Muon steps matrices; a parameter of ", d, " dimensions is not one");
  at::Tensor u = d == 4 ? muon_orthogonalize(v.view({shape[0], -1}), method) : muon_orthogonalize(v.view(shape), method);
  return u.mul(aspect_scale(shape[d - 2], shape[d - 1])).reshape({-1});
}

}  // namespace zero::detail
