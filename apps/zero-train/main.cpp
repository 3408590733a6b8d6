// zero-train: trains a GPT on a text corpus with zerocpp's engine.
//
//   zero-train [--config ds.json] [--model gpt2-tiny] [--steps 300] [corpus paths...]
//   mpirun -np 4 --bind-to none zero-train --config stage2_offload.json --report r.json
//
// Without --config, the embedded default is ZeRO-2 + CPU offload + bf16 with
// AdamW (fp32 on a CPU without native bf16: train_precision.h). Without
// corpus paths, the English text of Debian's `fortunes`.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <new>
#include <optional>
#include <random>
#include <sstream>
#include <utility>

#include <ATen/ops/from_blob.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/utils.h>

#include "common/cli_range.h"
#include "common/option_suggestion.h"
#include "zero/core/cpu_cores.h"
#include "zero/core/log.h"
#include "common/run_record.h"
#include "common/printable_text.h"
#include "common/tool_paths.h"
#include "common/usage_rank.h"
#include "checkpoint_rotation.h"
#include "init_weights.h"
#include "loss_history.h"
#include "progress.h"
#include "torch_threads.h"
#include "rank_agreement.h"
#include "run_files.h"
#include "stop_signals.h"
#include "wall_clock.h"
#include "train_device.h"
#include "train_precision.h"
#include "train_report.h"
#include "common/trainer_autos.h"
#include "zero/ckpt/checkpoint_dir.h"
#include "zero/ckpt/save_dir_lock.h"
#include "zero/ckpt/safetensors_reader.h"
#include "zero/ckpt/consolidate.h"
#include "zero/ckpt/crc32c.h"
#include "zero/comm/communicator.h"
#include "zero/comm/comm_errors.h"
#include "zero/comm/fail_job.h"
#include "zero/comm/launcher_env.h"
#include "zero/config/config.h"
#include "zero/core/cpu_bf16.h"
#include "zero/core/error.h"
#include "zero/core/text_list.h"
#include "zero/core/host_memory.h"
#include "zero/data/batch_sampler.h"
#include "zero/data/byte_tokenizer.h"
#include "zero/data/text_corpus.h"
#include "zero/engine/engine.h"
#include "zero/engine/lr_schedule.h"
#include "zero/models/gpt.h"
#include "zero/zero/flat_layout.h"
#include "zero/zero/memory_estimate.h"
#include "zero/version.h"

namespace fs = std::filesystem;
using namespace zero;

namespace {

// What a run out of memory outside the engine (a micro-batch's activations
// in forward or backward) can change.
constexpr const char* kOutOfMemoryFix =
    "Lower train_micro_batch_size_per_gpu (raise gradient_accumulation_steps to keep the batch), shorten "
    "--seq-len, use --checkpoint-activations, or run fewer ranks per node";

// LibTorch's own error without its C++ backtrace (what() carries one), and
// for an allocation that failed, what to do about it.
std::string libtorch_error_message(const c10::Error& e) {
  const std::string said = e.what_without_backtrace();
  const bool memory = dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
                      said.find("can't allocate memory") != std::string::npos ||
                      said.find("not enough memory") != std::string::npos ||
                      said.find("out of memory") != std::string::npos;
  if (!memory) return said;
  return "out of memory while training: " + said + ". " + kOutOfMemoryFix;
}

using train::kDefaultConfig;

struct Options {
  std::string config_path, model = "gpt2-tiny", report, out_dir = "runs/latest", device = "auto";
  std::string save_dir, resume, init_from;
  std::int64_t save_every = 0, keep_last = 0;
  bool sync_save = false;
  std::string on_save_error = "stop";
  std::string decay = "matrices";  // which parameters take the config's weight decay
  std::int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0, seq_len = 0;
  std::int64_t steps = 300, warmup = -1, eval_every = 50, eval_batches = 8, sample = 0;
  double min_lr_ratio = 0.1;
  bool warmup_given = false, min_lr_ratio_given = false, checkpoint_activations = false;
  std::uint64_t seed = 1234;
  bool seed_given = false;  // --seed on the command line
  bool resume_auto = false;  // --resume auto, resolved to latest or none (resolve_auto_resume)
  int threads = 0;          // LibTorch's intra-op threads per rank (0: chosen, torch_threads.h)
  std::vector<std::string> corpus;
};

// The options that shape the training, which every rank must share (not
// --out, --report or the corpus's paths: rank 0 writes the outputs, and
// the corpus's bytes are compared).
std::vector<std::pair<std::string, std::string>> training_options(const Options& o) {
  auto n = [](auto v) { return std::to_string(v); };
  return {{"--model", o.model},          {"--device", o.device},
          {"--save-dir", o.save_dir},    {"--resume", o.resume},   {"--init-from", o.init_from},
          {"--save-every", n(o.save_every)}, {"--keep-last", n(o.keep_last)}, {"--sync-save", n(o.sync_save)},
          {"--on-save-error", o.on_save_error}, {"--decay", o.decay},
          {"--n-layer", n(o.n_layer)},   {"--n-head", n(o.n_head)},
          {"--n-embd", n(o.n_embd)},     {"--block-size", n(o.block_size)},
          {"--seq-len", n(o.seq_len)},   {"--steps", n(o.steps)},
          {"--warmup", n(o.warmup)},     {"--eval-every", n(o.eval_every)},
          {"--eval-batches", n(o.eval_batches)}, {"--sample", n(o.sample)},
          {"--min-lr-ratio", n(o.min_lr_ratio)}, {"--checkpoint-activations", n(o.checkpoint_activations)},
          {"--seed", n(o.seed)}};
}

// The GPT: the preset, with the shape options given (0: the preset's).
// Throws zero::Error for an unknown preset, or heads that do not split the
// width, naming the options.
models::GptConfig gpt_config(const Options& o) {
  models::GptConfig gc = models::gpt_preset(o.model);
  if (o.n_layer) gc.n_layer = o.n_layer;
  if (o.n_head) gc.n_head = o.n_head;
  if (o.n_embd) gc.n_embd = o.n_embd;
  if (o.block_size) gc.block_size = o.block_size;
  ZERO_CHECK(gc.n_embd % gc.n_head == 0, "the width ", gc.n_embd, o.n_embd ? " (--n-embd)" : " (the preset's)",
             " is not a multiple of the heads ", gc.n_head, o.n_head ? " (--n-head)" : " (the preset's)",
             ": each head takes an equal share of it; give --n-embd a multiple of ", gc.n_head,
             " or --n-head a divisor of ", gc.n_embd);
  return gc;
}

// The warm-up of zero-train's own schedule, and of an "auto" one: --warmup,
// or max(1, steps/10).
std::int64_t warmup_steps(const Options& o) {
  return o.warmup >= 0 ? o.warmup : std::max<std::int64_t>(1, o.steps / 10);
}

at::Tensor make_batch(const std::vector<std::uint8_t>& data, const std::vector<std::int64_t>& offsets,
                      std::int64_t seq_len) {
  std::vector<std::int64_t> ids;
  ids.reserve(offsets.size() * static_cast<std::size_t>(seq_len + 1));
  for (std::int64_t off : offsets)
    for (std::int64_t i = 0; i <= seq_len; ++i) ids.push_back(data[static_cast<std::size_t>(off + i)]);
  return at::from_blob(ids.data(), {static_cast<std::int64_t>(offsets.size()), seq_len + 1}, at::kLong).clone();
}

// The validation loss: the mean over --eval-batches global batches of the
// validation split, each of the training's global batch size and split over
// the ranks as training batches are (BatchSampler), so that it depends on
// the weights, the corpus, the seed and the global batch alone: not on the
// ranks, nor on how the global batch is cut into micro-batches (a resume on
// another world size evaluates the same sequences).
// stop_agreed(): after each global batch, whether the ranks agreed to stop
// (a collective, on every rank alike): a stop signal then abandons the
// evaluation (nullopt), which holds no state, instead of keeping a
// scheduler that gives 30 s waiting for the rest of it.
std::optional<double> evaluate(models::Gpt& model, comm::Communicator& comm, const data::Corpus& corpus,
                               const Options& o, std::int64_t micro, std::int64_t accumulation,
                               const c10::Device& device, const std::function<bool()>& stop_agreed) {
  at::NoGradGuard no_grad;
  data::BatchSampler sampler(static_cast<std::int64_t>(corpus.validation.size()), o.seq_len, micro, accumulation,
                             comm.world_size(), comm.rank(), o.seed + 1);
  float sum = 0.0f;
  for (std::int64_t b = 0; b < o.eval_batches; ++b) {
    for (std::int64_t j = 0; j < accumulation; ++j) {
      at::Tensor batch = make_batch(corpus.validation, sampler.offsets(b, j), o.seq_len).to(device);
      sum += model.loss(batch.narrow(1, 0, o.seq_len), batch.narrow(1, 1, o.seq_len)).item<float>();
    }
    // (A stop agreed after the last batch keeps the finished evaluation.)
    if (stop_agreed() && b + 1 < o.eval_batches) return std::nullopt;
  }
  comm.all_reduce(&sum, 1, DType::kFloat32)->wait();
  return sum / static_cast<double>(o.eval_batches * accumulation * comm.world_size());
}

// What the corpus line says of links and files met twice (nothing when none).
// The optimizer settings a checkpoint records beside the lr and the decay,
// and a resumed run compares with its own (each changes the training from
// the resumed step on, as the lr does): the betas (not Adagrad's), eps (not
// Lion's) and the clipping norm.
nlohmann::json optimizer_record(const config::Config& cfg) {
  // As the config wrote them (0.9, not the float's 0.8999999761581421).
  auto as_written = [](float x) {
    char text[32];
    std::snprintf(text, sizeof text, "%.7g", static_cast<double>(x));
    return std::strtod(text, nullptr);
  };
  nlohmann::json r = {{"gradient_clipping", as_written(cfg.gradient_clipping)}};
  if (!cfg.optimizer.is_adagrad()) r["betas"] = {as_written(cfg.optimizer.beta1), as_written(cfg.optimizer.beta2)};
  if (!cfg.optimizer.is_lion()) r["eps"] = as_written(cfg.optimizer.eps);
  return r;
}

// "warning: the checkpoint was trained with betas [0.9,0.95], this run's
// config has [0.5,0.9]: ...", for each recorded setting that changed.
void warn_of_changed_optimizer(const nlohmann::json& saved, const nlohmann::json& now) {
  if (!saved.is_object()) return;  // a checkpoint from before the record
  struct Key {
    const char* name;
    const char* config_key;
  };
  for (const Key k : {Key{"betas", "optimizer.params.betas"}, Key{"eps", "optimizer.params.eps"},
                      Key{"gradient_clipping", "gradient_clipping"}}) {
    const auto was = saved.find(k.name);
    const auto is = now.find(k.name);
    if (was == saved.end() || is == now.end() || *was == *is) continue;
    std::fprintf(stderr, "warning: the checkpoint was trained with %s %s, this run's config has %s: training from "
                 "here on uses the new one; to continue as it was, give a --config whose %s is %s\n",
                 k.name, was->dump().c_str(), is->dump().c_str(), k.config_key, was->dump().c_str());
  }
}

std::string corpus_links_note(const data::Corpus& c) {
  std::string note;
  if (c.empty_files > 0) note += ", " + std::to_string(c.empty_files) + " of them empty";
  if (c.skipped_links > 0) {
    note += ", " + std::to_string(c.skipped_links) + " link(s) to folders, devices or nothing not followed: name "
            "such a folder itself";
  }
  if (c.skipped_special > 0) {
    note += ", " + std::to_string(c.skipped_special) + " pipe(s), socket(s) or device(s) skipped";
  }
  if (c.duplicates > 0) note += ", " + std::to_string(c.duplicates) + " met twice and read once";
  return note;
}

std::string generate(models::Gpt& model, std::int64_t n, std::int64_t block, std::uint64_t seed,
                     const c10::Device& device) {
  at::NoGradGuard no_grad;
  torch::manual_seed(seed);
  std::vector<std::int64_t> ids = data::encode_bytes("\n");
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t start = std::max<std::int64_t>(0, static_cast<std::int64_t>(ids.size()) - block);
    std::vector<std::int64_t> ctx(ids.begin() + start, ids.end());
    at::Tensor x = at::from_blob(ctx.data(), {1, static_cast<std::int64_t>(ctx.size())}, at::kLong).to(device);
    at::Tensor logits = model.forward(x).select(1, -1).to(at::kFloat) / 0.8;
    const std::int64_t next = at::multinomial(at::softmax(logits, -1), 1).item<std::int64_t>();
    ids.push_back(next);
  }
  return data::decode_bytes(std::vector<std::int64_t>(ids.begin() + 1, ids.end()));
}

