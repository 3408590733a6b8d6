// A checkpoint's manifest (manifest.json, written by rank 0 last): what was
// saved, by which layout, in which files. Everything the readers trust comes
// from here, so parse_manifest() checks it whole before anyone reads a byte
// of a shard: sizes within bounds, offsets inside their files and buckets,
// no overlaps, file names without paths. docs/checkpoints.md has the format.
//
// The state is addressed as the engine's flat layout (zero/zero/flat_layout.h)
// describes it: each rank r < shard_world writes its partition (its chunk of
// every bucket, in bucket order) of each partition section (the fp32 master,
// the moments, the training-precision parameters, a pending delayed update)
// to its file; a parameter's element e is at flat index offset + e, which
// the buckets map to (owner rank, position in its partition). A reader on
// another layout maps its own partition the same way, parameter by name.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace zero::ckpt {

// 2: the manifest carries "manifest_crc32c", the CRC-32C of its own compact
// JSON without that key (8 hex digits), checked at parse; 1 (no checksum) is
// still read.
inline constexpr int kFormatVersion = 2;
inline constexpr const char* kFormatName = "zerocpp-checkpoint";
// No count, offset or size in a manifest may exceed this (2^50: a petabyte).
inline constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 50;

struct BucketRecord {
  std::uint64_t offset = 0, numel = 0, padded = 0, chunk = 0, partition_offset = 0;
};

struct ParamRecord {
  std::string name;
  std::vector<std::int64_t> shape;
  std::uint64_t numel = 0;
  std::uint64_t offset = 0;  // in the flat buffer
  // The parameter's own optimizer settings (zero::EngineOptions'
  // weight_decay and lr_scale rules), recorded where the engine that saved
  // it had rules; absent otherwise (and in checkpoints of earlier versions).
  std::optional<double> weight_decay, lr_scale;
  // Optimizer "Muon": whether the parameter stepped with Muon (its exp_avg
  // the momentum, its exp_avg_sq the last orthogonalized update) or with
  // the Adam half; absent for other optimizers.
  std::optional<bool> muon;
};

// A range of bytes of one file.
struct SectionRecord {
  std::string name;
  std::string dtype;                // fp32, bf16, fp16, f64, i64, i32, u8, bool
  std::vector<std::int64_t> shape;  // module tensors only
  std::uint64_t offset = 0, bytes = 0;
};

struct FileRecord {
  std::string name;  // a plain file name in the checkpoint's folder
  int rank = 0;      // the rank that wrote it
  std::uint64_t bytes = 0;
  std::uint32_t crc32c = 0;
  std::vector<SectionRecord> sections;
  const SectionRecord* find(std::string_view section) const;
};

struct LossScalerRecord {
  double scale = 1.0;
  int hysteresis_left = 0;
  std::int64_t iter = 0, last_overflow_iter = -1, skipped = 0;
};

// The engine's counters and the delayed update.
struct EngineRecord {
  std::int64_t steps = 0;           // optimizer steps taken
  std::int64_t optimizer_step = 0;  // the optimizer's own count (bias correction)
  std::int64_t skipped = 0;
  double lr = 0.0;
  // The config's optimizer.params.lr of the run that saved it (absent in
  // older checkpoints): a load tells a changed config from set_lr()'s rate.
  std::optional<double> config_lr;
  // The betas of the next step where a scheduler set them (OneCycle's
  // momentum cycle, or where it left them at set_lr()); absent: the config's.
  std::optional<std::pair<double, double>> betas;
  bool update_pending = false;  // a delayed update computed, not yet in the parameters
  LossScalerRecord scaler;
};

struct Manifest {
  int format_version = kFormatVersion;
  std::string tag;
  int world_size = 1;
  int stage = 0;
  std::string dtype = "fp32";  // the training precision
  std::string optimizer;       // config optimizer.type
  int moments = 2;             // Adam 2 (exp_avg, exp_avg_sq), Adagrad 1 (exp_avg: the sum), Lion 1 (exp_avg)
  bool offload = false, delayed_update = false;
  // The layout.
  int shard_world = 1;
  std::uint64_t padded_numel = 0, partition_numel = 0;
  std::vector<BucketRecord> buckets;
  std::vector<ParamRecord> params;
  // Names of the partition sections, each partition_numel elements, in
  // every file of a rank < shard_world.
  std::vector<std::string> partition_sections;
  EngineRecord engine;
  std::vector<FileRecord> files;  // one per rank, files[r].rank == r
  // Sections of files[0] that are module tensors (frozen parameters and
  // floating-point buffers), by their module names.
  std::vector<std::string> module_tensors;
  // Saved with exclude_frozen_parameters: module_tensors holds the buffers
  // only (optional key "frozen_parameters_excluded", written when true).
  bool frozen_excluded = false;
  nlohmann::json client_state = nlohmann::json::object();  // the caller's (data position, ...)

  // Element size of a section dtype (0: unknown).
  static std::size_t dtype_size(std::string_view dtype);
  // The element type of partition section `name`: fp32, or `dtype` for
  // "params" and "update".
  std::string partition_dtype(std::string_view name) const;
  std::uint64_t numel() const;  // parameters only
};

// Checks everything (see the top of this file); `where` names the file in
// errors. Throws zero::Error naming the field and the problem.
Manifest parse_manifest(std::string_view text, const std::string& where);
std::string manifest_to_json(const Manifest& m);
// Sets j's "manifest_crc32c" for what j holds now (manifest_to_json does;
// tests that edit a manifest on purpose re-sign it to reach the field checks).
void sign_manifest(nlohmann::json& j);
// One file's record as the manifest lists it, and back (checked as in
// parse_manifest: a plain name, sizes within bounds, sections inside the
// file and not overlapping). The ranks send theirs to rank 0 this way.
nlohmann::json file_record_to_json(const FileRecord& f);
FileRecord parse_file_record(const nlohmann::json& j, const std::string& where);

// Whether `name` may be a file of a checkpoint: letters, digits, '.', '_',
// '-', not starting with '.', at most 128 characters.
bool is_plain_file_name(std::string_view name);

}  // namespace zero::ckpt
