// zero-ckpt: inspect, verify and convert zerocpp checkpoints, offline, in
// memory bounded by the largest parameter (no LibTorch needed).
//
//   zero-ckpt inspect DIR [--tag T] [--verify]
//   zero-ckpt consolidate DIR [--tag T] --out model.safetensors
//   zero-ckpt export-hf DIR [--tag T] --out HF_DIR [--n-head N]
//
// DIR is the folder given to --save-dir (or Engine::save_checkpoint); the
// tag defaults to the one DIR/latest names. DIR may also be one tag's folder
// (DIR/step-6). Every file's presence and size is checked (a stat each);
// --verify reads them and checks their CRC-32C too.
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include <CLI/CLI.hpp>

#include "common/cli_range.h"
#include "common/interrupt_cleanup.h"
#include "common/option_suggestion.h"
#include "gpt_hf_export.h"
#include "zero/ckpt/checkpoint_dir.h"
#include "zero/ckpt/consolidate.h"
#include "zero/core/error.h"
#include "zero/core/file_kind.h"
#include "zero/version.h"

using namespace zero;

namespace {

double mib(std::uint64_t b) { return static_cast<double>(b) / (1 << 20); }

// DIR may be a tag's own folder (ck/step-6, the one holding the manifest):
// then that checkpoint, and a --tag beside it must name the same.
ckpt::OpenCheckpoint open_given(const std::filesystem::path& dir, const std::string& tag, bool tag_given) {
  const ckpt::TagWording wording{"--tag", "give the folder the checkpoints were saved to (zero-train --save-dir)"};
  std::error_code ec;
  // An unfinished save's own folder (<dir>/<tag>.partial): never a checkpoint.
  const std::filesystem::path named = std::filesystem::weakly_canonical(dir, ec);
  const std::string last = named.filename().string();
  constexpr std::string_view kPartial = ".partial";
  if (last.size() > kPartial.size() && last.compare(last.size() - kPartial.size(), kPartial.size(), kPartial) == 0 &&
      std::filesystem::is_directory(dir, ec)) {
    std::string tags, newest;
    for (const std::string& t : ckpt::list_tags(named.parent_path())) {
      tags += (tags.empty() ? "" : ", ") + t;
      newest = t;
    }
    ZERO_CHECK(false, dir.string(), " is an unfinished save of '", last.substr(0, last.size() - kPartial.size()),
               "' (a .partial folder: its save did not finish, so it is not a checkpoint; the next save of that tag "
               "removes it); ", named.parent_path().string(),
               tags.empty() ? " holds no finished checkpoint"
                            : " holds " + tags + ": give " + named.parent_path().string() + " --tag " + newest);
  }
  if (!std::filesystem::exists(dir / ckpt::kManifestName, ec)) return ckpt::open_checkpoint(dir, tag, wording);
  const std::filesystem::path full = std::filesystem::weakly_canonical(dir, ec);
  const std::string own = full.filename().string();
  // (--tag latest is the default spelt out: the folder given is the one
  // meant, when it is the latest of its parent.)
  bool latest_is_own = false;
  if (tag == ckpt::kLatestName) {
    try {
      latest_is_own = ckpt::resolve_tag(full.parent_path(), tag) == own;
    } catch (const Error&) {
    }
  }
  ZERO_CHECK(!tag_given || tag == own || latest_is_own, dir.string(), " is checkpoint '", own, "' itself (it holds ",
             ckpt::kManifestName, "), but --tag says '", tag, "': drop --tag, or give the parent folder ",
             full.parent_path().string(), " with --tag ", tag);
  return ckpt::open_checkpoint(full.parent_path(), own, wording);
}

// Every file of the manifest present at its recorded size (a stat each):
// a deleted or truncated shard is an error even without --verify.
void check_files(const ckpt::OpenCheckpoint& c) {
  const std::vector<std::string> bad = ckpt::missing_or_short_files(c);
  if (bad.empty()) return;
  std::string list;
  for (const auto& b : bad) list += "; " + b;
  ZERO_CHECK(false, "checkpoint ", c.folder.string(), " is incomplete: ", bad.size(), " of ", c.manifest.files.size(),
             " file(s) missing or not their recorded size", list, ". It cannot be loaded: use another tag");
}

int inspect(const ckpt::OpenCheckpoint& c, bool verify) {
  const ckpt::Manifest& m = c.manifest;
  std::uint64_t total = 0;
  for (const auto& f : m.files) total += f.bytes;
  std::printf("checkpoint %s (format %d)\n", c.folder.c_str(), m.format_version);
  std::printf("  saved by %d rank(s), stage %d, %s, optimizer %s%s%s\n", m.world_size, m.stage, m.dtype.c_str(),
              m.optimizer.c_str(), m.offload ? ", optimizer offloaded (cpu or nvme)" : "", m.delayed_update ? ", delayed update" : "");
  std::printf("  %zu trainable parameter tensors, %llu elements; %zu module tensors (%s)\n",
              m.params.size(), static_cast<unsigned long long>(m.numel()), m.module_tensors.size(),
              m.frozen_excluded ? "buffers; the frozen parameters were not saved: exclude_frozen_parameters"
                                : "frozen, buffers");
  std::printf("  layout: %zu bucket(s), %llu padded elements, partition %llu per rank\n", m.buckets.size(),
              static_cast<unsigned long long>(m.padded_numel), static_cast<unsigned long long>(m.partition_numel));
  char betas[64] = "";
  if (m.engine.betas) std::snprintf(betas, sizeof betas, ", betas [%g, %g]", m.engine.betas->first, m.engine.betas->second);
  std::printf("  step %lld (optimizer step %lld), %lld skipped, lr %g%s, loss scale %g%s\n",
              static_cast<long long>(m.engine.steps), static_cast<long long>(m.engine.optimizer_step),
              static_cast<long long>(m.engine.skipped), m.engine.lr, betas, m.engine.scaler.scale,
              m.engine.update_pending ? ", a delayed update pending" : "");
  if (!m.client_state.empty()) std::printf("  client state: %s\n", m.client_state.dump().c_str());
  // The optimizer settings per parameter (the engine's weight_decay and
  // lr_scale rules), where the checkpoint records them.
  std::map<double, int, std::greater<>> decays, scales;
  for (const auto& p : m.params) {
    if (p.weight_decay) ++decays[*p.weight_decay];
    if (p.lr_scale) ++scales[*p.lr_scale];
  }
  auto counts = [](const char* label, const std::map<double, int, std::greater<>>& by) {
    std::string line = label;
    bool first = true;
    for (const auto& [v, n] : by) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s %.9g on %d", first ? "" : ",", v, n);  // (9 digits tell floats apart)
      line += buf;
      first = false;
    }
    return line;
  };
  if (!decays.empty() || !scales.empty()) {
    std::printf("  settings per parameter: %s; %s\n", counts("weight decay", decays).c_str(),
                counts("lr scale", scales).c_str());
  }
  const auto muon = std::count_if(m.params.begin(), m.params.end(), [](const auto& p) { return p.muon == true; });
  if (m.optimizer == "Muon") {
    std::printf("  Muon: %lld matrices, Adam half: %lld parameters\n", static_cast<long long>(muon),
                static_cast<long long>(m.params.size()) - static_cast<long long>(muon));
  }
  std::printf("  files: %.1f MiB in all\n", mib(total));
  for (const auto& f : m.files) {
    std::printf("    %-28s %10.2f MiB  crc32c %08x ", f.name.c_str(), mib(f.bytes), f.crc32c);
    for (const auto& s : f.sections) {
      if (s.name.rfind("module.", 0) == 0) continue;
      std::printf(" %s", s.name.c_str());
    }
    std::printf("\n");
  }
  check_files(c);
  if (verify) {
    const auto t0 = std::chrono::steady_clock::now();
    ckpt::verify_files(c, [&](std::size_t i) { std::printf("  verified %s\n", m.files[i].name.c_str()); });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  all %zu files verified: sizes and CRC-32C match (%.1f MiB/s)\n", m.files.size(), mib(total) / s);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zero-ckpt: inspect, verify and convert zerocpp checkpoints (docs/checkpoints.md)"};
  app.set_version_flag("--version", std::string("zero-ckpt (zerocpp ") + zero::version() + ")");
  app.require_subcommand(1);
  std::string dir, tag = "latest", out;
  bool verify = false, no_verify = false;
  std::int64_t n_head = 0;
  // Every command reads one checkpoint: DIR and --tag.
  auto add_checkpoint_options = [&](CLI::App* command) {
    command->add_option("dir", dir, "the checkpoint folder (--save-dir), or one tag's folder in it")
        ->required()
        ->check(tools::non_empty_required("a checkpoint folder"));
    command->add_option("--tag", tag, "the checkpoint's tag")
        ->capture_default_str()
        ->check(tools::non_empty("a tag (latest: the newest)"));
  };
  auto* ins = app.add_subcommand("inspect", "print the manifest: layout, step, files, sizes, checksums; exits 1 "
                                 "when a file is missing or not its recorded size");
  add_checkpoint_options(ins);
  ins->add_flag("--verify", verify, "read every file and check its size and CRC-32C");
  auto* con = app.add_subcommand("consolidate",
                                 "one fp32 state dict under the module's names, as safetensors (streamed: memory "
                                 "bounded by the largest parameter)");
  add_checkpoint_options(con);
  con->add_option("--out", out, "the .safetensors file to write (via a .tmp beside it, removed on a failure)")
      ->required()
      ->check(tools::non_empty_required("a file to write"));
  con->add_flag("--no-verify", no_verify, "skip the checksum pass over the files");
  auto* hf = app.add_subcommand("export-hf",
                                "a zero::models::Gpt checkpoint as a Hugging Face GPT-2 folder (config.json, "
                                "model.safetensors) that GPT2LMHeadModel.from_pretrained loads");
  add_checkpoint_options(hf);
  hf->add_option("--out", out, "the folder to write (an earlier export there is replaced only once the new one is "
                 "complete; other files stay)")
      ->required()
      ->check(tools::non_empty_required("a folder to write"));
  hf->add_option("--n-head", n_head,
                 "attention heads, for a checkpoint that does not record them (zero-train's do; a value that "
                 "contradicts the record is an error)")
      ->check(tools::at_least<std::int64_t>(1));
  hf->add_flag("--no-verify", no_verify, "skip the checksum pass over the files");
  if (argc > 1 && argv[1][0] != '-' && app.get_subcommands([&](CLI::App* a) { return a->get_name() == argv[1]; }).empty()) {
    std::fprintf(stderr, "zero-ckpt: unknown command '%s': use inspect, consolidate or export-hf (zero-ckpt --help)\n",
                 argv[1]);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (tools::say_near_options("zero-ckpt", app, e)) return 2;
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a usage error: 2
  }
  try {
    const bool tag_given = app.get_subcommands().front()->get_option("--tag")->count() > 0;
    const ckpt::OpenCheckpoint c = open_given(dir, tag, tag_given);
    if (*ins) return inspect(c, verify);
    // Never into the checkpoint being read: --out over a shard or the tag's
    // folder would destroy it. Where the tag lives in a folder of
    // checkpoints (one with `latest`, a lock file or other tags), not into
    // that folder either (its other tags and `latest`); a tag folder copied
    // alone somewhere (a download) protects only itself.
    {
      namespace fs = std::filesystem;
      const fs::path tag_dir = fs::weakly_canonical(c.folder), save_dir = tag_dir.parent_path();
      const fs::path target = fs::weakly_canonical(fs::absolute(out));
      auto under = [&](const fs::path& top) {
        return std::mismatch(top.begin(), top.end(), target.begin(), target.end()).first == top.end();
      };
      std::error_code ec;
      // (A save folder whose `latest` could not be written still holds tags,
      // or zero-train's lock file.)
      const bool save_folder = fs::exists(save_dir / ckpt::kLatestName, ec) || fs::exists(save_dir / ".lock", ec) ||
                               ckpt::list_tags(save_dir).size() > 1;
      const fs::path& guarded = save_folder ? save_dir : tag_dir;
      ZERO_CHECK(!under(guarded), "--out ", out, " is inside the checkpoint ", save_folder ? "folder " : "",
                 guarded.string(), save_folder ? " (its shards, tags and `latest` live there)" : " (its shards)",
                 ": write the export somewhere else");
      // What is there already must be what is written: the export renames
      // its temporary over it, which would replace a device (/dev/null) or
      // a pipe with a regular file.
      const fs::file_type there = fs::status(out, ec).type();
      const fs::file_type wanted = *con ? fs::file_type::regular : fs::file_type::directory;
      if (there != fs::file_type::not_found && there != fs::file_type::none && there != wanted) {
        ZERO_CHECK(false, "--out ", out, " is ", file_kind_name(there), ": ", *con ? "consolidate writes a .safetensors file" :
                   "export-hf writes a folder (config.json, model.safetensors)", " and puts it in place with a "
                   "rename, which would replace it; give a new path or ", *con ? "an existing file" : "a folder");
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    check_files(c);
    if (!no_verify) ckpt::verify_files(c);
    if (c.manifest.frozen_excluded) {
      std::fprintf(stderr, "zero-ckpt: note: %s was saved without its frozen parameters (exclude_frozen_parameters): "
                   "the export holds the trained parameters and the buffers only\n", c.folder.c_str());
    }
    std::size_t n = 0;
    // A Ctrl-C or kill from here on leaves no temporary (nor a folder the
    // export created) behind.
    tools::InterruptCleanup cleanup;
    if (*con) {
      cleanup.add_file(out + ".tmp");  // (the writer's temporary)
      n = ckpt::consolidate(c, out);
      cleanup.forget_all();
    } else {
      n = tools::export_gpt_to_hf(c, out, n_head, cleanup);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "%s: %zu tensors, %llu parameters from %s in %.2f s%s\n", out.c_str(), n,
                 static_cast<unsigned long long>(c.manifest.numel()), c.folder.c_str(), s,
                 no_verify ? " (checksums not verified)" : ", checksums verified");
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "zero-ckpt: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-ckpt: unexpected error: %s\n", e.what());
    return 1;
  }
}
