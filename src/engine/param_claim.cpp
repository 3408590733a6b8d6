#include "param_claim.h"

#include <mutex>
#include <unordered_set>

#include "zero/core/error.h"

namespace zero::detail {
namespace {

std::mutex& claims_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_set<const void*>& claims() {
  static std::unordered_set<const void*> c;
  return c;
}

}  // namespace

ParamClaim::ParamClaim(const std::vector<at::Tensor>& params, const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(claims_mutex());
  auto& all = claims();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const void* impl = params[i].unsafeGetTensorImpl();
    ZERO_CHECK(all.count(impl) == 0, "parameter '", i < names.size() ? names[i] : std::to_string(i),
               "' is trained by another zero::Engine that is still alive: one engine per module. Destroy that "
               "engine before building another on this module (or on a part of it); the module then has its "
               "parameters back");
  }
  for (const at::Tensor& p : params) {
    all.insert(p.unsafeGetTensorImpl());
    held_.push_back(p.unsafeGetTensorImpl());
  }
}

ParamClaim::~ParamClaim() { release(); }

ParamClaim& ParamClaim::operator=(ParamClaim&& other) noexcept {
  if (this != &other) {
    release();
    held_ = std::move(other.held_);
    other.held_.clear();
  }
  return *this;
}

void ParamClaim::release() noexcept {
  if (held_.empty()) return;
  std::lock_guard<std::mutex> lock(claims_mutex());
  for (const void* impl : held_) claims().erase(impl);
  held_.clear();
}

}  // namespace zero::detail
