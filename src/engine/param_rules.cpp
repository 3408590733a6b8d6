#include "zero/engine/param_rules.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <utility>

#include "param_hypers.h"
#include "rank_agreement.h"
#include "zero/ckpt/crc32c.h"
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
namespace {

// A rule's answer for parameter `name`, or `fallback`; checked.
float ask(const ParamRule& rule, const char* what, const std::string& name, const at::Tensor& param, float fallback) {
  if (!rule) return fallback;
  const std::optional<float> v = rule(name, param);
  ZERO_CHECK(!v || (std::isfinite(*v) && *v >= 0.0f), "EngineOptions::", what, " gave parameter '", name, "' ",
             what == std::string("weight_decay") ? "a weight decay" : "an lr scale", " of ", v ? *v : 0.0f, ": ",
             what == std::string("weight_decay") ? "a weight decay" : "an lr scale",
             " is a finite number >= 0 (return std::nullopt for the default, ", fallback, ")");
  return v.value_or(fallback);
}

}  // namespace

ParamHypers resolve_param_hypers(const WeightDecayRule& weight_decay, const LrScaleRule& lr_scale,
                                 const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                                 float config_weight_decay) {
  ParamHypers out;
  if (!weight_decay && !lr_scale) return out;
  out.of_param.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamHyper h{ask(weight_decay, "weight_decay", names[i], params[i], config_weight_decay),
                       ask(lr_scale, "lr_scale", names[i], params[i], 1.0f)};
    auto it = std::find(out.classes.begin(), out.classes.end(), h);
    if (it == out.classes.end()) it = out.classes.insert(out.classes.end(), h);
    out.of_param.push_back(static_cast<int>(it - out.classes.begin()));
  }
  return out;
}

std::string describe_param_hypers(const ParamHypers& hypers, const std::vector<std::size_t>& numels,
                                  bool weight_decay_rule, bool lr_scale_rule) {
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
  // One setting's values, largest first, with how many parameters and
  // elements take each.
  auto tally = [&](const char* label, float ParamHyper::*field) {
    struct Tally {
      std::size_t params = 0, elements = 0;
    };
    std::map<float, Tally, std::greater<>> by_value;
    for (std::size_t i = 0; i < hypers.of_param.size(); ++i) {
      Tally& t = by_value[hypers.classes[static_cast<std::size_t>(hypers.of_param[i])].*field];
      ++t.params;
      t.elements += numels[i];
    }
    std::ostringstream os;
    os << label << " ";
    bool first = true;
    for (const auto& [value, t] : by_value) {
      os << (first ? "" : ", ") << value << " on " << t.params
         << (first ? (t.params == 1 ? " parameter" : " parameters") : "") << " (" << count(t.elements) << " elements)";
      first = false;
    }
    return os.str();
  };
  std::string line;
  if (weight_decay_rule) line = tally("weight decay", &ParamHyper::weight_decay);
  if (lr_scale_rule) line += (line.empty() ? "" : "; ") + tally("lr scale", &ParamHyper::lr_scale);
  return line;
}

void agree_on_param_hypers(comm::Communicator& comm, const c10::Device& device, const ParamHypers& hypers,
                           const std::vector<std::size_t>& numels) {
  // What a rank says: the summary, and a checksum of every parameter's class
  // and every class's values (two parameters swapped change it).
  std::uint32_t crc = ckpt::crc32c(0, hypers.of_param.data(), hypers.of_param.size() * sizeof(int));
  crc = ckpt::crc32c(crc, hypers.classes.data(), hypers.classes.size() * sizeof(ParamHyper));
  const std::string mine = describe_param_hypers(hypers, numels, true, true) + str_cat(" [", crc, "]");
  const std::vector<std::string> all = all_gather_text(comm, device, mine);
  for (std::size_t r = 1; r < all.size(); ++r) {
    ZERO_CHECK(all[r] == all[0], "EngineOptions' weight_decay / lr_scale rules gave rank ", r,
               " other settings than rank 0 (rank 0: ", all[0], "; rank ", r, ": ", all[r],
               "): a rule must answer from the parameter's name and shape alone, the same on every rank");
  }
}

std::string compare_saved_param_hypers(const std::vector<std::optional<ParamHyper>>& saved, const ParamHypers& mine,
                                       const std::vector<std::string>& names, float config_weight_decay,
                                       const std::string& where) {
  const bool any_saved = std::any_of(saved.begin(), saved.end(), [](const auto& h) { return h.has_value(); });
  if (!any_saved && mine.empty()) return "";
  const ParamHyper fallback{config_weight_decay, 1.0f};
  auto own = [&](std::size_t i) {
    return mine.empty() ? fallback : mine.classes[static_cast<std::size_t>(mine.of_param[i])];
  };
  if (!any_saved) {
    return str_cat("checkpoint ", where, " records no optimizer settings per parameter (saved by an engine without "
                   "EngineOptions' weight_decay or lr_scale rules, or by an earlier zerocpp): this engine's rules "
                   "apply from here on");
  }
  std::size_t differ = 0, first = 0;
  for (std::size_t i = 0; i < saved.size(); ++i) {
    const ParamHyper s = saved[i].value_or(fallback);
    if (s == own(i)) continue;
    if (differ++ == 0) first = i;
  }
  if (differ == 0) return "";
  const ParamHyper s = saved[first].value_or(fallback), o = own(first);
  std::ostringstream os;
  os << "checkpoint " << where << " was trained with other optimizer settings for " << differ << " of "
     << saved.size() << " parameters, such as '" << names[first] << "': ";
  if (s.weight_decay != o.weight_decay) os << "weight decay " << s.weight_decay << " there, " << o.weight_decay << " here";
  if (s.weight_decay != o.weight_decay && s.lr_scale != o.lr_scale) os << "; ";
  if (s.lr_scale != o.lr_scale) os << "lr scale " << s.lr_scale << " there, " << o.lr_scale << " here";
  os << ". Training goes on with this engine's (" << (mine.empty() ? "no rules: the config's" : "its rules")
     << "); to continue as it was, build the engine with the EngineOptions weight_decay / lr_scale rules it was "
        "saved with";
  return os.str();
}

}  // namespace zero::detail
