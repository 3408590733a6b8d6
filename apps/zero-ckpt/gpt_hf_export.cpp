#include "gpt_hf_export.h"

#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "zero/ckpt/safetensors.h"
#include "zero/core/error.h"

namespace zero::tools {

namespace {

struct Mapping {
  std::string hf;
  bool transpose = false;  // Linear [out, in] -> Conv1D [in, out]
};

// Our name -> transformers' name.
std::map<std::string, Mapping> gpt_names(std::int64_t n_layer) {
  std::map<std::string, Mapping> m = {{"wte.weight", {"transformer.wte.weight"}},
                                      {"wpe.weight", {"transformer.wpe.weight"}},
                                      {"ln_f.weight", {"transformer.ln_f.weight"}},
                                      {"ln_f.bias", {"transformer.ln_f.bias"}}};
  for (std::int64_t i = 0; i < n_layer; ++i) {
    const std::string ours = "h" + std::to_string(i) + ".", hf = "transformer.h." + std::to_string(i) + ".";
    for (const char* wb : {"weight", "bias"}) {
      const std::string s = wb;
      const bool t = s == "weight";
      m[ours + "ln1." + s] = {hf + "ln_1." + s};
      m[ours + "ln2." + s] = {hf + "ln_2." + s};
      m[ours + "attn.qkv." + s] = {hf + "attn.c_attn." + s, t};
      m[ours + "attn.proj." + s] = {hf + "attn.c_proj." + s, t};
      m[ours + "fc." + s] = {hf + "mlp.c_fc." + s, t};
      m[ours + "proj." + s] = {hf + "mlp.c_proj." + s, t};
    }
  }
  return m;
}

}  // namespace

std::size_t export_gpt_to_hf(const ckpt::OpenCheckpoint& c, const std::filesystem::path& out_dir, std::int64_t n_head) {
  const ckpt::Manifest& man = c.manifest;
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < man.params.size(); ++i) index[man.params[i].name] = i;
  auto shape_of = [&](const std::string& name) {
    auto it = index.find(name);
    ZERO_CHECK(it != index.end(), "checkpoint ", c.folder.string(), " is not a zero::models::Gpt's: it has no '", name,
               "' (export-hf exports that model only; use consolidate for any model)");
    return man.params[it->second].shape;
  };
  const auto wte = shape_of("wte.weight"), wpe = shape_of("wpe.weight");
  std::int64_t n_layer = 0;
  while (index.count("h" + std::to_string(n_layer) + ".ln1.weight")) ++n_layer;
  const nlohmann::json& gpt = man.client_state.contains("gpt") ? man.client_state.at("gpt") : nlohmann::json::object();
  if (n_head == 0) n_head = gpt.value("n_head", std::int64_t{0});
  ZERO_CHECK(n_head > 0, "the checkpoint does not say the GPT's number of heads (no client_state.gpt.n_head): give "
             "it with --n-head");
  const std::int64_t n_embd = wte[1];
  ZERO_CHECK(n_embd % n_head == 0, "--n-head ", n_head, " does not divide the width ", n_embd);
  const std::map<std::string, Mapping> names = gpt_names(n_layer);
  ZERO_CHECK(names.size() == man.params.size(), "checkpoint ", c.folder.string(), " has ", man.params.size(),
             " parameters, a GPT of ", n_layer, " blocks has ", names.size(),
             ": it is not a zero::models::Gpt's (export-hf exports that model only)");

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  ZERO_CHECK(!ec, "cannot create ", out_dir.string(), ": ", ec.message());
  nlohmann::ordered_json cfg = {
      {"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", wte[0]},
      {"n_positions", wpe[0]}, {"n_ctx", wpe[0]}, {"n_embd", n_embd}, {"n_layer", n_layer}, {"n_head", n_head},
      {"n_inner", nullptr}, {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5},
      {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0}, {"initializer_range", 0.02},
      {"scale_attn_weights", true}, {"tie_word_embeddings", true}, {"bos_token_id", 10}, {"eos_token_id", 10},
      {"torch_dtype", "float32"}};
  std::ofstream(out_dir / "config.json") << cfg.dump(2) << "\n";

  std::vector<ckpt::SafetensorsEntry> entries;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < man.params.size(); ++i) {
    auto it = names.find(man.params[i].name);
    ZERO_CHECK(it != names.end(), "checkpoint parameter '", man.params[i].name, "' is not one of a zero::models::Gpt");
    std::vector<std::int64_t> shape = man.params[i].shape;
    if (it->second.transpose && shape.size() == 2) std::swap(shape[0], shape[1]);
    entries.push_back({it->second.hf, "F32", shape, man.params[i].numel * 4});
    order.push_back(i);
  }
  ckpt::SafetensorsWriter w(out_dir / "model.safetensors", entries, {{"format", "pt"}});
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::size_t i = order[k];
    std::vector<float> v = ckpt::read_param(c, i);
    const auto& s = man.params[i].shape;
    if (names.at(man.params[i].name).transpose && s.size() == 2) {
      std::vector<float> t(v.size());
      const std::int64_t rows = s[0], cols = s[1];
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t col = 0; col < cols; ++col) t[static_cast<std::size_t>(col * rows + r)] = v[static_cast<std::size_t>(r * cols + col)];
      v.swap(t);
    }
    w.write(k, 0, v.data(), v.size() * 4);
  }
  w.finish();
  return entries.size();
}

}  // namespace zero::tools
