// Engine::save_checkpoint / wait_checkpoint / load_checkpoint: what the
// engine's state is in the files (zero/ckpt/manifest.h says how they are
// laid out), and the collectives that make a save atomic and a load agree.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <optional>
#include <unordered_set>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/GradMode.h>

#include "any_rank.h"
#include "engine_impl.h"
#include "host_snapshot.h"
#include "param_hypers.h"
#include "rank_agreement.h"
#include "zero/ckpt/checkpoint_dir.h"
#include "zero/core/log.h"
#include "zero/ckpt/checkpoint_error.h"
#include "zero/ckpt/reshard.h"
#include "zero/ckpt/shard_io.h"
#include "zero/comm/launcher_env.h"
#include "zero/core/error.h"
#include "zero/core/text_list.h"
#include "zero/core/host_memory.h"

namespace zero {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

using detail::agree;
using detail::all_gather_text;
using detail::error_of;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

const char* dtype_name_of(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    case at::kDouble: return "f64";
    case at::kLong: return "i64";
    case at::kInt: return "i32";
    case at::kByte: return "u8";
    case at::kBool: return "bool";
    default: return nullptr;
  }
}

// dtype_name_of's inverse, for the names parse_manifest accepts.
c10::ScalarType scalar_type_of(const std::string& name) {
  for (c10::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble, at::kLong, at::kInt, at::kByte, at::kBool}) {
    if (name == dtype_name_of(t)) return t;
  }
  ZERO_INTERNAL_ASSERT(false, "no scalar type for checkpoint dtype ", name);
  return at::kFloat;
}

std::vector<ckpt::BucketRecord> bucket_records(const FlatLayout& L) {
  std::vector<ckpt::BucketRecord> out;
  for (const Bucket& b : L.buckets()) out.push_back({b.offset, b.numel, b.padded, b.chunk, b.partition_offset});
  return out;
}

// The layout as the manifest records it.
void record_layout(const FlatLayout& L, ckpt::Manifest& m) {
  m.shard_world = L.shard_world();
  m.padded_numel = L.padded_numel();
  m.partition_numel = L.partition_numel();
  m.buckets = bucket_records(L);
}

// Whether every rank's host has room for an asynchronous save's snapshot
// (`bytes` per rank, times the ranks on a node); where one has not, every
// rank saves synchronously instead (rank 0 says so), never the OOM killer.
bool snapshot_fits(comm::Communicator& comm, const c10::Device& device, std::int64_t bytes, const std::string& tag) {
  const int local = comm::launcher_local_size().value_or(1);
  const std::optional<std::int64_t> available = host_memory_available();
  const bool short_here = available && bytes * local > *available;
  if (!detail::any_rank(comm, device, short_here)) return true;
  if (short_here || comm.rank() == 0) {
    detail::log_warning(log_topic::checkpoint,
                        "checkpoint '%s': an asynchronous save needs %s of host memory per rank for its "
                        "snapshot (%d rank(s) per node)%s%s: saving synchronously instead", tag.c_str(),
                        memory::format_bytes(bytes).c_str(), local,
                        short_here ? " but " : " and another rank's node has not",
                        short_here ? (memory::format_bytes(*available) + " is available (" + host_memory_source() + ")")
                                         .c_str()
                                   : "");
  }
  return false;
}

// The module's frozen parameters (`frozen`: unless left out) and buffers,
// by name, each once.
std::vector<std::pair<std::string, at::Tensor>> module_tensors(torch::nn::Module& module, bool frozen = true) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!frozen || item.value().requires_grad() || !seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    out.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (!item.value().defined() || !seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

}  // namespace

bool Engine::checkpoint_in_flight() const { return impl_->saving != nullptr; }

double Engine::Impl::fence_save(memory::MemoryLedger& ledger) {
  if (!saving) return 0.0;
  const Clock::time_point began = Clock::now();
  const detail::CheckpointSave::Fenced f = saving->fence(ledger);
  return f.copied > 0 || f.waited ? seconds_since(began) : 0.0;
}

void refuse_mid_window(std::int64_t micro_step, bool backward_done, std::int64_t accumulation, const char* call,
                       const char* note) {
  const std::int64_t done = micro_step % accumulation + (backward_done ? 1 : 0);  // backward()s of the window
  ZERO_CHECK(done == 0, call, " in the middle of an accumulation window (", done, " of its ", accumulation,
             " backward()s done", backward_done ? ", the last one's step() not yet" : "",
             "): call it after the step() that ends the window", note);
}

