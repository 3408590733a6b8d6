#include "setup_agreement.h"

#include <algorithm>
#include <sstream>

#include "rank_agreement.h"
#include "zero/ckpt/crc32c.h"
#include "zero/core/error.h"

namespace zero::detail {
namespace {

std::uint32_t crc_of(const std::string& text, std::uint32_t crc = 0) {
  return ckpt::crc32c(crc, text.data(), text.size());
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::string shown(const nlohmann::json* v) {
  if (v == nullptr) return "absent";
  std::string s = v->dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// Depth-first, in rank 0's key order; keys only the other has come after.
std::string difference(const nlohmann::json* a, const nlohmann::json* b, const std::string& path, int other) {
  if (a != nullptr && b != nullptr && a->is_object() && b->is_object()) {
    for (auto it = a->begin(); it != a->end(); ++it) {
      const nlohmann::json* bv = b->contains(it.key()) ? &(*b)[it.key()] : nullptr;
      std::string d = difference(&it.value(), bv, path.empty() ? it.key() : path + "." + it.key(), other);
      if (!d.empty()) return d;
    }
    for (auto it = b->begin(); it != b->end(); ++it) {
      if (!a->contains(it.key())) {
        return difference(nullptr, &it.value(), path.empty() ? it.key() : path + "." + it.key(), other);
      }
    }
    return "";
  }
  if (a != nullptr && b != nullptr && *a == *b) return "";
  return str_cat(path, ": ", shown(a), " on rank 0, ", shown(b), " on rank ", other);
}

}  // namespace

nlohmann::json shared_config_json(const nlohmann::json& config) {
  nlohmann::json c = config;
  // (device_memory_limit stays: every rank must refuse a budget alike.)
  for (const char* local : {"steps_per_print", "wall_clock_breakdown", "flight_recorder", "aio", "seed"}) {
    c.erase(local);
  }
  if (c.contains("zero_optimization")) {
    nlohmann::json& z = c["zero_optimization"];
    for (const char* section : {"offload_optimizer", "offload_param"}) {
      if (!z.contains(section)) continue;
      // (publish_in_backward: off with several ranks, however it is said.)
      for (const char* local : {"nvme_path", "pin_memory", "cpu_threads", "buffer_count", "publish_in_backward"}) {
        z[section].erase(local);
      }
    }
  }
  return c;
}

std::vector<std::string> parameter_lines(torch::nn::Module& module) {
  std::vector<std::string> out;
  for (const auto& item : module.named_parameters()) {
    const at::Tensor& t = item.value();
    std::ostringstream line;
    line << item.key() << " " << t.sizes() << " " << t.scalar_type() << (t.requires_grad() ? " trainable" : " frozen");
    out.push_back(line.str());
  }
  return out;
}

std::string first_config_difference(const nlohmann::json& rank0, const nlohmann::json& other, int other_rank) {
  return difference(&rank0, &other, "", other_rank);
}

void agree_on_setup(comm::Communicator& comm, const c10::Device& device, const nlohmann::json& config,
                    const std::vector<std::string>& params) {
  if (comm.world_size() == 1) return;
  const std::string config_text = shared_config_json(config).dump();
  const std::string params_text = joined(params);
  const std::vector<std::string> sums =
      all_gather_text(comm, device, str_cat(crc_of(config_text), " ", crc_of(params_text), " ", params.size()));
  bool alike = true;
  for (const std::string& s : sums) alike = alike && s == sums[0];
  if (alike) return;
  // They differ (every rank sees it): the details, to name the first difference.
  const std::vector<std::string> configs = all_gather_text(comm, device, config_text);
  const std::vector<std::string> models = all_gather_text(comm, device, params_text);
  for (std::size_t r = 1; r < configs.size(); ++r) {
    const int rank = static_cast<int>(r);
    if (configs[r] != configs[0]) {
      const std::string d = first_config_difference(nlohmann::json::parse(configs[0]),
                                                    nlohmann::json::parse(configs[r]), rank);
      ZERO_CHECK(false, "rank ", rank, " was given another config than rank 0 (", d,
                 "): every rank must build the engine with the same config (the same file)");
    }
    if (models[r] != models[0]) {
      const std::vector<std::string> a = split_lines(models[0]), b = split_lines(models[r]);
      std::size_t i = 0;
      while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
      ZERO_CHECK(false, "rank ", rank, "'s model differs from rank 0's at parameter ", i, " of ",
                 std::max(a.size(), b.size()), " (rank 0: ", i < a.size() ? a[i] : std::string("none"), "; rank ",
                 rank, ": ", i < b.size() ? b[i] : std::string("none"),
                 "): every rank must build the same model (the same parameters in the same order, shapes, dtypes and "
                 "requires_grad) before the engine");
    }
  }
}

}  // namespace zero::detail