// with_val: val.dat has points (gnuplot warns about a series without any).
void write_plot(const fs::path& dir, bool with_val) {
  const fs::path script = dir / "plot.gp";
  std::ofstream gp(script);
  gp << "set terminal png size 1000,420\nset output '" << (dir / "training.png").string() << "'\n"
     << "set multiplot layout 1,2\nset xlabel 'step'\nset ylabel 'loss (nats)'\nset title 'loss'\n"
     << "plot '" << (dir / "loss.dat").string() << "' using 1:2 with lines title 'train'";
  if (with_val) gp << ", '" << (dir / "val.dat").string() << "' using 1:2 with linespoints title 'validation'";
  gp << "\n"
     << "set ylabel 'MiB'\nset title 'memory per tier (rank 0)'\n"
     << "plot '" << (dir / "loss.dat").string() << "' using 1:($3/1048576) with lines title 'device', '' using 1:($4/1048576) with lines title 'host'\n"
     << "unset multiplot\n";
  gp.close();
  {  // gnuplot draws nothing but warnings from fewer than two points
    std::ifstream in(dir / "loss.dat");
    std::string line;
    int points = 0;
    while (points < 2 && std::getline(in, line)) ++points;
    if (points < 2) {
      std::fprintf(stderr, "plot: skipped (one step: nothing to draw); the data is in %s\n", (dir / "loss.dat").c_str());
      return;
    }
  }
  // posix_spawnp, not std::system: no shell to quote the path for, and the
  // signals keep their handlers while gnuplot runs (system() ignores SIGINT).
  const std::string script_path = script.string();
  char* argv[] = {const_cast<char*>("gnuplot"), const_cast<char*>(script_path.c_str()), nullptr};
  pid_t pid = 0;
  const int spawn_error = ::posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv, environ);
  if (spawn_error != 0) {
    std::fprintf(stderr, "plot: skipped (gnuplot: %s; scripts/setup installs gnuplot-nox); the data is in %s\n",
                 spawn_error == ENOENT ? "not found" : std::strerror(spawn_error), (dir / "loss.dat").c_str());
    return;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (rc == 0) {
    std::fprintf(stderr, "plot: %s\n", (dir / "training.png").c_str());
  } else {
    std::fprintf(stderr, "plot: gnuplot failed (status %d) on %s; its message is above, the data is in %s\n", rc,
                 script.c_str(), (dir / "loss.dat").c_str());
  }
}

// CLI11 checks of a number, run on the value given (not on the default);
// CLI11 puts the flag in front: "--steps: must be >= 1, got 0".
using tools::at_least;
using tools::in_range;
// CLI11 would read -1 into an unsigned seed as 2^64-1.
// At most 2^63-1: the config's seed, and the report's, are JSON integers
// that DeepSpeed reads as signed (a larger one would come back as -1).
CLI::Validator seed_number() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        const bool digits = !in.empty() &&
                            std::all_of(in.begin(), in.end(), [](char c) { return c >= '0' && c <= '9'; });
        std::uint64_t v = 0;
        const auto [end, ec] = std::from_chars(in.data(), in.data() + in.size(), v);
        const bool fits = digits && ec == std::errc() && end == in.data() + in.size() &&
                          v <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
        return fits ? std::string() : "must be a whole number in [0, 2^63-1], got " + in;
      },
      "in [0, 2^63-1]");
}

// The output paths, checked before anything is built, so that a typo costs
// no training: --out created now (every rank: each may write its flight
// recorder there), the --report file opened for writing on rank 0 (and
// removed again if it was not there: it is written at the end).
using tools::file_in_the_way;

// Checkpoints of an earlier run in --save-dir past where this run starts:
// its saves replace those at the same steps, and `latest` follows this run.
// Said before training, so that a resume from an earlier tag (a branch) does
// not silently overwrite the run it branched from.
void warn_of_later_checkpoints(const Options& o, std::int64_t from_step) {
  std::vector<std::string> tags;
  for (const std::string& tag : ckpt::list_tags(o.save_dir)) {
    const auto step = train::step_of_tag(tag);
    if (step && *step > from_step) tags.push_back(tag);
  }
  if (tags.empty()) return;
  const std::string later = zero::detail::join_first(tags, 4);
  // Without --save-every this run may save nothing, and `latest` then goes
  // on naming the other run's newest: a later --resume latest continues it.
  std::string now;
  try {
    now = ckpt::resolve_tag(o.save_dir, ckpt::kLatestName, {"--resume", ""});
  } catch (const Error&) {
  }
  const std::string latest =
      o.save_every > 0 || now.empty()
          ? "`latest` will name this run's newest"
          : "`latest` names " + now + " until this run saves (without --save-every only a signal saves: a later "
            "--resume latest would continue from " + now + ", not from this run)";
  std::fprintf(stderr, "zero-train: warning: --save-dir %s holds checkpoints past step %lld, where this run starts "
               "(%s): this run's saves replace those at the same steps, and %s; give another --save-dir to keep "
               "them\n", o.save_dir.c_str(), static_cast<long long>(from_step), later.c_str(), latest.c_str());
}

void prepare_outputs(const Options& o, bool root) {
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) {
    const fs::path blocker = file_in_the_way(o.out_dir);  // if that is why
    ZERO_CHECK(false, "--out ", o.out_dir, ": cannot create the folder (", ec.message(), ")",
               blocker.empty() ? "" : ": " + blocker.string() + " is a file, not a folder",
               "; give a folder that can be created, or an existing one (--out)");
  }
  ZERO_CHECK(fs::is_directory(o.out_dir, ec), "--out ", o.out_dir, " is not a folder: give a folder (--out)");
  // A resume from a folder that is not there: a typo, said as one (not
  // "holds no finished checkpoint" of a folder made for it).
  if (!o.resume.empty()) {
    ZERO_CHECK(fs::is_directory(o.save_dir, ec), "--save-dir ", o.save_dir, " is not ",
               fs::exists(o.save_dir, ec) ? "a folder" : "there", ", so there is no checkpoint to --resume ", o.resume,
               ": give the folder the checkpoints were saved to, or start without --resume (a new run)");
  }
  // --save-dir: a file in the way is found now, not at the first save
  // (unless saves may fail: --on-save-error continue warns at each).
  if (!o.save_dir.empty() && o.on_save_error != "continue") {
    const fs::path blocker = file_in_the_way(fs::absolute(o.save_dir));
    ZERO_CHECK(blocker.empty(), "--save-dir ", o.save_dir, ": ", blocker.string(),
               " is a file, not a folder: give a folder that can be created, or an existing one (--save-dir)");
    // ... and a folder this process cannot write in (a read-only mount, an
    // archive), the nearest one that exists.
    fs::path there = fs::absolute(o.save_dir);
    while (!fs::exists(there, ec) && there != there.parent_path()) there = there.parent_path();
    if (::access(there.c_str(), W_OK | X_OK) != 0) {
      const int e = errno;
      ZERO_CHECK(false, "--save-dir ", o.save_dir, ": cannot write in ", there.string(), " (", std::strerror(e),
                 "), so no checkpoint could be saved: give a writable folder (--save-dir), or --on-save-error "
                 "continue to train without saving (resuming from a read-only folder, say)");
    }
    // ... and one that cannot be made (under /proc, say): made now, as
    // --out is (every rank writes its shards there) ...
    std::error_code made;
    fs::create_directories(o.save_dir, made);
    ZERO_CHECK(!made || fs::is_directory(o.save_dir, ec), "--save-dir ", o.save_dir, ": cannot create the folder (",
               made.message(), "), so no checkpoint could be saved: give a folder that can be created, or an existing "
               "one (--save-dir), or --on-save-error continue to train without saving");
  }
  if (!root || o.report.empty()) return;
  const bool existed = fs::exists(o.report, ec);
  const int fd = ::open(o.report.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const int e = errno;
  const fs::path folder = fs::path(o.report).parent_path();
  ZERO_CHECK(fd >= 0, "--report ", o.report, ": cannot write the file (", std::strerror(e), ")",
             e == ENOENT ? ": the folder " + (folder.empty() ? fs::path(".") : folder).string() +
                               (fs::is_directory(folder.empty() ? fs::path(".") : folder, ec)
                                    ? " does not take new files" : " does not exist")
                         : "",
             "; give a file in an existing, writable folder (--report)");
  ::close(fd);
  if (!existed) ::unlink(o.report.c_str());
}

// A checkpoint of another GPT shape (another preset, --n-layer, ...) is
// refused before the model is built, naming the options that give the
// saved one; the parameter shapes alone would fail later, in the engine's
// words, and tell neither the preset nor the heads. (Older checkpoints
// without the record: the engine's shape check.)
void check_saved_model(const nlohmann::json& client, const Options& o, const std::string& folder) {
  const models::GptConfig now = gpt_config(o);
  if (!client.is_object()) return;
  const auto g = client.find("gpt");
  if (g == client.end() || !g->is_object()) return;
  models::GptConfig saved = now;
  saved.vocab_size = g->value("vocab_size", now.vocab_size);
  saved.n_layer = g->value("n_layer", now.n_layer);
  saved.n_head = g->value("n_head", now.n_head);
  saved.n_embd = g->value("n_embd", now.n_embd);
  saved.block_size = g->value("block_size", now.block_size);
  auto shape = [](const models::GptConfig& c) {
    return zero::detail::str_cat(c.n_layer, c.n_layer == 1 ? " layer x " : " layers x ", c.n_embd, " wide, ",
                                 c.n_head, c.n_head == 1 ? " head, context " : " heads, context ", c.block_size,
                                 ", vocabulary ", c.vocab_size);
  };
  if (shape(saved) == shape(now)) return;
  // The options that give the saved shape: its preset, and an override
  // for each field where the preset differs.
  const std::string preset = client.value("model", std::string());
  std::string fix;
  models::GptConfig base = saved;
  try {
    base = models::gpt_preset(preset, saved.vocab_size);
    fix = "--model " + preset;
  } catch (const Error&) {
    fix = "--model <any preset>";
    base = models::GptConfig{};
    base.n_layer = base.n_head = base.n_embd = base.block_size = 0;
  }
  std::string drop;  // overrides given that the saved shape does not need
  auto add = [&](const char* option, std::int64_t want, std::int64_t has, std::int64_t given) {
    if (want != has) {
      fix += zero::detail::str_cat(" ", option, " ", want);
    } else if (given != 0) {
      drop += zero::detail::str_cat(drop.empty() ? " (without " : ", ", option);
    }
  };
  add("--n-layer", saved.n_layer, base.n_layer, o.n_layer);
  add("--n-head", saved.n_head, base.n_head, o.n_head);
  add("--n-embd", saved.n_embd, base.n_embd, o.n_embd);
  add("--block-size", saved.block_size, base.block_size, o.block_size);
  if (!drop.empty()) fix += drop + ")";
  ZERO_CHECK(saved.vocab_size == now.vocab_size, "checkpoint ", folder, " was trained with a vocabulary of ",
             saved.vocab_size, ", this run's model has ", now.vocab_size, ": it is not a zero-train byte-level GPT "
             "of this version; start without --resume (a new run)");
  ZERO_CHECK(false, "checkpoint ", folder, " is of another model: ", shape(saved),
             preset.empty() ? std::string() : " (" + preset + ")", "; this run's: ", shape(now),
             ". Resume with ", fix, ", or start without --resume (a new run)");
}