void Engine::save_checkpoint(const std::string& dir, const std::string& tag, const nlohmann::json& client_state,
                             bool async, bool exclude_frozen_parameters) {
  Impl& m = *impl_;
  const Clock::time_point began = Clock::now();
  m.check_not_damaged("save_checkpoint");
  ckpt::check_tag(tag);
  refuse_mid_window(m.micro_step, m.backward_done, config_.gradient_accumulation_steps, "save_checkpoint()", "");
  at::NoGradGuard no_grad;
  finish_checkpoint(/*block=*/true);
  // A running delayed update writes the master weights: wait for it (its
  // update stays pending, and is saved as such).
  m.delayed->wait();
  detail::ParamStore& P = *m.params;
  // The host reads the partition below: the last publish's copies into it
  // (on a GPU with offload_param, the device share's update comes down on
  // the copy stream) must have landed.
  P.wait_up();
  const FlatLayout& L = P.layout();
  const fs::path root(dir);
  std::string error;
  if (m.rank == 0) error = error_of([&] { ckpt::prepare_partial(root, tag); });
  agree<ckpt::CheckpointSaveError>(comm_, m.ctx.device, error, "preparing the checkpoint folder");

  // Rank 0's manifest, all but the files (they come with the commit).
  ckpt::Manifest man;
  man.tag = tag;
  man.world_size = m.world;
  man.stage = m.stage;
  man.dtype = dtype_name_of(m.precision.dtype());
  man.optimizer = config_.optimizer.type;
  man.moments = m.optimizer->moments();
  man.offload = m.offload;
  man.delayed_update = m.delayed->enabled();
  record_layout(L, man);
  const detail::ParamHypers& hypers = m.optimizer->hypers();
  for (std::size_t i = 0; i < P.params().size(); ++i) {
    const ParamSlot& s = L.params()[i];
    man.params.push_back({P.names()[i], P.shape(i).vec(), s.numel, s.offset, std::nullopt, std::nullopt, std::nullopt});
    if (!hypers.empty()) {  // the settings of EngineOptions' rules, which a load compares
      const detail::ParamHyper& h = hypers.classes[static_cast<std::size_t>(hypers.of_param[i])];
      // (As the float's shortest digits: 0.01, not 0.009999999776482582;
      // read back, the same float.)
      auto as_written = [](float v) {
        const std::string digits = detail::shortest(v);
        double d = v;
        std::from_chars(digits.data(), digits.data() + digits.size(), d);
        return d;
      };
      man.params.back().weight_decay = as_written(h.weight_decay);
      man.params.back().lr_scale = as_written(h.lr_scale);
      if (config_.optimizer.is_muon()) man.params.back().muon = h.muon != 0;
    }
  }
  man.engine.steps = stats_.step;
  man.engine.optimizer_step = m.optimizer_step;
  man.engine.skipped = stats_.skipped;
  man.engine.lr = lr();  // the rate of the next step (the config's scheduler's, or set_lr's)
  man.engine.config_lr = config_.optimizer.lr;
  if (const std::optional<LrSchedule::Betas> b = m.scheduled_betas()) {
    man.engine.betas = std::pair<double, double>{b->beta1, b->beta2};
  }
  man.engine.update_pending = m.delayed->pending();
  const LossScaler::State ss = m.precision.scaler().state();
  man.engine.scaler = {ss.scale, ss.hysteresis_left, ss.iter, ss.last_overflow_iter, ss.skipped};
  man.client_state = client_state.is_null() ? nlohmann::json::object() : client_state;

  // What this rank writes: the engine's own tensors (a synchronous save
  // writes from them, copying device tensors down in blocks), or host
  // copies of them taken now (an asynchronous save: training goes on).
  std::vector<detail::SaveSection> sections;
  auto host = [](const at::Tensor& t) { return t.contiguous(); };
  const char* tdtype = dtype_name_of(m.precision.dtype());
  if (m.rank < L.shard_world()) {
    man.partition_sections = {"master", "exp_avg"};
    // Each state in partition order, its shares (offload_optimizer.ratio
    // < 1: host and device) one after the other: the file does not depend
    // on the split.
    auto hosts = [&](const std::vector<at::Tensor>& parts) {
      std::vector<at::Tensor> v;
      for (const at::Tensor& t : parts) v.push_back(host(t));
      return v;
    };
    // The partition's sections change only at the next optimizer step: an
    // asynchronous save writes their host memory in place until then
    // (CheckpointSave::fence()). With NVMe they are streamed from the swap
    // file to the checkpoint's, through two I/O blocks of host memory (a
    // read error there fails the save as a write error does).
    using State = detail::OptimizerPartition::State;
    auto state_section = [&](const char* name, State s) {
      detail::SaveSection section{name, "fp32", {}, {}, /*live=*/true};
      if (m.optimizer->swapped()) {
        const detail::OptimizerPartition* opt = m.optimizer.get();
        section.live = false;
        section.stream_bytes = L.partition_numel() * sizeof(float);
        section.stream = [opt, s](std::uint64_t offset, std::size_t n, char* buf, std::size_t cap) {
          return opt->read_state_bytes(s, offset, n, buf, cap);
        };
      } else {
        section.pieces = hosts(m.optimizer->state(s));
      }
      sections.push_back(std::move(section));
    };
    state_section("master", State::kMaster);
    state_section("exp_avg", State::kExpAvg);
    if (man.moments == 2) {
      man.partition_sections.push_back("exp_avg_sq");
      state_section("exp_avg_sq", State::kExpAvgSq);
    }
    // On NVMe the parameters stream from the swap file as the state does,
    // unless the save is asynchronous and the state is in host memory: then
    // they are read into copies of the save's own, so that the next step
    // does not wait for them to be written.
    detail::SaveSection params{"params", tdtype, {}, {}, /*live=*/P.swap() == nullptr};
    detail::ParamSwap* swap = P.swap();
    if (swap != nullptr && (!async || m.optimizer->swapped())) {
      swap->settle_writes();
      params.live = false;
      params.stream_bytes = L.partition_numel() * c10::elementSize(m.precision.dtype());
      params.stream = [swap](std::uint64_t offset, std::size_t n, char* buf, std::size_t cap) {
        return swap->read_bytes(offset, n, buf, cap);
      };
    } else {
      params.copies = swap != nullptr;
      for (const Bucket& b : L.buckets()) params.pieces.push_back(host(P.read_rank_chunk(b)));
    }
    sections.push_back(std::move(params));
    man.partition_sections.push_back("params");
    if (man.engine.update_pending) {
      const std::vector<at::Tensor> parts = m.update_parts(m.update_index);
      if (!parts.empty()) {
        sections.push_back({"update", tdtype, {}, hosts(parts), true});
        man.partition_sections.push_back("update");
      }
    }
  }
  // Ranks past the shard world (stage 0) write their RNG state only. (Only
  // rank 0's manifest is committed, and rank 0 always holds a partition.)
  sections.push_back({"rng.cpu", "u8", {}, {at::detail::getDefaultCPUGenerator().get_state()}});
  if (m.ctx.on_accelerator()) {
    sections.push_back({"rng.device", "u8", {}, {at::globalContext().defaultGenerator(m.ctx.device).get_state()}});
  }
  // Stage 3's partitioned frozen parameters are hollow in the module
  // outside their units: their values, whole, gathered for rank 0 (every
  // rank takes part), saved as the other module tensors are.
  std::vector<std::pair<at::Tensor, at::Tensor>> frozen_values;
  man.frozen_excluded = exclude_frozen_parameters && P.frozen_count() > 0;
  if (P.frozen_partitioned() > 0 && !man.frozen_excluded) frozen_values = P.frozen_values_on_host(comm_);
  if (m.rank == 0) {
    for (const auto& [name, module_tensor] : module_tensors(*P.module(), /*frozen=*/!man.frozen_excluded)) {
      at::Tensor t = module_tensor;
      bool copied = false;
      for (const auto& [p, value] : frozen_values) {
        if (p.unsafeGetTensorImpl() != t.unsafeGetTensorImpl()) continue;
        t = value;
        copied = true;
        break;
      }
      const char* d = dtype_name_of(t.scalar_type());
      if (!d) {
        detail::log_warning(log_topic::checkpoint,
                            "checkpoint: module tensor %s (%s) not saved: its dtype has no checkpoint "
                            "encoding", name.c_str(), c10::toString(t.scalar_type()));
        continue;
      }
      const std::string section = "module." + name;
      sections.push_back({section, d, t.sizes().vec(), {host(t.detach())}});
      sections.back().copies = copied;  // (host copies of the save's own already)
      man.module_tensors.push_back(section);
    }
  }
  memory::MemoryLedger::Registration snapshot;
  if (async) {
    std::int64_t bytes = 0, streamed = 0;
    for (const detail::SaveSection& s : sections) {
      for (const at::Tensor& t : s.pieces) bytes += static_cast<std::int64_t>(t.nbytes());
      if (s.stream) streamed = static_cast<std::int64_t>(detail::kStreamBufferBytes);
    }
    bytes += streamed;
    // Room for a copy of all of it: what is not written by the next step is
    // copied then.
    async = snapshot_fits(comm_, m.ctx.device, bytes, tag);
    if (async) {
      std::int64_t copied = streamed;  // (the streamed sections' buffer)
      for (detail::SaveSection& s : sections) {
        for (at::Tensor& t : s.pieces) {
          if (s.live && t.device().is_cpu()) continue;  // written in place until the fence
          if (!s.copies) t = detail::host_snapshot(t);
          copied += static_cast<std::int64_t>(t.nbytes());
        }
      }
      snapshot = ledger_.add(memory::Tier::kHost, memory::Kind::kStaging, copied, "checkpoint snapshot", false);
    }
  }
  const fs::path file = ckpt::partial_path(root, tag) / ckpt::shard_file_name(m.rank, m.world);
  m.saving = std::make_unique<detail::CheckpointSave>(root, tag, file, m.rank, std::move(sections), std::move(man),
                                                      async, std::move(snapshot));
  last_checkpoint_ = {};
  last_checkpoint_.tag = tag;
  last_checkpoint_.async = async;
  last_checkpoint_.stall_s = seconds_since(began);
  if (!async) {
    finish_checkpoint(/*block=*/true);
    last_checkpoint_.stall_s = seconds_since(began);
  }
}

