#include "gpt_hf_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/interrupt_cleanup.h"
#include "common/run_record.h"
#include "zero/ckpt/checkpoint_dir.h"
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

// The shape each parameter of a zero::models::Gpt of this width, vocabulary
// and context has (src/models/gpt.cpp): a checkpoint whose shapes differ
// would export a model transformers refuses, or another model.
std::vector<std::int64_t> gpt_shape(const std::string& name, std::int64_t vocab, std::int64_t ctx, std::int64_t c) {
  auto ends = [&](const char* suffix) { return name.ends_with(suffix); };
  if (name == "wte.weight") return {vocab, c};
  if (name == "wpe.weight") return {ctx, c};
  if (ends("attn.qkv.weight")) return {3 * c, c};
  if (ends("attn.qkv.bias")) return {3 * c};
  if (ends("attn.proj.weight")) return {c, c};
  if (ends(".fc.weight")) return {4 * c, c};
  if (ends(".fc.bias")) return {4 * c};
  if (ends(".proj.weight")) return {c, 4 * c};  // the MLP's (attn.proj is above)
  return {c};                                   // LayerNorms' weights and biases, attn.proj.bias, proj.bias
}

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The heads: the checkpoint's record (zero-train saves client_state.gpt), or
// --n-head where there is none. A --n-head that contradicts the record would
// export another model (the same weights split into other heads).
std::int64_t heads_to_export(const ckpt::OpenCheckpoint& c, std::int64_t n_head) {
  const nlohmann::json& cs = c.manifest.client_state;
  tools::check_run_record(cs, c.folder.string());
  const std::int64_t recorded = cs.contains("gpt") && cs.at("gpt").is_object()
                                    ? cs.at("gpt").value("n_head", std::int64_t{0}) : 0;
  ZERO_CHECK(n_head >= 0, "--n-head must be >= 1, got ", n_head);
  ZERO_CHECK(n_head == 0 || recorded == 0 || n_head == recorded, "--n-head ", n_head, " contradicts the checkpoint: ",
             c.folder.string(), " was trained with n_head ", recorded,
             " (client_state.gpt.n_head); drop --n-head (the checkpoint's value is used)");
  if (n_head == 0) n_head = recorded;
  ZERO_CHECK(n_head > 0, "the checkpoint does not say the GPT's number of heads (no client_state.gpt.n_head): give "
             "it with --n-head");
  return n_head;
}

// The export's folder: created if it is not there, with the folders above
// it that were not (removed again on a failure or an interrupt while empty);
// files written as temporaries beside their final names, removed likewise.
class OutFolder {
 public:
  OutFolder(const std::filesystem::path& dir, InterruptCleanup& cleanup) : dir_(dir), cleanup_(cleanup) {
    std::error_code ec;
    for (std::filesystem::path p = std::filesystem::absolute(dir_, ec); !p.empty() && !std::filesystem::exists(p, ec);
         p = p.parent_path()) {
      created_.insert(created_.begin(), p);  // the top first
      if (p == p.parent_path()) break;
    }
    for (const auto& p : created_) cleanup_.add_folder(p);
    std::filesystem::create_directories(dir_, ec);
    ZERO_CHECK(!ec, "cannot create ", dir_.string(), ": ", ec.message(), "; choose another --out");
  }
  ~OutFolder() {
    if (done_) return;
    for (const auto& p : temporaries_) ::unlink(p.c_str());
    std::error_code ec;
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) std::filesystem::remove(*it, ec);  // only if empty
  }
  OutFolder(const OutFolder&) = delete;
  OutFolder& operator=(const OutFolder&) = delete;

  // A temporary of this export: removed on a failure or an interrupt.
  std::filesystem::path temporary(const std::string& name) {
    const std::filesystem::path tmp = dir_ / (name + ".tmp");
    temporaries_.push_back(tmp);
    cleanup_.add_file(tmp);
    return tmp;
  }
  // `text` into <name>.tmp, fsync'd; returns its path (renamed by the caller).
  std::filesystem::path write_synced(const std::string& name, const std::string& text) {
    const std::filesystem::path tmp = temporary(name);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int e = errno;
    ZERO_CHECK(fd >= 0, "cannot create ", tmp.string(), ": ", std::strerror(e), "; choose another --out");
    std::size_t done = 0;
    int err = 0;
    while (done < text.size() && err == 0) {
      const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) err = w < 0 ? errno : ENOSPC;
      else done += static_cast<std::size_t>(w);
    }
    if (err == 0 && ::fsync(fd) != 0) err = errno;
    ::close(fd);
    ZERO_CHECK(err == 0, "writing ", tmp.string(), " failed: ", std::strerror(err),
               "; free space or choose another --out");
    return tmp;
  }
  // Everything renamed into place: fsync the folder, keep what is there.
  void done() {
    ckpt::fsync_dir(dir_);
    done_ = true;
  }

 private:
  std::filesystem::path dir_;
  InterruptCleanup& cleanup_;
  std::vector<std::filesystem::path> temporaries_, created_;
  bool done_ = false;
};

}  // namespace

