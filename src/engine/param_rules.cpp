#include "zero/engine/param_rules.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <system_error>
#include <utility>

#include "param_hypers.h"
#include "rank_agreement.h"
#include "zero/comm/comm_errors.h"
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

bool muon_by_default(const std::string& name, const at::Tensor& param) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return param.dim() >= 2 && lower.find("embed") == std::string::npos && lower.find("lm_head") == std::string::npos;
}

MuonRule muon_except_named(std::vector<std::string> parts) {
  return [parts = std::move(parts)](const std::string& name, const at::Tensor& param) -> std::optional<bool> {
    if (param.dim() < 2) return false;
    for (const std::string& part : parts) {
      if (!part.empty() && name.find(part) != std::string::npos) return false;
    }
    return true;
  };
}

}  // namespace zero

// ---- the engine's side -------------------------------------------------------

namespace zero::detail {

std::string shortest(float v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

namespace {

// "124.3M", "121.3K", "48".
std::string count_text(std::size_t n) {
  char buf[32];
  if (n >= 1000000) {
    std::snprintf(buf, sizeof buf, "%.1fM", static_cast<double>(n) / 1e6);
  } else if (n >= 1000) {
    std::snprintf(buf, sizeof buf, "%.1fK", static_cast<double>(n) / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%zu", n);
  }
  return buf;
}

// A rule's answer for parameter `name`, or `fallback`; checked.
float ask(const ParamRule& rule, const char* what, const std::string& name, const at::Tensor& param, float fallback) {
  if (!rule) return fallback;
  std::optional<float> v = rule(name, param);
  if (v) *v += 0.0f;  // -0 is 0 (the ranks compare the settings' bytes)
  ZERO_CHECK(!v || (std::isfinite(*v) && *v >= 0.0f), "EngineOptions::", what, " gave parameter '", name, "' ",
             what == std::string("weight_decay") ? "a weight decay" : "an lr scale", " of ", v ? *v : 0.0f, ": ",
             what == std::string("weight_decay") ? "a weight decay" : "an lr scale",
             " is a finite number >= 0 (return std::nullopt for the default, ", fallback, ")");
  return v.value_or(fallback);
}

}  // namespace

ParamHypers resolve_param_hypers(const WeightDecayRule& weight_decay, const LrScaleRule& lr_scale,
                                 const MuonRule* use_muon, const std::vector<std::string>& names,
                                 const std::vector<at::Tensor>& params, float config_weight_decay) {
  ParamHypers out;
  if (!weight_decay && !lr_scale && use_muon == nullptr) return out;
  out.of_param.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::int32_t muon = 0;
    if (use_muon != nullptr) {
      const std::optional<bool> v = *use_muon ? (*use_muon)(names[i], params[i]) : std::nullopt;
      ZERO_CHECK(!v || !*v || params[i].dim() >= 2, "EngineOptions::use_muon gave Muon to parameter '", names[i],
                 "' of ", params[i].dim(), " dimension(s): Muon orthogonalizes matrices; return false (its Adam "
                 "half) or std::nullopt for parameters of fewer than two dimensions");
      muon = v.value_or(muon_by_default(names[i], params[i])) ? 1 : 0;
    }
    const ParamHyper h{ask(weight_decay, "weight_decay", names[i], params[i], config_weight_decay),
                       ask(lr_scale, "lr_scale", names[i], params[i], 1.0f), muon};
    auto it = std::find(out.classes.begin(), out.classes.end(), h);
    if (it == out.classes.end()) it = out.classes.insert(out.classes.end(), h);
    out.of_param.push_back(static_cast<int>(it - out.classes.begin()));
  }
  return out;
}

std::string describe_param_hypers(const ParamHypers& hypers, const std::vector<std::size_t>& numels,
                                  bool weight_decay_rule, bool lr_scale_rule) {
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
      os << (first ? "" : ", ") << shortest(value) << " on " << t.params
         << (first ? (t.params == 1 ? " parameter" : " parameters") : "") << " (" << count_text(t.elements) << " elements)";
      first = false;
    }
    return os.str();
  };
  std::string line;
  if (weight_decay_rule) line = tally("weight decay", &ParamHyper::weight_decay);
  if (lr_scale_rule) line += (line.empty() ? "" : "; ") + tally("lr scale", &ParamHyper::lr_scale);
  return line;
}