std::string Engine::wait_checkpoint() {
  const std::string tag = impl_->saving ? impl_->saving->tag() : std::string();
  finish_checkpoint(/*block=*/true);
  return tag;
}

void Engine::finish_checkpoint(bool block) {
  Impl& m = *impl_;
  if (!m.saving) return;
  const Clock::time_point began = Clock::now();
  if (!block && m.world > 1) {
    // Commit only when every rank's file is written.
    if (detail::any_rank(comm_, m.ctx.device, !m.saving->written())) return;
  } else if (!block && !m.saving->written()) {
    return;
  }
  std::unique_ptr<detail::CheckpointSave> save = std::move(m.saving);
  const std::string record = save->result();
  const bool failed = record.rfind("error: ", 0) == 0;
  last_checkpoint_.write_s = save->write_seconds();
  last_checkpoint_.bytes = save->bytes();
  const std::vector<std::string> records = all_gather_text(comm_, m.ctx.device, record);
  // What a failed save wrote goes, so that failures do not fill the disk
  // that may be why they fail. Every rank's writer has ended (each sent its
  // record): each rank removes its own file; once all have (the barrier),
  // rank 0 the folder with what is left there (a manifest), before it
  // returns (its next save may create the folder again). No rank touches a
  // file while another removes it; a folder on another node is removed by
  // the next save of the tag.
  auto remove_partial = [&] {
    std::error_code ec;
    fs::remove(save->file(), ec);
    comm_.barrier()->wait();
    if (m.rank == 0) ckpt::remove_tree(ckpt::partial_path(save->dir(), save->tag()), ec);
  };
  for (std::size_t r = 0; r < records.size(); ++r) {
    if (records[r].rfind("error: ", 0) != 0) continue;
    remove_partial();
    if (failed) {
      throw ckpt::CheckpointSaveError(detail::str_cat("checkpoint '", save->tag(), "' was not saved: ", record.substr(7)));
    }
    throw comm::ForAnotherRank<ckpt::CheckpointSaveError>(
        detail::str_cat("checkpoint '", save->tag(), "' was not saved: rank ", r, " could not write its file: ",
                        records[r].substr(7)),
        static_cast<int>(r));
  }
  std::string error;
  if (m.rank == 0) {
    error = error_of([&] {
      ckpt::Manifest& man = save->manifest();
      for (std::size_t r = 0; r < records.size(); ++r) {
        man.files.push_back(ckpt::parse_file_record(nlohmann::json::parse(records[r]),
                                                    "the file record of rank " + std::to_string(r)));
      }
      const std::string text = ckpt::manifest_to_json(man);
      // What is written must read back: the manifest's own checks.
      (void)ckpt::parse_manifest(text, (save->dir() / save->tag() / ckpt::kManifestName).string());
      ckpt::commit(save->dir(), save->tag(), text);
    });
    // (A commit that put the checkpoint in place and could not update
    // `latest` says so itself.)
    const std::string own = "checkpoint '" + save->tag() + "' ";
    if (!error.empty() && error.rfind(own, 0) != 0) error = own + "was not saved: " + error;
  }
  try {
    agree<ckpt::CheckpointSaveError>(comm_, m.ctx.device, error, "committing the checkpoint");
  } catch (const ckpt::CheckpointSaveError&) {
    remove_partial();  // (after a rename that succeeded, nothing is left there)
    throw;
  }
  last_checkpoint_.commit_s = seconds_since(began);
}

