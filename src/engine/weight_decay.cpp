#include "zero/engine/weight_decay.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <utility>

#include "weight_decays.h"
#include "zero/core/error.h"

namespace zero {

WeightDecayRule no_decay_below_2d() {
  return [](const std::string&, const at::Tensor& param) -> std::optional<float> {
    if (param.dim() < 2) return 0.0f;
    return std::nullopt;
  };
}

WeightDecayRule no_decay_named(std::vector<std::string> parts) {
  return [parts = std::move(parts)](const std::string& name, const at::Tensor&) -> std::optional<float> {
    for (const std::string& part : parts) {
      if (!part.empty() && name.find(part) != std::string::npos) return 0.0f;
    }
    return std::nullopt;
  };
}

}  // namespace zero

// ---- the engine's side -------------------------------------------------------

namespace zero::detail {

std::vector<float> weight_decays(const WeightDecayRule& rule, const std::vector<std::string>& names,
                                 const std::vector<at::Tensor>& params, float fallback) {
  std::vector<float> out;
  if (!rule) return out;
  out.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::optional<float> v = rule(names[i], params[i]);
    ZERO_CHECK(!v || (std::isfinite(*v) && *v >= 0.0f), "EngineOptions::weight_decay gave parameter '", names[i],
               "' a weight decay of ", v ? *v : 0.0f,
               ": a weight decay is a finite number >= 0 (return std::nullopt for the config's, ", fallback, ")");
    out.push_back(v.value_or(fallback));
  }
  return out;
}

std::string describe_weight_decays(const std::vector<float>& decays, const std::vector<std::size_t>& numels) {
  struct Tally {
    std::size_t params = 0, elements = 0;
  };
  std::map<float, Tally, std::greater<>> by_decay;
  for (std::size_t i = 0; i < decays.size(); ++i) {
    Tally& t = by_decay[decays[i]];
    ++t.params;
    t.elements += numels[i];
  }
  auto count = [](std::size_t n) {
    char buf[32];
    if (n >= 1000000) {
      std::snprintf(buf, sizeof buf, "%.1fM", static_cast<double>(n) / 1e6);
    } else if (n >= 1000) {
      std::snprintf(buf, sizeof buf, "%.1fK", static_cast<double>(n) / 1e3);
    } else {
      std::snprintf(buf, sizeof buf, "%zu", n);
    }
    return std::string(buf);
  };
  std::ostringstream os;
  os << "weight decay ";
  bool first = true;
  for (const auto& [decay, t] : by_decay) {
    os << (first ? "" : ", ") << decay << " on " << t.params << (first ? (t.params == 1 ? " parameter" : " parameters") : "")
       << " (" << count(t.elements) << " elements)";
    first = false;
  }
  return os.str();
}

}  // namespace zero::detail
