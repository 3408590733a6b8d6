#include "muon_update.h"

#include <cmath>
#include <utility>

#include "zero/core/error.h"

namespace zero::detail {
namespace {

constexpr int kSteps = 5;
constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315;

// X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ, kSteps times.
at::Tensor standard_iteration(at::Tensor x) {
  for (int i = 0; i < kSteps; ++i) {
    const at::Tensor a = x.mm(x.t());
    const at::Tensor b = a.mul(kB).add_(a.mm(a), kC);
    x = b.mm(x).add_(x, kA);
  }
  return x;
}

// The same product for a wide X (n < m), as DeepSpeed's
// zeropower_via_gram_newtonschulz: Q accumulates the polynomial in
// R = X·Xᵀ (n × n), X is multiplied once at the restart and once at the end.
at::Tensor gram_iteration(at::Tensor x) {
  constexpr int kRestartAt = 2;
  at::Tensor r = x.mm(x.t());
  at::Tensor q;
  for (int i = 0; i < kSteps; ++i) {
    if (i == kRestartAt) {
      x = q.mm(x);
      r = x.mm(x.t());
      q = at::Tensor();
    }
    const at::Tensor z = r.mul(kB).add_(r.mm(r), kC);
    if (!q.defined()) {
      q = z.clone();
      q.diagonal().add_(kA);
    } else {
      q = z.mm(q).add_(q, kA);
    }
    if (i < kSteps - 1 && i + 1 != kRestartAt) {
      const at::Tensor rz = z.mm(r).add_(r, kA);
      r = z.mm(rz).add_(rz, kA);
    }
  }
  return q.mm(x);
}

}  // namespace

at::Tensor muon_orthogonalize(const at::Tensor& v, NsMethod method) {
  ZERO_CHECK(v.dim() == 2, "Muon orthogonalizes matrices; got a tensor of ", v.dim(), " dimensions");
  const std::int64_t rows = v.size(0), cols = v.size(1);
  const bool tall = rows > cols;
  at::Tensor x = v.to(at::kFloat);
  if (tall) x = x.t();
  x = x.div(x.norm().add(1e-7));
  // (X is n × m with n <= m now; a square one gains nothing from Gram.)
  x = method == NsMethod::kGram && x.size(0) < x.size(1) ? gram_iteration(x) : standard_iteration(x);
  if (tall) x = x.t();
  if (rows > cols) x = x.mul(std::sqrt(static_cast<double>(rows) / static_cast<double>(cols)));
  return x.contiguous();
}

std::pair<std::int64_t, std::int64_t> muon_matrix_shape(c10::IntArrayRef shape) {
  ZERO_CHECK(shape.size() >= 2, "Muon steps matrices; a parameter of ", shape.size(), " dimensions is not one");
  std::int64_t cols = 1;
  for (std::size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  return {shape[0], cols};
}

}  // namespace zero::detail
