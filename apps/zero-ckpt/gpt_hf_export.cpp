#include "gpt_hf_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

// The export's folder: created if it is not there (and removed again on a
// failure when it was created here and is still empty); files written as
// temporaries beside their final names, removed on a failure.
class OutFolder {
 public:
  explicit OutFolder(const std::filesystem::path& dir) : dir_(dir) {
    std::error_code ec;
    created_ = !std::filesystem::exists(dir_, ec);
    std::filesystem::create_directories(dir_, ec);
    ZERO_CHECK(!ec, "cannot create ", dir_.string(), ": ", ec.message(), "; choose another --out");
  }
  ~OutFolder() {
    if (done_) return;
    for (const auto& p : temporaries_) ::unlink(p.c_str());
    std::error_code ec;
    if (created_) std::filesystem::remove(dir_, ec);  // only removes an empty folder
  }
  OutFolder(const OutFolder&) = delete;
  OutFolder& operator=(const OutFolder&) = delete;

  // `text` into <name>.tmp, fsync'd; returns its path (renamed by the caller).
  std::filesystem::path write_synced(const std::string& name, const std::string& text) {
    const std::filesystem::path tmp = dir_ / (name + ".tmp");
    temporaries_.push_back(tmp);
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
  std::vector<std::filesystem::path> temporaries_;
  bool created_ = false, done_ = false;
};

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
  n_head = heads_to_export(c, n_head);
  const std::int64_t n_embd = wte[1];
  ZERO_CHECK(n_embd % n_head == 0, "--n-head ", n_head, " does not divide the width ", n_embd);
  const std::map<std::string, Mapping> names = gpt_names(n_layer);
  ZERO_CHECK(names.size() == man.params.size(), "checkpoint ", c.folder.string(), " has ", man.params.size(),
             " parameters, a GPT of ", n_layer, " blocks has ", names.size(),
             ": it is not a zero::models::Gpt's (export-hf exports that model only)");

  OutFolder out(out_dir);
  nlohmann::ordered_json cfg = {
      {"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", wte[0]},
      {"n_positions", wpe[0]}, {"n_ctx", wpe[0]}, {"n_embd", n_embd}, {"n_layer", n_layer}, {"n_head", n_head},
      {"n_inner", nullptr}, {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5},
      {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0}, {"initializer_range", 0.02},
      {"scale_attn_weights", true}, {"tie_word_embeddings", true}, {"bos_token_id", 10}, {"eos_token_id", 10},
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
  w.commit();
  std::error_code ec;
  std::filesystem::rename(config_tmp, out_dir / "config.json", ec);
  ZERO_CHECK(!ec, "cannot rename ", config_tmp.string(), " to ", (out_dir / "config.json").string(), ": ",
             ec.message(), "; model.safetensors is the new one, config.json the earlier export's: export again");
  out.done();
  return entries.size();
}

}  // namespace zero::tools