// For a checkpoint that failed to load: the others in --save-dir, newest
// first, and the option that resumes from the newest.
std::string other_checkpoints(const Options& o) {
  std::string failed = o.resume;
  try {
    failed = ckpt::resolve_tag(o.save_dir, o.resume, {"--resume", ""});
  } catch (const Error&) {
  }
  std::vector<std::string> others;
  for (const std::string& t : ckpt::list_tags(o.save_dir)) {
    if (t != failed) others.push_back(t);
  }
  if (others.empty()) {
    return ". --save-dir " + o.save_dir + " holds no other checkpoint: start without --resume (a new run)";
  }
  std::string list;
  for (auto it = others.rbegin(); it != others.rend(); ++it) list += (list.empty() ? "" : ", ") + *it;
  return ". The other checkpoints in --save-dir " + o.save_dir + ", newest first: " + list + "; resume from one with "
         "--resume " + others.back();
}

// --resume auto, for a job script a scheduler requeues (one command for the
// first start and every restart): `latest` where --save-dir holds a
// checkpoint, else a new run, from --init-from's weights where given. Not
// "none", so --resume latest's error says what is there: a folder holding
// tags but no readable `latest`, a tag's own folder given as --save-dir, a
// path that is not a folder. Every rank decides from the folder, and the
// ranks must agree (a --save-dir not shared between nodes: an error).
// Collective.
void resolve_auto_resume(Options& o, comm::Communicator& comm) {
  if (o.resume != "auto") return;
  o.resume_auto = true;
  const bool root = comm.rank() == 0;
  std::error_code ec;
  const fs::path dir(o.save_dir);
  const bool any = fs::exists(dir, ec) &&
                   (!fs::is_directory(dir, ec) || fs::exists(dir / ckpt::kLatestName, ec) ||
                    fs::exists(dir / ckpt::kManifestName, ec) || !ckpt::list_tags(dir).empty());
  // The highest rank that sees checkpoints and the highest that sees none,
  // each + 1 (0: no such rank), to name them when both are there.
  const float me = static_cast<float>(comm.rank() + 1);
  float seen[2] = {any ? me : 0.0f, any ? 0.0f : me};
  comm::AllReduceOptions most;
  most.op = comm::ReduceOp::kMax;
  comm.all_reduce(seen, 2, DType::kFloat32, most)->wait();
  ZERO_CHECK(seen[0] == 0.0f || seen[1] == 0.0f, "--resume auto: the ranks see --save-dir ", o.save_dir,
             " differently: on rank ", static_cast<int>(seen[0]) - 1, " it holds checkpoints, on rank ",
             static_cast<int>(seen[1]) - 1, " none (a folder local to each node?): give every node the same shared ",
             "folder");
  if (!any) {
    o.resume.clear();
    if (root) {
      std::fprintf(stderr, "resume: --resume auto: --save-dir %s holds no checkpoint yet: a new run from step 0%s\n",
                   o.save_dir.c_str(), o.init_from.empty() ? "" : (", from --init-from " + o.init_from).c_str());
    }
    return;
  }
  o.resume = ckpt::kLatestName;
  if (root) {
    std::fprintf(stderr, "resume: --resume auto: --save-dir %s holds checkpoints: resuming from latest%s\n",
                 o.save_dir.c_str(), o.init_from.empty() ? "" : " (--init-from is for the first start: not used)");
  }
  o.init_from.clear();
}

// With --resume, the checkpoint is found and its step read before the model
// is built: a wrong tag, or a checkpoint with nothing left to train, ends
// the run at once. Returns the saved step.
std::int64_t resume_step(const Options& o) {
  ckpt::OpenCheckpoint c;
  try {
    c = ckpt::open_checkpoint(o.save_dir, o.resume, {"--resume", "start without --resume (a new run)"});
  } catch (const Error& e) {
    // A damaged manifest: which other checkpoints there are.
    const std::string said = e.what();
    if (said.find("load another tag") == std::string::npos && said.find("Load another tag") == std::string::npos) throw;
    throw Error(said + other_checkpoints(o));
  }
  const nlohmann::json& client = c.manifest.client_state;
  tools::check_run_record(client, c.folder.string());
  const std::int64_t step = client.is_object() ? client.value("step", std::int64_t{0}) : 0;
  check_saved_model(client, o, c.folder.string());
  if (o.resume_auto && step == o.steps) return step;  // a finished run requeued (run() says so)
  ZERO_CHECK(step < o.steps, "checkpoint ", c.folder.string(), " is at step ", step,
             step == o.steps ? " and --steps is " : ", past --steps ", o.steps,
             ": nothing left to train; raise --steps above ", step, " (the total, counted from step 0)");
  return step;
}