namespace {

// Where one partition section's loaded values go: host tensors, each
// holding the elements from its partition offset on. The engine's own
// tensors where they are on the host (the load writes into them: no second
// copy of the state in memory), host copies of device tensors otherwise
// (copied up once every file is read).
struct LoadTarget {
  const char* section = nullptr;
  // NVMe: the partition's bytes streamed into a swap file as the files are
  // read, sink(partition byte, data, n) (no segments).
  std::function<void(std::uint64_t, const void*, std::size_t)> sink;
  std::vector<std::pair<std::uint64_t, at::Tensor>> segments;  // (partition offset, contiguous 1-D host tensor)
  // The device tensors that segments are host copies of, with the
  // segment's index (a target may mix host and device segments).
  std::vector<std::pair<at::Tensor, std::size_t>> device;

  void add(std::uint64_t offset, const at::Tensor& engine) {
    if (engine.device().is_cpu()) {
      ZERO_INTERNAL_ASSERT(engine.is_contiguous(), "checkpoint target ", section, " is not contiguous");
      segments.emplace_back(offset, engine);
    } else {
      device.emplace_back(engine, segments.size());
      segments.emplace_back(offset, engine.to(at::kCPU));
    }
  }
  // The staged values into the device tensors.
  void copy_up() const {
    for (const auto& [t, i] : device) t.copy_(segments[i].second);
  }
};

// The reads that put `n` elements of a saved section (from element `src`)
// at partition element `dst` of a target.
void add_reads(const LoadTarget& t, const ckpt::SectionRecord& s, std::uint64_t src, std::uint64_t dst, std::uint64_t n,
               std::vector<ckpt::ReadRange>& out) {
  const std::uint64_t es = ckpt::Manifest::dtype_size(s.dtype);
  for (const auto& [begin, tensor] : t.segments) {
    const std::uint64_t end = begin + static_cast<std::uint64_t>(tensor.numel());
    const std::uint64_t a = std::max(dst, begin), b = std::min(dst + n, end);
    if (a >= b) continue;
    out.push_back({s.offset + (src + (a - dst)) * es, (b - a) * es, static_cast<char*>(tensor.data_ptr()) + (a - begin) * es});
  }
}

// Where a streamed range goes: a target's partition from byte `byte` on.
struct StreamDest {
  const LoadTarget* target;
  std::uint64_t byte;
};

// The read that puts `n` elements of a saved section (from element `src`)
// at partition element `dst` of a streamed target (the section is in the
// target's dtype).
void add_streamed_read(const LoadTarget& t, const ckpt::SectionRecord& s, std::uint64_t src, std::uint64_t dst,
                       std::uint64_t n, std::vector<ckpt::ReadRange>& out, std::map<std::size_t, StreamDest>& dests) {
  const std::uint64_t es = ckpt::Manifest::dtype_size(s.dtype);
  dests[out.size()] = StreamDest{&t, dst * es};
  out.push_back({s.offset + src * es, n * es, nullptr});
}

}  // namespace