std::size_t export_gpt_to_hf(const ckpt::OpenCheckpoint& c, const std::filesystem::path& out_dir, std::int64_t n_head,
                             InterruptCleanup& cleanup) {
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
  n_head = heads_to_export(c, n_head);
  ZERO_CHECK(wte.size() == 2 && wpe.size() == 2, "checkpoint ", c.folder.string(), " is not a zero::models::Gpt's: wte ",
             shape_text(wte), " and wpe ", shape_text(wpe), " are not [vocab, width] and [context, width] "
             "(export-hf exports that model only; use consolidate for any model)");
  const std::int64_t n_embd = wte[1];
  ZERO_CHECK(n_embd % n_head == 0, "--n-head ", n_head, " does not divide the width ", n_embd);
  const std::map<std::string, Mapping> names = gpt_names(n_layer);
  ZERO_CHECK(names.size() == man.params.size(), "checkpoint ", c.folder.string(), " has ", man.params.size(),
             " parameters, a GPT of ", n_layer, " blocks has ", names.size(),
             ": it is not a zero::models::Gpt's (export-hf exports that model only)");

  for (const auto& p : man.params) {
    if (!names.count(p.name)) continue;  // (named below)
    const std::vector<std::int64_t> want = gpt_shape(p.name, wte[0], wpe[0], n_embd);
    ZERO_CHECK(p.shape == want, "checkpoint ", c.folder.string(), " is not a zero::models::Gpt's: '", p.name,
               "' has the shape ", shape_text(p.shape), ", a GPT of width ", n_embd, " has ", shape_text(want),
               " (export-hf exports that model only; use consolidate for any model)");
  }

  OutFolder out(out_dir, cleanup);
  nlohmann::ordered_json cfg = {
      {"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", wte[0]},
      {"n_positions", wpe[0]}, {"n_ctx", wpe[0]}, {"n_embd", n_embd}, {"n_layer", n_layer}, {"n_head", n_head},
      {"n_inner", nullptr}, {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5},
      {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0}, {"initializer_range", 0.02},
      {"scale_attn_weights", true}, {"tie_word_embeddings", true},
      // Bytes, no special token: generation runs to max_new_tokens (a
      // newline as the end would stop it at the first line).
      {"bos_token_id", nullptr}, {"eos_token_id", nullptr},
      {"torch_dtype", "float32"}};

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
  out.temporary("model.safetensors");  // (the writer's: model.safetensors.tmp)
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
  // Both files complete and on disk before either replaces an earlier
  // export's: a failure up to here leaves that export as it was.
  w.sync();
  const std::filesystem::path config_tmp = out.write_synced("config.json", cfg.dump(2) + "\n");
  {
    // The two renames: an interrupt (Ctrl-C, kill) waits until both are
    // done, so that the weights and the config are never of two exports.
    const InterruptCleanup::Hold hold;
    w.commit();
    std::error_code ec;
    std::filesystem::rename(config_tmp, out_dir / "config.json", ec);
    ZERO_CHECK(!ec, "cannot rename ", config_tmp.string(), " to ", (out_dir / "config.json").string(), ": ",
               ec.message(), "; model.safetensors is the new one, config.json the earlier export's: export again");
    out.done();
    cleanup.forget_all();
  }
  return entries.size();
}

}  // namespace zero::tools