int run(const Options& cli, std::unique_ptr<comm::Communicator>& comm_out) {
  Options o = cli;
  // From here, SIGTERM/SIGINT/SIGUSR2 stop the run at the end of a step,
  // with a checkpoint, and SIGUSR1 saves one (stop_signals.h); one that
  // comes while MPI starts or the model is built is acted on after the
  // first step.
  train::StopSignals signals;
  comm_out = comm::make_communicator();
  comm::Communicator* comm = comm_out.get();
  const bool root = comm->rank() == 0;
  {
    const int cores = usable_cores();
    train::ThreadChoice t = train::choose_torch_threads(o.threads, std::getenv("OMP_NUM_THREADS"), cores,
                                                       comm::launcher_local_size().value_or(1));
    if (t.threads > cores) {
      // More only contend for the cores (and spin: docs/train.md, "Threads").
      t.warning += (t.warning.empty() ? "" : "; ") + t.why + " " + std::to_string(t.threads) +
                   " is more than the " + std::to_string(cores) +
                   " cores this process may run on: LibTorch uses " + std::to_string(cores);
      t.threads = cores;
    }
    at::set_num_threads(t.threads);
    if (root) {
      if (!t.warning.empty()) std::fprintf(stderr, "zero-train: warning: %s\n", t.warning.c_str());
      std::fprintf(stderr, "threads: %d LibTorch thread%s per rank (%s%s)\n", t.threads, t.threads == 1 ? "" : "s",
                   t.why.c_str(), t.why == "--threads" ? "" : "; --threads N sets it");
    }
  }
  resolve_auto_resume(o, *comm);
  prepare_outputs(o, root);
  // One job per --save-dir, for the whole run (ckpt/save_dir_lock.h): a
  // second one would replace this one's tags. (A folder that cannot be
  // written, with --on-save-error continue, saves nothing to guard.)
  std::optional<ckpt::SaveDirLock> save_dir_lock;
  if (root && !o.save_dir.empty()) {
    std::error_code ec;
    if (o.on_save_error == "continue") fs::create_directories(o.save_dir, ec);  // (made by prepare_outputs otherwise)
    if (fs::is_directory(o.save_dir, ec) && ::access(o.save_dir.c_str(), W_OK | X_OK) == 0) {
      save_dir_lock.emplace(o.save_dir, "--save-dir");
      if (!save_dir_lock->warning().empty()) {
        std::fprintf(stderr, "zero-train: warning: %s\n", save_dir_lock->warning().c_str());
      }
    }
  }
  // ... and one per --out: a second run there (the default runs/latest, a
  // run started twice) would write into this one's metrics and plot.
  std::optional<ckpt::SaveDirLock> out_lock;
  if (root) {
    std::error_code ec;
    const bool shared = !o.save_dir.empty() && fs::equivalent(o.out_dir, o.save_dir, ec);
    if (!shared) {
      out_lock.emplace(o.out_dir, "--out", "two runs writing one folder mix their metrics.jsonl, loss.dat and plot");
      if (!out_lock->warning().empty()) std::fprintf(stderr, "zero-train: warning: %s\n", out_lock->warning().c_str());
    }
  }
  const std::int64_t saved_step = o.resume.empty() ? 0 : resume_step(o);
  if (o.resume_auto && saved_step == o.steps) {
    // The same command run again after the run finished (a scheduler's
    // requeue after the last save): nothing to do is no failure.
    if (root) {
      std::fprintf(stderr, "resume: --resume auto: the newest checkpoint in %s is at step %lld, --steps: the run is "
                   "complete; nothing to train (raise --steps to train on)\n", o.save_dir.c_str(),
                   static_cast<long long>(saved_step));
    }
    return 0;
  }
  if (root && !o.save_dir.empty()) warn_of_later_checkpoints(o, saved_step);
  if (root && !o.save_dir.empty() && o.save_every == 0) {
    std::fprintf(stderr, "checkpoints: --save-dir without --save-every: saved only when a signal asks (SIGUSR1 saves "
                 "one and trains on; SIGTERM, SIGINT, SIGUSR2 save and stop); --save-every K saves every K steps and "
                 "the last\n");
  }
  // A Hugging Face config's "auto"s take zero-train's values, as the
  // Trainer gives them its own.
  train::FilledAutos autos;
  if (!o.config_path.empty()) {
    train::TrainerSettings settings;
    settings.steps = o.steps;
    settings.warmup = warmup_steps(o);
    settings.warmup_given = o.warmup >= 0;
    settings.micro_batch = config::parse_config(kDefaultConfig, 1).train_micro_batch_size_per_gpu;
    autos = train::fill_trainer_autos(config::read_config_text(o.config_path), settings);
  }
  config::Config cfg = o.config_path.empty() ? config::parse_config(kDefaultConfig, comm->world_size(), "<default config>")
                                             : config::parse_config(autos.text, comm->world_size(), o.config_path);
  // The config's seed is zero-train's when --seed is not given.
  if (cfg.seed_given && !o.seed_given) {
    // (The parser refuses a negative seed.)
    o.seed = static_cast<std::uint64_t>(cfg.seed);
  } else if (cfg.seed_given && static_cast<std::uint64_t>(cfg.seed) != o.seed) {
    cfg.warnings.push_back("--seed " + std::to_string(o.seed) + " overrides the config's seed " +
                           std::to_string(cfg.seed));
  }
  cfg.seed = static_cast<std::int64_t>(o.seed);  // (what the report's config says)
  cfg.seed_given = true;
  if (root) {
    if (!autos.filled.empty()) {
      std::string list;
      for (const std::string& f : autos.filled) list += (list.empty() ? "" : ", ") + f;
      std::fprintf(stderr, "config: %s's \"auto\" values, filled as the Hugging Face Trainer fills them: %s\n",
                   o.config_path.c_str(), list.c_str());
    }
    for (const auto& w : cfg.warnings) std::fprintf(stderr, "config warning: %s\n", w.c_str());
    std::fprintf(stderr, "batch: %s\n", cfg.batch_summary().c_str());
  }
  models::GptConfig gc = gpt_config(o);
  // Activation checkpointing: as in Megatron-DeepSpeed, the model invokes it
  // (--checkpoint-activations) and the config's section says how; a config
  // that asks for the checkpoints on the host turns it on as well.
  const auto& ac = cfg.activation_checkpointing;
  gc.checkpoint_activations = o.checkpoint_activations || ac.cpu_checkpointing;
  gc.checkpoint_on_cpu = ac.cpu_checkpointing;
  if (root) {
    if (ac.partition_activations) {
      std::fprintf(stderr, "config warning: activation_checkpointing.partition_activations has no effect: it splits "
                           "checkpoints across model-parallel ranks, and zerocpp has no model parallelism\n");
    }
    if (ac.contiguous_memory_optimization) {
      std::fprintf(stderr, "config warning: activation_checkpointing.contiguous_memory_optimization has no effect "
                           "in zerocpp\n");
    }
    // (--warmup that filled an "auto" warm-up is used.)
    const bool warmup_ignored = o.warmup_given && !autos.filled_warmup;
    if (!cfg.scheduler.type.empty() && (warmup_ignored || o.min_lr_ratio_given)) {
      std::fprintf(stderr, "warning: %s ignored: the config's scheduler (%s) sets the LR\n",
                   warmup_ignored && o.min_lr_ratio_given ? "--warmup and --min-lr-ratio are"
                   : warmup_ignored                       ? "--warmup is"
                                                          : "--min-lr-ratio is",
                   cfg.scheduler.type.c_str());
    }
  }
  if (o.seq_len == 0) o.seq_len = gc.block_size;
  ZERO_CHECK(o.seq_len <= gc.block_size, "--seq-len ", o.seq_len, " is longer than the model's block_size ",
             gc.block_size, ": use --seq-len <= ", gc.block_size, " or --block-size ", o.seq_len);
  // (As the user resolved it, before paths made absolute on this node.)
  const std::string resolved_config = config::to_json(cfg).dump();
  // Timeouts and the flight recorder for zero-train's own collectives too;
  // the flight-recorder files go beside the metrics unless the config says.
  if (cfg.flight_recorder.dir.empty()) cfg.flight_recorder.dir = (fs::absolute(o.out_dir) / "flight-recorder").string();
  comm->set_timeout(std::chrono::milliseconds(static_cast<std::int64_t>(cfg.comm_timeout * 1000.0)));
  comm->set_flight_recorder(static_cast<std::size_t>(cfg.flight_recorder.entries), cfg.flight_recorder.dir);
  std::vector<fs::path> paths(o.corpus.begin(), o.corpus.end());
  if (paths.empty()) paths = data::default_corpus_files();
  const data::Corpus corpus = data::load_corpus(paths);
  // Every rank the same training, before anything collective depends on it.
  train::check_ranks_agree(*comm, train::fingerprint_run(training_options(o), resolved_config, corpus.train,
                                                         corpus.validation));
  // Each split holds at least one sequence (and its next byte), said before
  // the model is built; the validation split is the corpus's last 10%.
  ZERO_CHECK(static_cast<std::int64_t>(corpus.train.size()) > o.seq_len + 1, "the training split (the first 90% of "
             "the corpus: ", corpus.train.size(), " bytes) is shorter than one sequence of ", o.seq_len + 1,
             " bytes: give more text, or a shorter --seq-len");
  ZERO_CHECK(o.eval_every == 0 || static_cast<std::int64_t>(corpus.validation.size()) > o.seq_len + 1,
             "the validation split (the last 10% of the corpus: ", corpus.validation.size(), " bytes) is shorter than "
             "one sequence of ", o.seq_len + 1, " bytes: give more text, a shorter --seq-len, or --eval-every 0 (no "
             "validation)");
  // The corpus as a checkpoint records it, to tell another one at a resume
  // (read only where there are checkpoints).
  nlohmann::json corpus_id;
  if (!o.save_dir.empty()) {
    char crc_hex[16];
    std::snprintf(crc_hex, sizeof crc_hex, "%08x", ckpt::crc32c(0, corpus.train.data(), corpus.train.size()));
    corpus_id = {{"train_bytes", corpus.train.size()}, {"crc32c", crc_hex}};
  }
  torch::manual_seed(o.seed);
  const train::TrainDevice td = train::choose_device(o.device, *comm);
  if (root) std::fprintf(stderr, "%s\n", td.reason.c_str());
  const train::PrecisionChoice pc =
      train::choose_precision(td.device.is_cpu(), cfg.bf16.enabled, cfg.fp16.enabled,
                              /*config_given=*/!o.config_path.empty() && !autos.filled_bf16, cpu_bf16());
  cfg.bf16.enabled = pc.bf16;
  if (root && !pc.line.empty()) std::fprintf(stderr, "%s\n", pc.line.c_str());
  // Built on the meta device: no rank holds the model before the engine
  // fills it on its device, bucket by bucket (at stage 3 only its partition
  // stays). GPT-2's initialisation draws on the host: the same weights as a
  // model built on the CPU, on any device.
  auto model = std::make_shared<models::Gpt>(gc, /*on_meta=*/true);
  // --init-from: the weights of a safetensors file (zero-ckpt consolidate's)
  // instead of GPT-2's initialisation, checked against the model first.
  std::shared_ptr<const ckpt::SafetensorsReader> weights;
  if (!o.init_from.empty()) {
    weights = train::open_init_weights(o.init_from, *model);
    if (root) std::fprintf(stderr, "%s\n", train::describe_init_weights(*weights, *model).c_str());
  }
  EngineOptions build;
  build.device = td.device;
  build.init = [gpt = model.get(), weights](const std::string& name, const at::Tensor& value) {
    if (!weights || !train::fill_from_weights(*weights, name, value)) gpt->init_parameter(name, value);
  };
  // As GPT-2 and nanoGPT train: the weight matrices and the embedding
  // decay, biases and LayerNorm gains do not (the engine says how many of
  // each).
  if (o.decay == "matrices" && cfg.optimizer.weight_decay > 0.0f) build.weight_decay = no_decay_below_2d();
  if (root && o.decay == "all" && cfg.optimizer.weight_decay > 0.0f && !cfg.optimizer.is_muon()) {
    std::int64_t elements = 0;
    const auto params = model->parameters();
    for (const at::Tensor& p : params) elements += p.numel();
    std::fprintf(stderr, "zero-train: weight decay %g on all %zu parameters (%.2fM elements; --decay all)\n",
                 static_cast<double>(cfg.optimizer.weight_decay), params.size(), static_cast<double>(elements) / 1e6);
  }
  // Muon for the blocks' matrices; the token and position tables (the
  // token table is the output head too) take its Adam half, as DeepSpeed's
  // choice leaves embeddings and lm_head to Adam.
  if (cfg.optimizer.is_muon()) build.use_muon = muon_except_named({"wte", "wpe"});
  // What the host offers before the engine allocates (the engine checks its
  // own buffers against it; on the CPU the activations come out of it too).
  const std::optional<std::int64_t> host_available = host_memory_available();
  cfg.warnings.clear();  // (printed above, in zero-train's words)
  Engine engine(model, cfg, td.device_comm ? *td.device_comm : *comm, std::move(build));
  const std::int64_t micro = cfg.train_micro_batch_size_per_gpu, accum = cfg.gradient_accumulation_steps;
  if (cfg.device_memory_limit > 0 || (td.device.is_cpu() && host_available)) {
    // The engine's persistent buffers are already checked against the budget
    // (and the host); the activations of one micro-batch and the transient
    // gradient buckets (allocated in the first backward) come on top
    // (zero-estimate's formulas).
    EstimateInput in;
    in.params = engine.num_parameters();
    in.world = comm->world_size();
    in.stage = cfg.zero_optimization.stage;
    in.offload = cfg.zero_optimization.offload_optimizer.device != "none";
    in.nvme = cfg.zero_optimization.offload_optimizer.device == "nvme";
    in.nvme_buffers = cfg.zero_optimization.offload_optimizer.buffer_count;
    in.sub_group_elements = cfg.zero_optimization.sub_group_size;
    in.dpu = in.offload && cfg.zero_optimization.offload_optimizer.delayed_param_update;
    in.on_gpu = td.device.is_cuda();
    in.accumulation = static_cast<int>(accum);
    in.moments = cfg.optimizer.moments();
    in.element_bytes = static_cast<int>(c10::elementSize(engine.dtype()));
    in.micro_batch = micro;
    in.seq_len = o.seq_len;
    in.n_layer = gc.n_layer;
    in.n_embd = gc.n_embd;
    in.n_head = gc.n_head;
    in.vocab = gc.vocab_size;
    in.param_numels = gc.parameter_numels();
    in.param_units = gc.parameter_units();
    in.offload_param = cfg.zero_optimization.offload_param.device == "cpu";
    in.prefetch_elements = cfg.zero_optimization.stage3_prefetch_bucket_size;
    in.max_live_elements = cfg.zero_optimization.stage3_max_live_parameters;
    in.persistence_threshold = cfg.zero_optimization.stage3_param_persistence_threshold;
    in.bucket_numel = static_cast<std::int64_t>(bucket_numel_from_config(cfg.zero_optimization.reduce_bucket_size));
    in.checkpoint_activations = gc.checkpoint_activations;
    in.cpu_checkpointing = gc.checkpoint_on_cpu;
    const MemoryEstimate est = estimate_memory(in);
    const auto snap = engine.ledger().snapshot();
    const std::int64_t activations = est.device_activations;
    const std::int64_t buckets = std::max<std::int64_t>(
        0, est.device_buckets - snap.current[static_cast<int>(memory::Tier::kDevice)][static_cast<int>(memory::Kind::kBuckets)]);
    // Stage 3's gathered units live beside the activations and the buckets
    // through forward and backward (zero-estimate's device total), as do
    // the block inputs cpu_checkpointing keeps in host memory.
    const std::int64_t gathered = est.device_gathered;
    const std::int64_t host_checkpoints = est.host_activations;
    const std::int64_t transient = buckets + gathered + activations;
    // "34.0 MiB of activations, 7.2 MiB of gathered stage-3 units and 10.4
    // MiB of gradient buckets".
    const std::string transient_parts =
        memory::format_bytes(activations) + " of activations" + (gc.checkpoint_activations ? " (checkpointed)" : "") +
        (gathered > 0 ? ", " + memory::format_bytes(gathered) + " of gathered stage-3 units" : std::string{}) +
        " and " + memory::format_bytes(buckets) + " of gradient buckets";
    const std::int64_t held = snap.tier_current[static_cast<int>(memory::Tier::kDevice)];
    // (The units' bound is the unit in use plus what prefetch holds.)
    const std::string units_fix =
        gathered > 0 ? "lower stage3_prefetch_bucket_size or stage3_max_live_parameters (fewer units gathered at "
                       "once), "
                     : "";
    if (td.device.is_cpu() && host_available) {
      // On the CPU the "device" is host memory: the engine's buffers (both
      // tiers), the buckets and the activations, times the ranks on this node.
      const std::int64_t engine_holds = snap.tier_current[static_cast<int>(memory::Tier::kHost)] + held;
      const std::int64_t per_rank = engine_holds + transient + host_checkpoints;
      const std::int64_t local = comm::launcher_local_size().value_or(1);
      // The lowest rank that is short (the world size when none is): it
      // says by how much, the others name it (one error line for the job).
      // (The max of the negated ranks is the lowest.)
      float first_short = -static_cast<float>(per_rank * local > *host_available ? comm->rank() : comm->world_size());
      comm::AllReduceOptions lowest;
      lowest.op = comm::ReduceOp::kMax;
      comm->all_reduce(&first_short, 1, DType::kFloat32, lowest)->wait();
      first_short = -first_short;
      ZERO_CHECK(first_short != static_cast<float>(comm->rank()), "host memory: a micro-batch of ", micro,
                 " x ", o.seq_len, " tokens needs about ", transient_parts,
                 host_checkpoints > 0 ? ", with " + memory::format_bytes(host_checkpoints) +
                                            " of block inputs kept in host memory (cpu_checkpointing),"
                                      : std::string{},
                 " beside the ", memory::format_bytes(engine_holds),
                 " the engine holds: ", memory::format_bytes(per_rank), " per rank, ",
                 memory::format_bytes(per_rank * local), " for the ", local, " rank(s) on this node, but ",
                 memory::format_bytes(*host_available), " is available (", host_memory_source(),
                 "): lower train_micro_batch_size_per_gpu (and raise gradient_accumulation_steps), shorten "
                 "--seq-len, ", gc.checkpoint_activations ? "" : "use --checkpoint-activations, ", units_fix,
                 "or run fewer ranks per node");
      if (first_short < static_cast<float>(comm->world_size())) {
        const int r = static_cast<int>(first_short);
        throw comm::ForAnotherRank<Error>(zero::detail::str_cat("host memory: rank ", r, " found its node's host memory "
                                                          "too small for a micro-batch (its message says by how much)"),
                                          r);
      }
    }
    ZERO_CHECK(cfg.device_memory_limit <= 0 || held + transient <= cfg.device_memory_limit, "a micro-batch of ",
               micro, " x ", o.seq_len, " tokens needs about ", transient_parts, " on top of the ",
               memory::format_bytes(held),
               " the engine holds, past device_memory_limit ",
               memory::format_bytes(cfg.device_memory_limit),
               ": lower train_micro_batch_size_per_gpu (and raise gradient_accumulation_steps), shorten --seq-len, ",
               gc.checkpoint_activations ? "" : "use --checkpoint-activations, ", units_fix,
               "or raise device_memory_limit");
  }
  if (root) {
    std::fprintf(stderr,
                 "model: %s, %lld layer%s x %lld wide, %lld head%s, context %lld: %.2fM parameters%s\n"
                 "corpus: %zu train + %zu validation bytes from %lld file(s) (%lld binary skipped%s); unigram entropy %.3f nats\n",
                 o.model.c_str(), (long long)gc.n_layer, gc.n_layer == 1 ? "" : "s", (long long)gc.n_embd,
                 (long long)gc.n_head, gc.n_head == 1 ? "" : "s",
                 (long long)gc.block_size, engine.num_parameters() / 1e6,
                 !gc.checkpoint_activations ? "" : gc.checkpoint_on_cpu ? ", activations checkpointed per block on the host"
                                                                        : ", activations checkpointed per block",
                 corpus.train.size(), corpus.validation.size(),
                 (long long)corpus.files, (long long)corpus.skipped_binary, corpus_links_note(corpus).c_str(),
                 corpus.unigram_entropy_nats());
    // An evaluation reads random windows of the validation split: past a few
    // times its size it reads the same bytes again, for no better estimate.
    const double eval_tokens = static_cast<double>(o.eval_batches) * static_cast<double>(micro * accum) *
                               comm->world_size() * static_cast<double>(o.seq_len);
    const double times = eval_tokens / static_cast<double>(std::max<std::size_t>(corpus.validation.size(), 1));
    if (o.eval_every > 0 && times > 4.0) {
      const std::int64_t enough = std::max<std::int64_t>(
          1, static_cast<std::int64_t>(static_cast<double>(o.eval_batches) * 2.0 / times));
      std::fprintf(stderr, "zero-train: warning: --eval-batches %lld reads %.0f tokens per evaluation, %.0fx the "
                   "validation split's %zu bytes: the same windows again, for no better estimate; --eval-batches "
                   "%lld reads it about twice\n", static_cast<long long>(o.eval_batches), eval_tokens, times,
                   corpus.validation.size(), static_cast<long long>(enough));
    }
  }
  config::SchedulerConfig sched = cfg.scheduler;
  if (sched.type.empty()) {  // --warmup + cosine to min_lr_ratio * lr
    sched.type = "WarmupCosineLR";
    sched.warmup_num_steps = warmup_steps(o);
    sched.total_num_steps = o.steps;
    sched.warmup_type = "linear";
    sched.cos_min_ratio = static_cast<float>(o.min_lr_ratio);
    // DeepSpeed's warm-up lasts at least 2 steps: --warmup 0 warms from lr to lr.
    if (sched.warmup_num_steps == 0) sched.warmup_min_lr = cfg.optimizer.lr;
  }
  const LrSchedule schedule(sched, cfg.optimizer.lr);
  // The rate of the next step (the config's scheduler is the engine's).
  auto next_lr = [&] { return cfg.scheduler.type.empty() ? schedule.lr(engine.stats().step) : engine.lr(); };
  if (root) {
    // A DeepSpeed config without a scheduler means a constant rate there;
    // zero-train's own schedule applies instead, said here with the way out.
    const char* source = !cfg.scheduler.type.empty() ? " (the config's scheduler)"
                         : o.config_path.empty()     ? " (zero-train's schedule: --warmup, --min-lr-ratio)"
                                                     : " (zero-train's schedule, as the config has no \"scheduler\"; "
                                                       "--warmup 0 --min-lr-ratio 1 keeps the lr constant, as "
                                                       "DeepSpeed would)";
    std::fprintf(stderr, "lr: %s%s\n", schedule.describe().c_str(), source);
    // A warm-up as long as the run never reaches the peak rate (and the
    // first step runs at the warm-up's start, 0 by default): said, not refused
    // (a short test run of a long schedule is legitimate).
    const std::int64_t warm = std::max<std::int64_t>(2, sched.warmup_num_steps);  // DeepSpeed's least: 2
    if (cfg.scheduler.type.empty() && sched.warmup_num_steps > 0 && warm >= o.steps) {
      std::fprintf(stderr, "warning: the warm-up (%lld steps) is not shorter than the run (--steps %lld): the peak lr "
                           "%g is never reached%s; shorten --warmup or raise --steps\n",
                   static_cast<long long>(warm), static_cast<long long>(o.steps),
                   static_cast<double>(cfg.optimizer.lr), o.steps == 1 ? " and the one step runs at lr 0" : "");
    }
  }
  data::BatchSampler sampler(static_cast<std::int64_t>(corpus.train.size()), o.seq_len, micro, accum,
                             comm->world_size(), comm->rank(), o.seed);
  // Resume: the engine's state, and from the client state where the data
  // and the schedule stand (both functions of the step).
  std::int64_t first_step = 0;
  if (!o.resume.empty()) {
    nlohmann::json client;
    // The engine's line on per-parameter settings that differ (weight
    // decay) advises EngineOptions rules; zero-train says the same change
    // below in its own terms (weight_decay, --decay), for a checkpoint of
    // its own. The line is held until the load says whose it is.
    std::vector<std::string> held;
    struct SinkRestore {
      LogSink previous;
      bool restored = false;
      void restore() {
        if (!std::exchange(restored, true)) set_log_sink(std::move(previous));
      }
      ~SinkRestore() { restore(); }
    } sink;
    // (Every other line goes to stderr, where zero-train's sink, the
    // default, sends it: reading sink.previous here would race with its
    // assignment below on a thread that logs meanwhile.)
    sink.previous = set_log_sink([&held](const LogRecord& r) {
      if (r.topic == log_topic::checkpoint_param_settings) {
        held.emplace_back(r.text);
      } else {
        log_to_stderr(r);
      }
    });
    try {
      client = engine.load_checkpoint(o.save_dir, o.resume);
    } catch (const Error& e) {
      // The engine's words are a C++ caller's (EngineOptions' rules); here
      // those settings come from zero-train's options. (An error another
      // rank raised stays marked so: the job prints it once.)
      const std::string said = e.what();
      const auto* for_other = dynamic_cast<const comm::RaisedForAnotherRank*>(&e);
      auto rethrow = [&](const std::string& message) -> void {
        if (for_other != nullptr) throw comm::ForAnotherRank<Error>(message, for_other->failed_rank());
        throw Error(message);
      };
      // A damaged, truncated or incomplete checkpoint: which others there are.
      if (said.find("load another tag") != std::string::npos ||
          said.find("load a good checkpoint") != std::string::npos || said.find("Load another tag") != std::string::npos) {
        rethrow(said + other_checkpoints(o));
      }
      if (said.find("holds the state of optimizer") != std::string::npos) {
        rethrow(said + ". In zero-train the optimizer is the config's optimizer.type: resume with a --config "
                    "whose optimizer is the checkpoint's (zero-ckpt inspect shows it), or start a new run from its "
                    "weights with this one (zero-ckpt consolidate " + o.save_dir + " --tag " + o.resume +
                    " --out w.safetensors, then --init-from w.safetensors instead of --resume)");
      }
      if (said.find("EngineOptions") == std::string::npos && said.find("fresh engine") == std::string::npos) throw;
      rethrow(said + ". In zero-train, the settings per parameter follow --decay (the weight decay of the "
                  "matrices only, or of all parameters) and Muon's matrices the config's optimizer.type: resume "
                  "with the --decay and the optimizer the checkpoint was trained with (zero-ckpt inspect shows them)");
    }
    sink.restore();
    if (!client.contains("weight_decay")) {
      for (const std::string& line : held) log(LogLevel::warning, log_topic::checkpoint_param_settings, line);
    }
    first_step = client.value("step", std::int64_t{0});
    // (A save of the same tag between resume_step() and here would change it.)
    ZERO_CHECK(first_step == saved_step, "checkpoint '", o.resume, "' in ", o.save_dir, " changed while the model was "
               "built (step ", saved_step, ", now ", first_step, "): another job saves there; resume again");
    // The heads split n_embd without a parameter of their own: no shape
    // tells a checkpoint of 2 heads from one of 4. (Older checkpoints have
    // no "gpt" record: nothing to compare.)
    if (const auto g = client.find("gpt"); g != client.end() && g->is_object()) {
      const std::int64_t saved_heads = g->value("n_head", gc.n_head);
      ZERO_CHECK(saved_heads == gc.n_head, "checkpoint '", o.resume, "' in ", o.save_dir, " was trained with ",
                 saved_heads, " attention heads, this run's model has ", gc.n_head,
                 " (--n-head or the preset): its weights would compute another model. Resume with --n-head ",
                 saved_heads);
    }
    if (root && client.value("seed", o.seed) != o.seed) {
      std::fprintf(stderr, "warning: the checkpoint was trained with --seed %llu, this run has --seed %llu: the data "
                   "order from here on differs from the saved run's\n",
                   static_cast<unsigned long long>(client.value("seed", o.seed)), static_cast<unsigned long long>(o.seed));
    }
    // The global batch follows the ranks unless the config fixes it (the
    // default config fixes the micro-batch): say so when it moved.
    const std::int64_t saved_batch = client.value("train_batch_size", cfg.train_batch_size);
    if (root && saved_batch != cfg.train_batch_size) {
      // Without --config the fix is a whole config: the default one, with
      // this run's precision and the saved batch (the accumulation follows).
      std::string fix = "set train_batch_size in the config (--config)";
      const std::int64_t per_window = cfg.train_micro_batch_size_per_gpu * comm->world_size();
      if (o.config_path.empty() && per_window > 0 && saved_batch % per_window == 0) {
        nlohmann::json d = nlohmann::json::parse(kDefaultConfig);
        d.erase("gradient_accumulation_steps");
        d["train_batch_size"] = saved_batch;
        d["bf16"]["enabled"] = cfg.bf16.enabled;
        fix = "give a --config file holding zero-train's default config with that batch: " + d.dump();
      }
      std::fprintf(stderr, "warning: the checkpoint was trained with a global batch of %lld sequences, this run has "
                   "%lld (%s): the optimizer sees other batches from here on; to keep %lld, %s\n",
                   static_cast<long long>(saved_batch), static_cast<long long>(cfg.train_batch_size),
                   cfg.batch_summary().c_str(), static_cast<long long>(saved_batch), fix.c_str());
    }
    // What else the run was trained with, where it changed: the sequence
    // length, the corpus (its training bytes' size and CRC-32C), the lr.
    if (root && client.contains("seq_len") && client.value("seq_len", o.seq_len) != o.seq_len) {
      std::fprintf(stderr, "warning: the checkpoint was trained with --seq-len %lld, this run has %lld: the batches "
                   "from here on are other sequences (give --seq-len %lld to continue as it was)\n",
                   static_cast<long long>(client.value("seq_len", o.seq_len)), static_cast<long long>(o.seq_len),
                   static_cast<long long>(client.value("seq_len", o.seq_len)));
    }
    if (root && client.contains("corpus") && client["corpus"] != corpus_id) {
      std::fprintf(stderr, "warning: the checkpoint was trained on another corpus (%s; this run's: %s): the data from "
                   "here on differs from the saved run's\n", client["corpus"].dump().c_str(), corpus_id.dump().c_str());
    }
    // (A checkpoint of a zero-train without --decay decayed every parameter.)
    const std::string saved_decay = client.value("decay", std::string("all"));
    if (root && saved_decay != o.decay && cfg.optimizer.weight_decay > 0.0f) {
      std::fprintf(stderr, "warning: the checkpoint was trained with --decay %s, this run has --decay %s: other "
                   "parameters take weight decay from here on (give --decay %s to continue as it was)\n",
                   saved_decay.c_str(), o.decay.c_str(), saved_decay.c_str());
    }
    if (root && client.contains("lr") && client.value("lr", 0.0) != static_cast<double>(cfg.optimizer.lr)) {
      std::fprintf(stderr, "warning: the checkpoint was trained with lr %g, this run's config has %g: the schedule "
                   "from here on follows the new one\n", client.value("lr", 0.0), static_cast<double>(cfg.optimizer.lr));
    }
    if (root && client.contains("weight_decay") &&
        client.value("weight_decay", 0.0) != static_cast<double>(cfg.optimizer.weight_decay)) {
      std::fprintf(stderr, "warning: the checkpoint was trained with weight_decay %g, this run's config has %g: to "
                   "continue as it was, give a --config whose optimizer.params.weight_decay is %g\n",
                   client.value("weight_decay", 0.0), static_cast<double>(cfg.optimizer.weight_decay),
                   client.value("weight_decay", 0.0));
    }
    if (root) warn_of_changed_optimizer(client.value("optimizer", nlohmann::json()), optimizer_record(cfg));
    // The schedule (--steps, --warmup, --min-lr-ratio, the config's
    // scheduler): said with the rate of the next step, before and now. (A
    // changed lr is said above, and changes the schedule's words too.)
    if (root && client.contains("schedule") && client.value("schedule", std::string()) != schedule.describe() &&
        client.value("lr", 0.0) == static_cast<double>(cfg.optimizer.lr)) {
      // A run that had finished (its step at its own --steps) can only go on
      // under a longer schedule: said, without advice that cannot be taken.
      const bool extended = first_step >= client.value("steps", std::numeric_limits<std::int64_t>::max());
      const std::string fix =
          extended ? "the saved run had ended, so a longer run's schedule is its own (--warmup 0 --min-lr-ratio 1 "
                     "keeps the rate constant instead)"
                   : "to continue as it was, give the saved run's --steps, --warmup and --min-lr-ratio (or its "
                     "scheduler)";
      std::fprintf(stderr, "warning: the checkpoint was trained with the lr schedule \"%s\", this run's is \"%s\": "
                   "step %lld trains at lr %.4g (the saved run's next: %.4g) and the rate follows the new schedule "
                   "from here on; %s\n",
                   client.value("schedule", std::string()).c_str(), schedule.describe().c_str(),
                   static_cast<long long>(first_step + 1), static_cast<double>(next_lr()),
                   client.value("next_lr", static_cast<double>(next_lr())), fix.c_str());
    }
    if (root) {
      std::fprintf(stderr, "resuming at step %lld of %lld\n", static_cast<long long>(first_step),
                   static_cast<long long>(o.steps));
    }
  }
  // (Resumed: the earlier run's lines up to the checkpoint's step are kept.)
  train::RunFiles files;
  if (root) {
    const std::string moved = files.open(o.out_dir, first_step);
    if (!moved.empty()) std::fprintf(stderr, "zero-train: warning: %s\n", moved.c_str());
  }
  train::Progress progress(cfg.steps_per_print);
  const double flops_per_token = gc.flops_per_token(o.seq_len);
  const double tokens_per_step = static_cast<double>(micro * accum * o.seq_len * comm->world_size());
  train::LossHistory history(!o.report.empty(), o.steps - first_step, o.eval_every);
  double total_seconds = 0.0;
  std::optional<double> last_val;  // none when no evaluation ran
  std::int64_t last_val_step = 0;
  comm::CommStats last_comm, run_comm;  // this rank's: the last step, and the sum over steps
  std::string stopped_by;  // the signal(s) that stopped the run ("" when none did)
  std::int64_t last_saved = -1;   // the step of the last checkpoint committed
  std::int64_t saving_step = -1;  // the step of the save made last (committed or not)
  std::string newest_saved;       // this run's newest committed tag ("": none yet)
  auto report_saved = [&] {
    const Engine::CheckpointTiming& c = engine.last_checkpoint();
    last_saved = saving_step;  // (called once a save is committed)
    newest_saved = c.tag;
    if (!root) return;
    // (Rank 0 alone removes: the folder is the one every rank saved into.)
    std::string removed;
    if (o.keep_last > 0) {
      const train::Rotation r = train::rotate_checkpoints(o.save_dir, saving_step, o.keep_last);
      for (const std::string& tag : r.removed) removed += (removed.empty() ? "" : ", ") + tag;
      if (!removed.empty()) removed = "; removed " + removed + " (--keep-last " + std::to_string(o.keep_last) + ")";
      if (!r.error.empty()) {
        std::fprintf(stderr, "zero-train: warning: --keep-last: %s; training goes on\n", r.error.c_str());
      }
    }
    std::fprintf(stderr, "checkpoint %s saved in %s: rank 0 wrote %.1f MiB in %.2f s, training stalled %.1f ms%s%s\n",
                 c.tag.c_str(), o.save_dir.c_str(), static_cast<double>(c.bytes) / (1 << 20), c.write_s,
                 c.stall_s * 1e3, c.async ? " (asynchronous save)" : "", removed.c_str());
  };
  // A save that fails (a full disk, a folder gone) fails on every rank at
  // once (zero::ckpt::CheckpointSaveError): with --on-save-error continue
  // the run says so and goes on, with the state in memory intact.
  std::int64_t failed_saves = 0;
  auto newest_committed = [&] {
    if (!newest_saved.empty()) return newest_saved;
    std::ifstream in(fs::path(o.save_dir) / ckpt::kLatestName);
    std::string tag;
    return std::getline(in, tag) ? tag : std::string("none");
  };
  auto save_failed = [&](const ckpt::CheckpointSaveError& e) {
    if (o.on_save_error != "continue") throw;
    const std::string tag = "step-" + std::to_string(saving_step);
    const char* after = !stopped_by.empty() ? "the run stops all the same"
                        : saving_step == o.steps ? "training is complete" : "training goes on";
    // In place, with a `latest` that could not follow: saved all the same.
    if (std::string_view(e.what()).find(ckpt::committed_without_latest(tag)) != std::string_view::npos) {
      last_saved = saving_step;
      newest_saved = tag;
      if (root) std::fprintf(stderr, "zero-train: warning: %s; %s (--on-save-error continue)\n", e.what(), after);
      return;
    }
    ++failed_saves;
    if (root) {
      std::fprintf(stderr, "zero-train: warning: %s; %s (--on-save-error continue, %lld failed save(s) so far); the "
                   "newest checkpoint committed is %s\n",
                   e.what(), after, static_cast<long long>(failed_saves), newest_committed().c_str());
    }
  };
  // An asynchronous save still in flight: written and committed (or its
  // failure said). Returns whether it was committed (false: none in flight).
  auto finish_in_flight = [&] {
    if (!engine.checkpoint_in_flight()) return false;
    try {
      engine.wait_checkpoint();
      report_saved();
      return true;
    } catch (const ckpt::CheckpointSaveError& e) {
      save_failed(e);
      return false;
    }
  };
  // A checkpoint of the state after `done` steps. A save still in flight is
  // finished (and said so) first. Returns whether this one was saved (or,
  // asynchronous, is under way).
  auto save_at = [&](std::int64_t done, bool async, const std::string& why) {
    finish_in_flight();
    const std::string tag = "step-" + std::to_string(done);
    if (root) {
      std::fprintf(stderr, "checkpoint %s: saving to %s%s%s\n", tag.c_str(), o.save_dir.c_str(), why.c_str(),
                   async ? " (training goes on while it is written)" : "");
    }
    const nlohmann::json client = {{"step", done}, {"seed", o.seed}, {"model", o.model},
                                   {"seq_len", o.seq_len}, {"steps", o.steps}, {"corpus", corpus_id},
                                   {"lr", static_cast<double>(cfg.optimizer.lr)},
                                   {"weight_decay", static_cast<double>(cfg.optimizer.weight_decay)}, {"decay", o.decay},
                                   {"train_batch_size", cfg.train_batch_size},
                                   {"optimizer", optimizer_record(cfg)}, {"schedule", schedule.describe()},
                                   {"next_lr", static_cast<double>(next_lr())},
                                   {"gpt", {{"vocab_size", gc.vocab_size}, {"block_size", gc.block_size},
                                            {"n_layer", gc.n_layer}, {"n_head", gc.n_head}, {"n_embd", gc.n_embd}}}};
    try {
      saving_step = done;
      engine.save_checkpoint(o.save_dir, tag, client, async);
      if (!async) report_saved();
      return true;
    } catch (const ckpt::CheckpointSaveError& e) {
      save_failed(e);
      return false;
    }
  };
  // A stop signal agreed on after `done` steps: said once, by rank 0. After
  // the last step the run is complete (`skipped`: what it leaves out).
  auto note_stop = [&](const std::string& names, std::int64_t done, const char* skipped) {
    stopped_by = names;
    if (!root) return;
    if (done == o.steps) {
      std::fprintf(stderr, "zero-train: %s after the last step: training is complete; %s\n", names.c_str(), skipped);
    } else {
      std::fprintf(stderr, "zero-train: %s: stopping after step %lld of %lld%s\n", names.c_str(),
                   static_cast<long long>(done), static_cast<long long>(o.steps),
                   o.save_dir.empty() ? " (no --save-dir: nothing is saved; the steps trained are lost)" : "");
    }
  };
  // The signals every rank received since the last call, summed (collective).
  auto agree_signals = [&] {
    std::array<float, train::StopSignals::kCount> counts = signals.take_counts();
    comm->all_reduce(counts.data(), counts.size(), DType::kFloat32)->wait();
    return train::signal_verdict(counts);
  };
  // step(), which commits an asynchronous save at the end of a window: a
  // failed commit throws before the call counts, so it is called again.
  auto step_engine = [&] {
    try {
      engine.step();
    } catch (const ckpt::CheckpointSaveError& e) {
      save_failed(e);
      engine.step();
    }
  };
  // wall_clock_breakdown: the engine's timeline, summed by phase and said
  // with the progress, every steps_per_print steps (rank 0's).
  std::int64_t traced_steps = 0;
  if (cfg.wall_clock_breakdown) engine.trace(true);
  const auto run_start = std::chrono::steady_clock::now();
  for (std::int64_t step = first_step; step < o.steps; ++step) {
    const bool saving = engine.checkpoint_in_flight();
    // A config's scheduler is the engine's (stepped as DeepSpeed does, after
    // each step taken); zero-train's own follows the steps taken too, so
    // that a skipped step does not move the warm-up on.
    if (cfg.scheduler.type.empty()) engine.set_lr(schedule.lr(engine.stats().step));
    const auto t0 = std::chrono::steady_clock::now();
    // Summed where the model is, read once per step (no host sync per micro-batch).
    at::Tensor loss_acc = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(td.device));
    for (std::int64_t j = 0; j < accum; ++j) {
      at::Tensor batch = make_batch(corpus.train, sampler.offsets(step, j), o.seq_len).to(td.device);
      at::Tensor loss = model->loss(batch.narrow(1, 0, o.seq_len), batch.narrow(1, 1, o.seq_len));
      engine.backward(loss);
      step_engine();
      loss_acc += loss.detach().to(at::kFloat);
    }
    // The loss and the signals each rank received, summed in one all-reduce:
    // every rank acts on a signal at the same step.
    std::array<float, 1 + train::StopSignals::kCount> shared{};
    shared[0] = loss_acc.item<float>();
    const auto counts = signals.take_counts();
    std::copy(counts.begin(), counts.end(), shared.begin() + 1);
    comm->all_reduce(shared.data(), shared.size(), DType::kFloat32)->wait();
    std::array<float, train::StopSignals::kCount> summed{};
    std::copy(shared.begin() + 1, shared.end(), summed.begin());
    train::SignalVerdict signal = train::signal_verdict(summed);
    const float loss_sum = shared[0];
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total_seconds += seconds;
    // (commit_s is set only by a commit that succeeded.)
    if (saving && !engine.checkpoint_in_flight() && engine.last_checkpoint().commit_s > 0) report_saved();
    const double loss = loss_sum / static_cast<double>(accum * comm->world_size());
    if (cfg.wall_clock_breakdown && (++traced_steps == cfg.steps_per_print || step + 1 == o.steps)) {
      const std::vector<TimelineInterval> timeline = engine.take_timeline();
      if (root) {
        std::fprintf(stderr, "step %lld: time per step over the last %lld (wall_clock_breakdown, rank 0): %s\n",
                     static_cast<long long>(step + 1), static_cast<long long>(traced_steps),
                     train::wall_clock_breakdown(timeline, traced_steps).c_str());
      }
      traced_steps = 0;
    }
    // A non-finite loss gives non-finite gradients: the engine skipped the
    // step, said so, and stops the run if the config's nonfinite policy says so.
    history.add_step(loss);
    last_comm = engine.last_step_comm();
    train::add_comm(run_comm, last_comm);
    double val = -1.0;
    bool evaluated = false;
    // (A run that stops for a signal saves first: the time it has is short.)
    if (o.eval_every > 0 && !signal.stop && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps)) {
      // A signal that comes during the evaluation is acted on at this step,
      // not after the next one: the ranks agree after each of its global
      // batches (4 floats), and a stop abandons the rest of it.
      const std::optional<double> v = evaluate(*model, *comm, corpus, o, micro, accum, td.device, [&] {
        signal.merge(agree_signals());
        return signal.stop;
      });
      if (v) {
        val = *v;
        last_val = val;
        last_val_step = step + 1;
        history.add_validation(step + 1, val);
        evaluated = true;
      } else if (root) {
        std::fprintf(stderr, "\nzero-train: %s during the evaluation after step %lld: the evaluation is abandoned\n",
                     signal.stop_names.c_str(), static_cast<long long>(step + 1));
      }
    }
    const auto snap = engine.ledger().snapshot();
    train::ProgressLine p;
    p.step = step + 1;
    p.steps = o.steps;
    p.loss = loss;
    p.val_loss = val;
    p.tokens_per_s = tokens_per_step / seconds;
    p.tflops = tokens_per_step * flops_per_token / seconds / 1e12;
    p.lr = engine.stats().lr;
    p.loss_scale = engine.stats().loss_scale;
    p.skipped = engine.stats().skipped;
    p.device_bytes = snap.tier_current[0];
    p.host_bytes = snap.tier_current[1];
    p.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    if (root) {
      progress.update(p);
      nlohmann::json m = {{"step", p.step}, {"loss", loss}, {"lr", p.lr}, {"tokens_per_s", p.tokens_per_s},
                          {"tflops", p.tflops}, {"loss_scale", p.loss_scale}, {"skipped", p.skipped},
                          {"step_skipped", engine.stats().last_step_skipped},
                          {"grad_norm", engine.stats().grad_norm}, {"device_bytes", p.device_bytes},
                          {"host_bytes", p.host_bytes}, {"comm_bytes", train::comm_bytes_json(last_comm)},
                          {"elapsed_s", p.elapsed_s}};
      if (val >= 0) m["val_loss"] = val;
      // Rank 0's resident set, the process and LibTorch included: a long
      // run's memory over time is in the metrics.
      if (const auto rss = resident_set_bytes()) m["rss_bytes"] = *rss;
      if (engine.stats().delayed_cpu_ms > 0) {
        // The delayed update: the step before's CPU step, and this step's wait for it.
        m["delayed_cpu_ms"] = engine.stats().delayed_cpu_ms;
        m["delayed_wait_ms"] = engine.stats().delayed_wait_ms;
        // offload_optimizer.publish_in_backward (where it applies): the
        // pieces of it that went in during this step's backward, of all of them.
        if (engine.stats().publish_in_backward) {
          m["published_in_backward"] = engine.stats().published_in_backward;
          m["published_pieces"] = engine.stats().published_pieces;
        }
      }
      files.metrics << m.dump() << "\n";
      files.loss << p.step << " " << loss << " " << p.device_bytes << " " << p.host_bytes << "\n";
      if (val >= 0) files.val << p.step << " " << val << "\n";
      if (val >= 0) files.val_points = true;
      // (Each step: a run killed outright keeps every step it finished.)
      if (files.flush(p.step)) {
        std::fprintf(stderr, "\nzero-train: warning: %s; training goes on, and the run ends with exit status 1\n",
                     files.failure().c_str());
      }
    }
    if (signal.stop) {
      note_stop(signal.stop_names, step + 1,
                evaluated ? "the sample is skipped" : "the final evaluation and the sample are skipped");
    } else if (signal.save && root && o.save_dir.empty()) {
      std::fprintf(stderr, "zero-train: warning: %s asks for a checkpoint, but this run has no --save-dir to save "
                           "it to; training goes on\n", signal.save_names.c_str());
    }
    if ((o.save_every > 0 && (step + 1) % o.save_every == 0) || (signal.save && !o.save_dir.empty())) {
      // Before a stop, the save is finished before the process ends.
      save_at(step + 1, /*async=*/!o.sync_save && !signal.stop,
              signal.save && !signal.stop ? " (asked for by " + signal.save_names + ")" : "");
      // A stop signal that came during the save (or the wait for the one
      // before): this step is saved, the run stops here.
      if (!signal.stop) {
        const train::SignalVerdict during = agree_signals();
        if (during.stop) {
          note_stop(during.stop_names, step + 1, "the sample is skipped");
          break;
        }
      }
    }
    if (signal.stop) break;
  }
  const std::int64_t last_step = first_step + history.steps();
  finish_in_flight();
  // A signal after the last step's agreements (during the last save's
  // commit): the run is complete, the last step is saved (below), and the
  // sample is skipped.
  bool late_save = false;
  if (stopped_by.empty()) {
    const train::SignalVerdict late = agree_signals();
    if (late.stop) note_stop(late.stop_names, last_step, "the sample is skipped");
    late_save = late.save;
  }
  // A complete run that saves every K steps leaves its last step saved too
  // (as Megatron-LM does), where K does not divide --steps: to resume with a
  // higher --steps, to export, to consolidate. (With --save-every 0 only the
  // signals save: said at the start.)
  if (last_step == o.steps && (o.save_every > 0 || late_save) && !o.save_dir.empty() && saving_step != last_step) {
    save_at(last_step, /*async=*/false, " (the last step)");
  }
  engine.flush();
  if (root) progress.finish();
  const auto ledgers = train::gather_int64(*comm, train::flatten_ledger(engine.ledger().snapshot()));
  const auto last_comms = train::gather_int64(*comm, train::flatten_comm(last_comm));
  const auto run_comms = train::gather_int64(*comm, train::flatten_comm(run_comm));
  if (root) {
    files.close();
    std::fprintf(stderr, "%s", engine.summary().c_str());
    if (last_val && last_val_step == o.steps) {
      std::fprintf(stderr, "final validation loss %.4f nats (unigram entropy of the corpus %.4f)\n", *last_val,
                   corpus.unigram_entropy_nats());
    } else if (last_val) {
      std::fprintf(stderr, "last validation loss %.4f nats, at step %lld (unigram entropy of the corpus %.4f)\n",
                   *last_val, static_cast<long long>(last_val_step), corpus.unigram_entropy_nats());
    } else {
      // (With --eval-every N the last step is evaluated too: only a stop
      // before the first evaluation leaves none.)
      const std::string why = o.eval_every == 0 ? "--eval-every 0"
                                                : (stopped_by.empty() ? "the run ended" : "stopped by " + stopped_by) +
                                                      " before the first, at step " +
                                                      std::to_string(std::min<std::int64_t>(o.eval_every, o.steps));
      std::fprintf(stderr, "no validation loss: no evaluation ran (%s); unigram entropy of the corpus %.4f nats\n",
                   why.c_str(), corpus.unigram_entropy_nats());
    }
    if (files.failure().empty()) std::fprintf(stderr, "metrics: %s\n", (fs::path(o.out_dir) / "metrics.jsonl").c_str());
    if (failed_saves > 0) {
      std::fprintf(stderr, "zero-train: warning: %lld checkpoint save(s) of this run failed (--on-save-error "
                   "continue); the newest checkpoint committed in %s is %s\n", static_cast<long long>(failed_saves),
                   o.save_dir.c_str(), newest_committed().c_str());
    }
    if (files.failure().empty()) {
      write_plot(o.out_dir, files.val_points);
    } else {
      std::fprintf(stderr, "plot: skipped (the metrics are incomplete)\n");
    }
    if (!o.report.empty()) {
      nlohmann::json r;
      r["config"] = config::to_json(cfg);
      r["model"] = {{"name", o.model}, {"params", engine.num_parameters()}, {"n_layer", gc.n_layer},
                    {"n_embd", gc.n_embd}, {"n_head", gc.n_head}, {"block_size", gc.block_size}};
      r["world_size"] = comm->world_size();
      r["memory_per_rank"] = nlohmann::json::array();
      for (const auto& l : ledgers) r["memory_per_rank"].push_back(train::ledger_json(l));
      // Per rank: the last step's bytes by collective, and the sum over the run.
      r["comm_per_rank"] = nlohmann::json::array();
      for (std::size_t i = 0; i < last_comms.size(); ++i) {
        r["comm_per_rank"].push_back({{"last_step", train::comm_json(train::unflatten_comm(last_comms[i]))},
                                      {"all_steps", train::comm_json(train::unflatten_comm(run_comms[i]))}});
      }
      r["offload_bytes_per_step_rank0"] = engine.last_step_offload_bytes();
      r["losses"] = history.losses_json();
      r["val_losses"] = history.validation_json();
      // Over the steps this process trained (a resumed run starts past 0).
      const double steps_run = static_cast<double>(history.steps());
      r["tokens_per_s"] = tokens_per_step * steps_run / total_seconds;
      r["tflops"] = tokens_per_step * steps_run * flops_per_token / total_seconds / 1e12;
      r["steps"] = o.steps;
      r["first_step"] = first_step;
      r["last_step"] = last_step;
      r["stopped_by_signal"] = stopped_by.empty() ? nlohmann::json(nullptr) : nlohmann::json(stopped_by);
      r["skipped_steps"] = engine.stats().skipped;
      r["failed_saves"] = failed_saves;
      r["out_error"] = files.failure().empty() ? nlohmann::json(nullptr) : nlohmann::json(files.failure());
      // Written beside, then renamed over: a failed write leaves no partial report.
      const std::string partial = o.report + ".partial";
      std::ofstream report(partial);
      report << r.dump(2) << "\n";
      report.close();
      std::error_code renamed;
      if (!report.fail()) fs::rename(partial, o.report, renamed);
      if (report.fail() || renamed) {
        const std::string why = report.fail() ? std::strerror(errno) : renamed.message();
        std::error_code ignored;
        fs::remove(partial, ignored);
        throw Error("--report " + o.report + ": writing the report failed (" + why + "); the metrics are in " +
                    (fs::path(o.out_dir) / "metrics.jsonl").string());
      }
      std::fprintf(stderr, "report: %s\n", o.report.c_str());
    }
  }
  const bool complete = last_step == o.steps;
  if (!stopped_by.empty() && !complete) {
    if (root) {
      std::string resume;
      if (o.save_dir.empty()) {
        resume = "nothing was saved (no --save-dir)";
      } else if (last_saved == last_step) {
        resume = "resume with --save-dir " + o.save_dir + " --resume latest";
      } else {
        resume = "its checkpoint could not be saved; the newest committed is " + newest_committed() +
                 " (--resume latest)";
      }
      std::fprintf(stderr, "zero-train: stopped by %s at step %lld of %lld: %s (exit status %d)\n",
                   stopped_by.c_str(), static_cast<long long>(last_step), static_cast<long long>(o.steps),
                   resume.c_str(), train::kStoppedBySignalStatus);
    }
    comm->barrier()->wait();
    return train::kStoppedBySignalStatus;
  }
  // The ranks' last agreement, after everything above (a signal while the
  // summary, plot or report were written): a stop skips the sample (whose
  // forwards are collective at stage 3), and a stop or a save asked for
  // saves the last step where it is not yet. After it, the signals end the
  // process as they normally do; one that came between the agreement and
  // the handlers' removal is raised again now.
  if (stopped_by.empty()) {
    const train::SignalVerdict last = agree_signals();
    if (last.stop) note_stop(last.stop_names, last_step, o.sample > 0 ? "the sample is skipped" : "the run ends here");
    if ((last.stop || last.save) && !o.save_dir.empty() && saving_step != last_step) {
      save_at(last_step, /*async=*/false, " (asked for by " + (last.stop ? last.stop_names : last.save_names) + ")");
    } else if (last.save && root && o.save_dir.empty()) {
      std::fprintf(stderr, "zero-train: warning: %s asks for a checkpoint, but this run has no --save-dir to save it "
                           "to\n", last.save_names.c_str());
    }
  }
  // (A save asked for and done, or a stop agreed: a late copy of the same
  // request is dropped.)
  const bool saved_last = saving_step == last_step;
  if (const std::string unsaved = signals.restore_and_raise_late(!stopped_by.empty());
      !unsaved.empty() && root && !saved_last) {
    std::fprintf(stderr, "zero-train: %s after the last step's checkpoint point: the run is complete, nothing more is "
                         "saved\n", unsaved.c_str());
  }
  // The metrics went missing in part: the training finished (and saved), so
  // the sample still comes, but the run ends with an error that says so.
  const bool out_failed = root && !files.failure().empty();
  if (o.sample > 0 && stopped_by.empty()) {
    // Every rank runs the same forwards (at stage 3 each one gathers its
    // blocks from every rank); rank 0 prints.
    const std::string text = generate(*model, o.sample, gc.block_size, o.seed, td.device);
    if (root) std::printf("---- sample (%lld bytes) ----\n%s\n----\n", (long long)o.sample, tools::printable(text).c_str());
  }
  comm->barrier()->wait();
  if (out_failed) {
    std::fprintf(stderr, "zero-train: error: %s. Training itself finished; free space in (or give another) --out "
                         "for the next run\n", files.failure().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"zero-train: train a GPT on a text corpus with ZeRO (DeepSpeed-style JSON config)"};
  app.set_version_flag("--version", std::string("zero-train (zerocpp ") + zero::version() + ")");
  app.add_option("corpus", o.corpus,
                 "text files or folders, read recursively (default: the top-level English files of "
                 "/usr/share/games/fortunes)")
      ->check(tools::non_empty("a file or folder of text"));
  app.add_option("--config", o.config_path, "DeepSpeed-style JSON config (default: ZeRO-2 + CPU offload + bf16; fp32 on a CPU without native bf16); a Hugging Face config's \"auto\" batch, total_num_steps, warmup_num_steps and precision take zero-train's values")
      ->check(tools::non_empty("a config file"));
  app.add_option("--model", o.model, "preset: gpt2-tiny, gpt2-small-test, gpt2, gpt2-medium, gpt2-large, gpt2-xl")
      ->capture_default_str();
  app.add_option("--n-layer", o.n_layer, "override the preset's layers")->check(at_least<std::int64_t>(1));
  app.add_option("--n-head", o.n_head, "override the preset's heads")->check(at_least<std::int64_t>(1));
  app.add_option("--n-embd", o.n_embd, "override the preset's width")->check(at_least<std::int64_t>(1));
  app.add_option("--block-size", o.block_size, "override the preset's context length")
      ->check(at_least<std::int64_t>(1));
  app.add_option("--seq-len", o.seq_len, "training sequence length (default: block size)")
      ->check(at_least<std::int64_t>(1));
  app.add_option("--steps", o.steps, "optimizer steps (the total: a resumed run trains from the checkpoint's step "
                 "to this one)")
      ->check(at_least<std::int64_t>(1))
      ->capture_default_str();
  auto* warmup = app.add_option("--warmup", o.warmup,
                                "LR warm-up steps when the config has no scheduler, or its warmup_num_steps is \"auto\" (default: max(1, steps/10); "
                                "DeepSpeed's schedules warm up over at least 2)")
                    ->check(at_least<std::int64_t>(0));
  auto* min_lr = app.add_option("--min-lr-ratio", o.min_lr_ratio,
                                "cosine floor as a fraction of the lr, when the config has no scheduler")
                     ->check(in_range(0.0, 1.0))
                     ->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "validation every N steps and after the last (0: never)")
      ->check(at_least<std::int64_t>(0, " (0: no validation)"))
      ->capture_default_str();
  app.add_option("--eval-batches", o.eval_batches, "global batches per validation (the same sequences on any "
                 "number of ranks)")
      ->check(at_least<std::int64_t>(1, " (--eval-every 0 turns validation off)"))
      ->capture_default_str();
  app.add_option("--sample", o.sample, "generate N bytes of text at the end (0: none)")
      ->check(at_least<std::int64_t>(0))
      ->capture_default_str();
  app.add_option("--report", o.report, "write a JSON report (memory per rank, communication, losses, speed); its "
                 "folder must exist (checked before training)")
      ->check(tools::non_empty("a file to write"));
  app.add_option("--out", o.out_dir, "folder for metrics.jsonl, loss.dat, val.dat, plot.gp, training.png and the flight "
                 "recorder (created; checked before training); locked for the run "
                 "(<dir>/.lock): a second job given it is refused")
      ->check(tools::non_empty("a folder"))
      ->capture_default_str();
  app.add_option("--device", o.device,
                 "auto (a GPU per rank when the node has enough, else the CPU), cpu, or cuda (rank r on "
                 "cuda:<local rank r>; several ranks talk over NCCL)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the model and the data order")->check(seed_number())->capture_default_str();
  app.add_option("--save-every", o.save_every,
                 "save a checkpoint every K steps (tag step-<N>) to --save-dir, and the last step (0: only when a "
                 "signal asks)")
      ->check(at_least<std::int64_t>(0, " (0: only when a signal asks)"))
      ->capture_default_str();
  app.add_option("--keep-last", o.keep_last,
                 "keep only the N newest step-<K> checkpoints in --save-dir: older ones are removed once a newer one "
                 "is committed (0: keep all; tags past this run's newest, from an earlier run, are left alone)")
      ->check(at_least<std::int64_t>(0, " (0: keep all)"))
      ->capture_default_str();
  app.add_option("--save-dir", o.save_dir,
                 "folder of the checkpoints (<dir>/<tag>/, <dir>/latest); locked for the run (<dir>/.lock): a second "
                 "job given it is refused")
      ->check(tools::non_empty("a folder"));
  app.add_option("--init-from", o.init_from,
                 "start from the weights in this safetensors file (the model's parameters under its names, as "
                 "zero-ckpt consolidate writes them): a new run from step 0 with a fresh optimizer (fine-tuning, or "
                 "another optimizer than the checkpoint's); not with --resume, but with --resume auto (its first "
                 "start)")
      ->check(tools::non_empty("a safetensors file"));
  app.add_option("--resume", o.resume,
                 "resume from checkpoint TAG of --save-dir (latest: the newest; auto: the newest where there is "
                 "one, else a new run, for a job a scheduler requeues); saved on any number of ranks; a checkpoint "
                 "at or past --steps is an error")
      ->check(tools::non_empty("a tag (latest: the newest; auto: the newest, else a new run)"));
  app.add_flag("--sync-save", o.sync_save,
               "write checkpoints before training goes on (default: asynchronously, training blocks only for a "
               "host copy)");
  app.add_option("--on-save-error", o.on_save_error,
                 "when a checkpoint cannot be saved (disk full, folder gone): stop the run with the error, or "
                 "continue training, warning at each failed save with the newest checkpoint committed (the failed "
                 "one leaves nothing; one whose `latest` alone could not follow is complete and counts as saved)")
      ->check(CLI::IsMember({"stop", "continue"}))
      ->capture_default_str();
  app.add_option("--decay", o.decay,
                 "which parameters take the config's weight decay: matrices (the weights and the embedding; "
                 "biases and LayerNorm gains none, as GPT-2 and nanoGPT train) or all")
      ->check(CLI::IsMember({"matrices", "all"}))
      ->capture_default_str();
  app.add_option("--threads", o.threads,
                 "LibTorch's threads per rank (0: OMP_NUM_THREADS if set, else the cores this process may run on "
                 "over the ranks on this node)")
      ->check(at_least<int>(0))
      ->capture_default_str();
  app.add_flag("--checkpoint-activations", o.checkpoint_activations,
               "checkpoint activations per block (recompute in backward); also on when the config sets "
               "activation_checkpointing.cpu_checkpointing, which keeps the checkpoints on the host");
  app.footer("Signals: SIGTERM, SIGINT, SIGUSR2 or SIGHUP stop the run after the step in progress (an evaluation is "
             "abandoned), with a checkpoint in "
             "--save-dir, and exit with status 75 (resume with --resume latest); SIGUSR1 saves a checkpoint and "
             "trains on. Under mpirun, send SIGUSR2/SIGUSR1 to mpirun (it forwards them). docs/train.md, \"Signals\".");
  const bool says = tools::says_usage_errors();
  try {
    app.parse(argc, argv);
    o.seed_given = app.get_option("--seed")->count() > 0;
  } catch (const CLI::ParseError& e) {
    if (!says) return e.get_exit_code() == 0 ? 0 : 2;
    if (tools::say_near_options("zero-train", app, e)) return 2;
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a usage error: 2
  }
  if (o.save_every > 0 && o.save_dir.empty()) {
    if (says) std::fprintf(stderr, "zero-train: error: --save-every needs --save-dir: the folder to save the checkpoints to\n");
    return 2;
  }
  if (o.keep_last > 0 && o.save_dir.empty()) {
    if (says) std::fprintf(stderr, "zero-train: error: --keep-last needs --save-dir: the folder whose checkpoints it keeps\n");
    return 2;
  }
  if (!o.resume.empty() && o.save_dir.empty()) {
    if (says) std::fprintf(stderr, "zero-train: error: --resume needs --save-dir: the folder the checkpoints were saved to\n");
    return 2;
  }
  if (!o.resume.empty() && o.resume != "auto" && !o.init_from.empty()) {
    if (says) {
      std::fprintf(stderr, "zero-train: error: --init-from starts a new run from weights, --resume continues a "
                   "checkpoint (its weights, optimizer and step): give one of them (or --resume auto: --init-from "
                   "for the first start, the newest checkpoint after)\n");
    }
    return 2;
  }
  // The model's shape is the command line's: an unknown preset, or heads
  // that do not split the width, is a usage error (exit 2, as in
  // zero-estimate), said before MPI starts.
  try {
    const models::GptConfig gc = gpt_config(o);
    ZERO_CHECK(o.seq_len <= gc.block_size, "--seq-len ", o.seq_len, " is longer than the model's block_size ",
               gc.block_size, ": use --seq-len <= ", gc.block_size, " or --block-size ", o.seq_len);
  } catch (const Error& e) {
    if (says) std::fprintf(stderr, "zero-train: error: %s\n", e.what());
    return 2;
  }
  if (o.keep_last > 0 && o.save_every == 0 && says) {
    std::fprintf(stderr, "zero-train: warning: --keep-last %lld without --save-every: only the checkpoints a signal "
                         "asks for are saved, and --keep-last keeps the newest of those\n",
                 static_cast<long long>(o.keep_last));
  }
  o.warmup_given = warmup->count() > 0;
  o.min_lr_ratio_given = min_lr->count() > 0;
  // Errors: once per job, marked with the rank that raised it; the job ends
  // (comm/fail_job.h). What an engine destroyed by the error leaves in the
  // model is no news to a job that ends on it (a refusal before training
  // read as a second failure).
  set_log_sink([](const LogRecord& r) {
    if (r.topic != log_topic::engine_teardown) log_to_stderr(r);
  });
  std::unique_ptr<comm::Communicator> comm;
  try {
    return run(o, comm);
  } catch (const c10::Error& e) {
    comm::fail_job(comm.get(), Error(libtorch_error_message(e)), "zero-train");
  } catch (const std::bad_alloc&) {
    comm::fail_job(comm.get(), Error("out of memory (std::bad_alloc). " + std::string(kOutOfMemoryFix)), "zero-train");
  } catch (const std::exception& e) {
    comm::fail_job(comm.get(), e, "zero-train");
  }
}