nlohmann::json Engine::load_checkpoint(const std::string& dir, const std::string& tag, bool load_module_strict) {
  Impl& m = *impl_;
  // The window's gradients so far belong to the state being replaced: a load
  // would carry them into the loaded one's next window.
  refuse_mid_window(m.micro_step, m.backward_done, config_.gradient_accumulation_steps, "load_checkpoint()",
                    " (the engine is unchanged)");
  at::NoGradGuard no_grad;
  finish_checkpoint(/*block=*/true);
  // A delayed update that failed leaves the engine refusing to train until a
  // load succeeds: this load goes on (the update is dropped once the checks
  // have passed, below; a load that fails them leaves it as it was).
  try {
    m.delayed->wait();
  } catch (const std::exception&) {
  }
  detail::ParamStore& P = *m.params;
  // The host reads the partition below: the last publish's copies into it
  // (on a GPU with offload_param, the device share's update comes down on
  // the copy stream) must have landed.
  P.wait_up();
  const FlatLayout& L = P.layout();
  const fs::path root(dir);
  const c10::ScalarType dtype = m.precision.dtype();
  const char* tdtype = dtype_name_of(dtype);

  // First everything is checked that can be before a byte is read (the
  // manifest against this model, every file's presence and size), on every
  // rank; the engine is unchanged by a load that fails there. Then the
  // files are read, into the engine's host tensors directly.
  ckpt::Manifest man;
  std::string where;
  fs::path folder;
  std::vector<LoadTarget> targets;
  LoadTarget* params_target = nullptr;
  at::Tensor rng, rng_device;
  std::vector<std::pair<at::Tensor, at::Tensor>> module_updates;  // (module tensor, loaded value)
  std::map<int, std::vector<ckpt::ReadRange>> reads;  // by saved rank
  std::map<int, std::map<std::size_t, StreamDest>> streamed;  // by saved rank: range index -> swap file (NVMe)
  bool same_dtype = false, keep_pending = false, apply_update = false;
  std::string settings_note;  // the optimizer settings per parameter, where they differ
  std::string betas_note;     // the saved scheduler's betas, where they overrule the config's
  std::string error = error_of([&] {
    const std::string t = ckpt::resolve_tag(root, tag);
    folder = root / t;
    where = folder.string();
    const fs::path manifest_path = folder / ckpt::kManifestName;
    man = ckpt::parse_manifest(ckpt::read_text(manifest_path), manifest_path.string());
    // The same model: every trainable parameter by name and shape.
    std::map<std::string, std::size_t> saved_index;
    for (std::size_t i = 0; i < man.params.size(); ++i) saved_index[man.params[i].name] = i;
    std::vector<ckpt::TargetParam> params;
    std::vector<std::optional<detail::ParamHyper>> saved_hypers;  // in this engine's order
    for (std::size_t i = 0; i < P.params().size(); ++i) {
      const std::string& name = P.names()[i];
      auto it = saved_index.find(name);
      ZERO_CHECK(it != saved_index.end(), "checkpoint ", where, " is of another model: it has no parameter '", name,
                 "' (it has ", man.params.size(), " trainable parameters, this module ", P.params().size(),
                 "). Load it into the model it was saved from");
      const ckpt::ParamRecord& s = man.params[it->second];
      saved_hypers.emplace_back();
      // Muon's two halves keep different state under the same names (the
      // momentum and the last update; Adam's m and v): a parameter must stay
      // in its half.
      const detail::ParamHypers& mine = m.optimizer->hypers();
      const std::int32_t my_muon = mine.empty() ? 0 : mine.classes[static_cast<std::size_t>(mine.of_param[i])].muon;
      if (config_.optimizer.is_muon() && man.optimizer == "Muon") {  // (another optimizer is refused below)
        ZERO_CHECK(s.muon.value_or(false) == (my_muon != 0),
                   "checkpoint ", where, " steps parameter '", name, "' with ", s.muon.value_or(false) ? "Muon" : "Adam",
                   ", this engine with ", my_muon != 0 ? "Muon" : "Adam", " (EngineOptions::use_muon, default "
                   "zero::muon_by_default): their optimizer states differ; build the engine with the use_muon rule "
                   "the checkpoint was saved with");
      }
      if (s.weight_decay || s.lr_scale) {
        saved_hypers.back() = detail::ParamHyper{
            static_cast<float>(s.weight_decay.value_or(config_.optimizer.weight_decay)),
            static_cast<float>(s.lr_scale.value_or(1.0)), my_muon};
      }
      ZERO_CHECK(s.shape == P.shape(i).vec(), "checkpoint ", where, " is of another model: parameter '",
                 name, "' has shape ", P.shape(i), " here but ", c10::IntArrayRef(s.shape),
                 " in the checkpoint");
      const ParamSlot& slot = L.params()[i];
      params.push_back({it->second, slot.offset, slot.numel, slot.bucket});
      saved_index.erase(it);
    }
    ZERO_CHECK(saved_index.empty(), "checkpoint ", where, " is of another model: it has ", saved_index.size(),
               " trainable parameter(s) this module has not, such as '", saved_index.begin()->first,
               "' (frozen here?). Load it into the model it was saved from");
    settings_note = detail::compare_saved_param_hypers(saved_hypers, m.optimizer->hypers(), P.names(),
                                                       config_.optimizer.weight_decay, where);
    // Adam and AdamW keep the same state (m, v); Adagrad's sum and Lion's m
    // are one moment each but not the same quantity.
    auto state_kind = [](const std::string& type) { return type == "AdamW" ? std::string("Adam") : type; };
    ZERO_CHECK(state_kind(man.optimizer) == state_kind(config_.optimizer.type), "checkpoint ", where,
               " holds the state of optimizer ", man.optimizer, ", this engine's is ", config_.optimizer.type,
               ": use the optimizer it was saved with, or load the weights only (zero-ckpt consolidate, then "
               "train a fresh engine from them)");
    ZERO_CHECK(man.moments == m.optimizer->moments(), "checkpoint ", where, " holds the state of optimizer ",
               man.optimizer, " (", man.moments, " moment(s)), this engine's is ", config_.optimizer.type,
               ": use the optimizer it was saved with");
    same_dtype = man.dtype == tdtype;
    P.settle_gathers();  // stage 3: no copy up still reads the partition the load writes
    P.wait_up();         // nor does the last publish still write it (a copy down from the device share)

    // This rank's partition, from the saved ones; padding keeps this
    // engine's values (zeros, Adagrad's initial sum).
    targets.reserve(5);
    auto target = [&](const char* section) -> LoadTarget& {
      targets.emplace_back();
      targets.back().section = section;
      return targets.back();
    };
    // Each state's shares at their places in the partition. (NVMe: written
    // to the swap file as the checkpoint's files are read, through two swap
    // buffers: the state is never held whole in host memory.)
    using State = detail::OptimizerPartition::State;
    auto shares = [&](const char* section, State s) {
      LoadTarget& t = target(section);
      if (m.optimizer->swapped()) {
        detail::OptimizerPartition* opt = m.optimizer.get();
        t.sink = [opt, s](std::uint64_t byte, const void* data, std::size_t n) { opt->write_state_bytes(s, byte, data, n); };
        return;
      }
      std::size_t at = 0;
      for (const at::Tensor& part : m.optimizer->state(s)) {
        t.add(at, part);
        at += static_cast<std::size_t>(part.numel());
      }
    };
    shares("master", State::kMaster);
    shares("exp_avg", State::kExpAvg);
    if (man.moments == 2) shares("exp_avg_sq", State::kExpAvgSq);
    // A pending update applied at load (this engine has no delayed update)
    // is the parameters to set: read in place of the saved parameters.
    const bool has_update = std::find(man.partition_sections.begin(), man.partition_sections.end(), "update") !=
                            man.partition_sections.end();
    keep_pending = man.engine.update_pending && m.delayed->enabled() && same_dtype;
    apply_update = man.engine.update_pending && !keep_pending && same_dtype && has_update;
    if (same_dtype) {
      params_target = &target(apply_update ? "update" : "params");
      if (detail::ParamSwap* swap = P.swap()) {
        // On NVMe: streamed into the swap file as the state is (the padding
        // keeps the file's zeros).
        params_target->sink = [swap](std::uint64_t byte, const void* data, std::size_t n) {
          swap->write_bytes(byte, data, n);
        };
      } else {
        for (const Bucket& b : L.buckets()) params_target->add(b.partition_offset, P.rank_chunk(b).contiguous());
      }
    }
    // A pending delayed update that stays pending is read into this
    // engine's update buffer.
    const std::vector<at::Tensor> update_parts =
        keep_pending ? m.update_parts(m.grads->current() ^ 1) : std::vector<at::Tensor>{};
    ZERO_CHECK(update_parts.empty() || has_update, "checkpoint ", where,
               " has a pending delayed update but not its values (its manifest lists no 'update' section): it is "
               "damaged; load another one");
    if (keep_pending && has_update) {
      LoadTarget& t = target("update");
      std::size_t at = 0;
      for (const at::Tensor& part : update_parts) {
        t.add(at, part);
        at += static_cast<std::size_t>(part.numel());
      }
    }
    for (const ckpt::ElementRun& r : ckpt::plan_partition(man, bucket_records(L), params, P.shard_rank())) {
      const ckpt::FileRecord& f = man.files[static_cast<std::size_t>(r.shard)];
      for (const LoadTarget& w : targets) {
        if (w.sink) {
          add_streamed_read(w, *f.find(w.section), r.src, r.dst, r.n, reads[r.shard], streamed[r.shard]);
        } else {
          add_reads(w, *f.find(w.section), r.src, r.dst, r.n, reads[r.shard]);
        }
      }
    }
    // This rank's RNG state, when the saved run had this rank.
    if (m.rank < man.world_size) {
      const ckpt::SectionRecord* s = man.files[static_cast<std::size_t>(m.rank)].find("rng.cpu");
      if (s) {
        rng = at::empty({static_cast<std::int64_t>(s->bytes)}, at::kByte);
        reads[m.rank].push_back({s->offset, s->bytes, rng.data_ptr()});
      }
      const ckpt::SectionRecord* d = man.files[static_cast<std::size_t>(m.rank)].find("rng.device");
      if (d && m.ctx.on_accelerator()) {
        rng_device = at::empty({static_cast<std::int64_t>(d->bytes)}, at::kByte);
        reads[m.rank].push_back({d->offset, d->bytes, rng_device.data_ptr()});
      }
    }
    // The module's frozen parameters and buffers, from rank 0's file.
    std::map<std::string, at::Tensor> mine;
    for (const auto& [name, t] : module_tensors(*P.module())) mine["module." + name] = t;
    // ... every one of them: one the checkpoint lacks would keep each rank's
    // own value (ranks apart, silently), as DeepSpeed's strict load refuses
    // it too. Frozen parameters a save left out (exclude_frozen_parameters)
    // are said at the save and kept.
    std::vector<std::string> kept, skipped;  // (load_module_strict false)
    {
      const std::set<std::string> saved(man.module_tensors.begin(), man.module_tensors.end());
      for (const auto& [name, t] : mine) {
        if (saved.count(name) != 0) continue;
        const bool parameter = !t.requires_grad() && t.is_leaf() && [&] {
          for (const auto& item : P.module()->named_parameters(/*recurse=*/true)) {
            if (item.value().unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return true;
          }
          return false;
        }();
        if (parameter && man.frozen_excluded) continue;
        // (A dtype with no checkpoint encoding, int8 say, is never saved: the
        // save said so, and the module keeps its value.)
        if (dtype_name_of(t.scalar_type()) == nullptr) continue;
        if (!load_module_strict) {
          kept.push_back(name.substr(7));
          continue;
        }
        ZERO_CHECK(false, "checkpoint ", where, " holds no ", name.substr(7), parameter ? " (a frozen parameter)" : " (a buffer)",
                   ", which this module has: it was saved from another model (or before the module had it), and the "
                   "module's own value would stay, each rank's its own. Load it into the model it was saved from, "
                   "or with load_module_strict false to keep the module's values");
      }
    }
    for (const std::string& name : man.module_tensors) {
      const ckpt::SectionRecord* s = man.files[0].find(name);
      auto it = mine.find(name);
      if (it == mine.end() && !load_module_strict) {
        skipped.push_back(name.substr(7));
        continue;
      }
      ZERO_CHECK(it != mine.end(), "checkpoint ", where, " holds ", name.substr(7),
                 " (a frozen parameter or buffer) that this module does not have: load it into the model it was "
                 "saved from, or with load_module_strict false to skip it");
      // (A partitioned frozen parameter is hollow outside its unit: its shape is the store's.)
      const bool partitioned = P.partitions_frozen(it->second);
      const c10::IntArrayRef shape = partitioned ? P.frozen_shape(it->second) : it->second.sizes();
      ZERO_CHECK(shape.vec() == s->shape, "checkpoint ", where, ": ", name.substr(7), " has shape ",
                 c10::IntArrayRef(s->shape), " but ", shape, " in this module");
      if (partitioned) {
        // A partitioned frozen parameter: only the rank's share of it is read.
        const auto [first, n] = P.frozen_share(it->second);
        const std::uint64_t es = ckpt::Manifest::dtype_size(s->dtype);
        at::Tensor v = at::empty({static_cast<std::int64_t>(n)}, at::TensorOptions().dtype(scalar_type_of(s->dtype)));
        if (n > 0) reads[0].push_back({s->offset + first * es, n * es, v.data_ptr()});
        module_updates.emplace_back(it->second, v);
        continue;
      }
      at::Tensor v = at::empty(s->shape, at::TensorOptions().dtype(scalar_type_of(s->dtype)));
      reads[0].push_back({s->offset, s->bytes, v.data_ptr()});
      module_updates.emplace_back(it->second, v);
    }
    if (m.rank == 0 && !kept.empty()) {
      detail::log_warning(log_topic::checkpoint,
                          "checkpoint %s holds no %s (load_module_strict false): the module's values are "
                          "kept", where.c_str(), detail::join_first(kept, 5).c_str());
    }
    if (m.rank == 0 && !skipped.empty()) {
      detail::log_warning(log_topic::checkpoint,
                          "checkpoint %s holds %s, which this module has not (load_module_strict false): "
                          "skipped", where.c_str(), detail::join_first(skipped, 5).c_str());
    }
    for (const auto& [shard, ranges] : reads) {
      const ckpt::FileRecord& f = man.files[static_cast<std::size_t>(shard)];
      ckpt::check_file(folder / f.name, f);
    }
  });
  agree(comm_, m.ctx.device, error, "loading checkpoint " + (where.empty() ? root.string() : where));

  // From here a failure leaves the engine's state partly overwritten (a
  // file damaged inside, an I/O error): the engine refuses to go on until a
  // load succeeds.
  m.damaged_by = "a failed load of checkpoint " + where;
  // What belonged to the state being replaced goes: a delayed update still
  // pending (or failed), and the gradients a failed step() left in the
  // window (its next backward would add to them).
  m.delayed->discard();
  m.published_early = 0;
  m.grads->abort();
  error = error_of([&] {
    for (auto& [shard, ranges] : reads) {
      const ckpt::FileRecord& f = man.files[static_cast<std::size_t>(shard)];
      const auto dests = streamed.find(shard);
      if (dests == streamed.end()) {
        ckpt::read_file(folder / f.name, f, ranges);
        continue;
      }
      ckpt::read_file(folder / f.name, f, ranges, /*verify=*/true,
                      [&](std::size_t i, std::uint64_t offset, const void* data, std::size_t n) {
                        const auto d = dests->second.find(i);
                        if (d == dests->second.end()) {
                          std::memcpy(static_cast<char*>(ranges[i].dst) + offset, data, n);
                        } else {
                          d->second.target->sink(d->second.byte + offset, data, n);
                        }
                      });
    }
  });
  // The swap files' last writes, also after a failed read (its error is then the one said).
  if (m.optimizer->swapped()) {
    const std::string write_error = error_of([&] { m.optimizer->finish_state_writes(); });
    if (error.empty()) error = write_error;
  }
  if (detail::ParamSwap* swap = P.swap()) {
    const std::string write_error = error_of([&] { swap->finish_writes(); });
    if (error.empty()) error = write_error;
  }
  try {
    agree(comm_, m.ctx.device, error, "loading checkpoint " + where);
  } catch (const Error& e) {
    const std::string message = detail::str_cat(e.what(), ". The engine's state is now partly that checkpoint's: "
                                                "load a good checkpoint before training on (the engine refuses to "
                                                "train until then)");
    if (const auto* other = dynamic_cast<const comm::RaisedForAnotherRank*>(&e)) {
      throw comm::ForAnotherRank<Error>(message, other->failed_rank());
    }
    throw Error(message);
  }
  for (const LoadTarget& t : targets) {
    if (&t != params_target) t.copy_up();
  }

  // The training-precision parameters: the saved ones (bitwise, read in
  // place or copied up), or from the master weights in this engine's
  // precision.
  auto set_params = [&](const at::Tensor& values) { P.write_partition(values); };
  auto saved_params = [&] { params_target->copy_up(); };
  // (Read only where it is used: with NVMe the master is read from the file
  // a chunk at a time.)
  auto set_params_from_master = [&] {
    if (m.optimizer->swapped()) {
      P.write_partition([&](std::size_t offset, std::size_t n) {
        return m.optimizer->state_slice(detail::OptimizerPartition::State::kMaster, offset, n).to(dtype);
      });
      return;
    }
    const at::Tensor master = m.optimizer->full_master();
    set_params(master.narrow(0, 0, static_cast<std::int64_t>(L.partition_numel())).to(dtype));
  };
  if (keep_pending) {
    // The model computes with step t-1's parameters, the update of step t
    // waits in the update buffer (read into it above), as when the run was
    // saved.
    saved_params();
    m.update_index = m.grads->current() ^ 1;
    m.delayed->restore_pending(man.engine.steps);
  } else if (man.engine.update_pending) {
    // This engine has no delayed update (or another precision): the
    // pending update is applied now.
    if (apply_update) {
      saved_params();  // the update, read in place of the saved parameters
    } else {
      set_params_from_master();
    }
    if (m.rank == 0) {
      detail::log_info(log_topic::checkpoint,
                       "checkpoint %s had a delayed update pending; applied at load, as this engine "
                       "%s", where.c_str(),
                       m.delayed->enabled() ? "trains in another precision" : "has no delayed update");
    }
  } else if (same_dtype) {
    saved_params();
  } else {
    set_params_from_master();
  }
  m.params->publish(at::Tensor(), /*offloaded=*/false, comm_, m.ctx);  // the all-gather
  if (man.frozen_excluded && P.frozen_count() > 0 && m.rank == 0) {
    detail::log_info(log_topic::checkpoint,
                     "checkpoint %s was saved without its frozen parameters (exclude_frozen_parameters): "
                     "the module keeps its own %lld frozen parameters (build it on the base that run trained on)",
                     where.c_str(), static_cast<long long>(P.frozen_count()));
  }
  for (auto& [t, v] : module_updates) {
    if (P.partitions_frozen(t)) {
      P.load_frozen_share(t, v);  // into the rank's share
    } else {
      t.detach().copy_(v);
    }
  }
  if (P.frozen_partitioned() > 0) P.regather_frozen(comm_);  // those gathered now, from the shares
  if (rng.defined()) {
    at::Generator g = at::detail::getDefaultCPUGenerator();
    const std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(rng);
  }
  if (rng_device.defined()) {
    at::Generator g = at::globalContext().defaultGenerator(m.ctx.device);
    const std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(rng_device);
  }
  m.damaged_by.clear();

  stats_.step = man.engine.steps;
  stats_.skipped = man.engine.skipped;
  stats_.last_step_skipped = false;
  stats_.consecutive_skipped = 0;
  m.optimizer_step = man.engine.optimizer_step;
  m.micro_step = 0;
  m.backward_done = false;
  lr_ = static_cast<float>(man.engine.lr);
  stats_.lr = lr();  // (the config's scheduler: from the restored optimizer step)
  // Without a scheduler the rate is part of the training state (DeepSpeed's
  // optimizer state carries it): said where the config's rate changed since
  // the save (a rate set by set_lr() is the run's own: not said).
  std::string lr_note;
  if (!m.schedule && man.engine.config_lr && static_cast<float>(*man.engine.config_lr) != config_.optimizer.lr &&
      lr_ != config_.optimizer.lr) {
    lr_note = zero::detail::str_cat(
        "the checkpoint's learning rate ", lr_, " stays in force (it is part of the training state, as in "
        "DeepSpeed): the config's optimizer.params.lr, ", *man.engine.config_lr, " when it was saved, is ",
        config_.optimizer.lr, " now and is not used; call engine.set_lr() after the load for another rate "
        "(this is said at the first backward() after a load with no set_lr() before it)");
  }
  // Betas a scheduler set, as the rate: an engine without the scheduler
  // resumes with them, one with it from the restored step.
  m.held_betas.reset();
  if (man.engine.betas) {
    m.held_betas = LrSchedule::Betas{static_cast<float>(man.engine.betas->first),
                                     static_cast<float>(man.engine.betas->second)};
    // Said where they overrule the config's own pair from here on.
    const auto [b1, b2] = betas();
    if (!m.schedule && (b1 != config_.optimizer.beta1 || b2 != config_.optimizer.beta2)) {
      betas_note = zero::detail::str_cat(
          "the checkpoint's betas (", b1, ", ", b2, "), where its scheduler's momentum cycle left them, stay in "
          "force: this engine has no scheduler, so the config's optimizer.params.betas (", config_.optimizer.beta1,
          ", ", config_.optimizer.beta2, ") are not used (as DeepSpeed, where the scheduler wrote them into the "
          "optimizer's state); a OneCycle scheduler with cycle_momentum sets them from the saved step again");
    }
  }
  // The loss scale is fp16's: a checkpoint saved in fp32 or bf16 holds a
  // scale of 1 that no overflow ever moved, and fp16 starting there would
  // underflow its gradients until loss_scale_window clean steps raised it.
  // Such a load starts from the config's initial scale, as a fresh run does.
  const ckpt::LossScalerRecord& s = man.engine.scaler;
  const char* this_dtype = dtype_name_of(m.precision.dtype());
  const bool scaled_by_fp16 = man.dtype == "fp16";
  LossScaler::State restored{static_cast<float>(s.scale), s.hysteresis_left, s.iter, s.last_overflow_iter, s.skipped};
  if (!scaled_by_fp16) {
    // The config's initial scale (not this engine's current one, which steps
    // before the load may have moved).
    const LossScaler::State fresh = detail::Precision(config_).scaler().state();
    restored.scale = fresh.scale;
    restored.hysteresis_left = fresh.hysteresis_left;
  }
  m.precision.scaler().restore(restored);
  stats_.loss_scale = m.precision.loss_scale();
  if (m.rank == 0) {
    std::string precision;
    if (man.dtype != this_dtype) {
      precision = zero::detail::str_cat(", in ", man.dtype, "; now training in ", this_dtype);
      if (!scaled_by_fp16 && std::string(this_dtype) == "fp16") {
        precision += zero::detail::str_cat(" from the loss scale ", stats_.loss_scale);
      }
    }
    detail::log_info(log_topic::checkpoint,
                     "loaded checkpoint %s (step %lld; saved by %d rank(s) at stage %d%s%s)",
                     where.c_str(), static_cast<long long>(man.engine.steps), man.world_size, man.stage,
                     precision.c_str(), keep_pending ? ", its delayed update pending" : "");
    if (!settings_note.empty()) {
      zero::log(LogLevel::warning, log_topic::checkpoint_param_settings, "warning: " + settings_note);
    }
    if (!betas_note.empty()) zero::log(LogLevel::warning, log_topic::checkpoint, "warning: " + betas_note);
  }
  m.pending_lr_note = m.rank == 0 ? lr_note : std::string();
  return man.client_state;
}

}  // namespace zero