std::string describe_muon_halves(const ParamHypers& hypers, const std::vector<std::size_t>& numels, float muon_scale,
                                 float adam_scale) {
  std::size_t params[2] = {0, 0}, elements[2] = {0, 0};
  for (std::size_t i = 0; i < hypers.of_param.size(); ++i) {
    const int muon = hypers.classes[static_cast<std::size_t>(hypers.of_param[i])].muon != 0 ? 1 : 0;
    ++params[muon];
    elements[muon] += numels[i];
  }
  auto g3 = [](float v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", static_cast<double>(v));
    return std::string(buf);
  };
  return str_cat("Muon on ", params[1], params[1] == 1 ? " matrix (" : " matrices (", count_text(elements[1]),
                 " elements) at lr x ", g3(muon_scale), ", Adam on ", params[0],
                 params[0] == 1 ? " parameter (" : " parameters (", count_text(elements[0]), " elements) at lr x ",
                 g3(adam_scale));
}

void agree_on_param_hypers(comm::Communicator& comm, const c10::Device& device, const ParamHypers& hypers,
                           const std::string& error, const std::vector<std::size_t>& numels) {
  // What a rank says: its rules' error, or that it has none, or the summary
  // and a checksum of every parameter's class and every class's values (two
  // parameters swapped change it).
  static_assert(sizeof(ParamHyper) == 3 * sizeof(float), "the checksum reads ParamHyper's bytes: no padding");
  std::string mine = "no rules";
  if (!error.empty()) {
    mine = "error: " + error;
  } else if (!hypers.empty()) {
    std::uint32_t crc = ckpt::crc32c(0, hypers.of_param.data(), hypers.of_param.size() * sizeof(int));
    crc = ckpt::crc32c(crc, hypers.classes.data(), hypers.classes.size() * sizeof(ParamHyper));
    mine = describe_param_hypers(hypers, numels, true, true) + str_cat(" [", crc, "]");
  }
  const std::vector<std::string> all = all_gather_text(comm, device, mine);
  if (!error.empty()) throw Error(error);
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].rfind("error: ", 0) == 0) {
      throw comm::ForAnotherRank<Error>(str_cat("EngineOptions' rules failed on rank ", r, ": ", all[r].substr(7)),
                                        static_cast<int>(r));
    }
  }
  for (std::size_t r = 1; r < all.size(); ++r) {
    ZERO_CHECK(all[r] == all[0], "EngineOptions' weight_decay / lr_scale / use_muon rules gave rank ", r,
               " other settings than rank 0 (rank 0: ", all[0], "; rank ", r, ": ", all[r],
               "): every rank must give the same rules, and a rule must answer from the parameter's name and shape "
               "alone");
  }
}

std::string compare_saved_param_hypers(const std::vector<std::optional<ParamHyper>>& saved, const ParamHypers& mine,
                                       const std::vector<std::string>& names, float config_weight_decay,
                                       const std::string& where) {
  // A parameter the checkpoint records nothing for trained with the config's
  // settings (as far as this engine knows them), as one here without rules.
  const bool any_saved = std::any_of(saved.begin(), saved.end(), [](const auto& h) { return h.has_value(); });
  const ParamHyper fallback{config_weight_decay, 1.0f};
  auto own = [&](std::size_t i) {
    return mine.empty() ? fallback : mine.classes[static_cast<std::size_t>(mine.of_param[i])];
  };
  std::size_t differ = 0, first = 0;
  for (std::size_t i = 0; i < saved.size(); ++i) {
    const ParamHyper s = saved[i].value_or(fallback), o = own(i);  // (Muon's halves: checked by the load)
    if (s.weight_decay == o.weight_decay && s.lr_scale == o.lr_scale) continue;
    if (differ++ == 0) first = i;
  }
  if (differ == 0) return "";
  const ParamHyper s = saved[first].value_or(fallback), o = own(first);
  std::ostringstream os;
  os << "checkpoint " << where << " was trained with other optimizer settings for " << differ << " of "
     << saved.size() << " parameters, such as '" << names[first] << "': ";
  if (s.weight_decay != o.weight_decay) {
    os << "weight decay " << shortest(s.weight_decay) << " there, " << shortest(o.weight_decay) << " here";
  }
  if (s.weight_decay != o.weight_decay && s.lr_scale != o.lr_scale) os << "; ";
  if (s.lr_scale != o.lr_scale) os << "lr scale " << shortest(s.lr_scale) << " there, " << shortest(o.lr_scale) << " here";
  if (!any_saved) {
    os << " (it records no settings per parameter: it was saved without EngineOptions' weight_decay or lr_scale "
          "rules, so with the config's weight decay, taken here as this config's)";
  }
  os << ". Training goes on with this engine's (" << (mine.empty() ? "no rules: the config's" : "its rules")
     << "); to continue as it was, build the engine with the EngineOptions weight_decay / lr_scale rules and the "
        "optimizer.params.weight_decay it was saved with";
  return os.str();
}

}  // namespace zero::detail
