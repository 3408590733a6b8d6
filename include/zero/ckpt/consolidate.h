// A checkpoint read back whole, offline, in bounded memory: each parameter's
// fp32 master values gathered from the ranks' files (the largest parameter
// is the most held at once), the files' checksums verified in one streaming
// pass, and the whole state written as one safetensors file.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "zero/ckpt/checkpoint_dir.h"
#include "zero/ckpt/manifest.h"

namespace zero::ckpt {

struct OpenCheckpoint {
  std::filesystem::path folder;  // <dir>/<tag>
  Manifest manifest;
};
// <dir>/<tag> ("latest" resolved), its manifest parsed and checked; the
// errors name the tag as `wording` says (checkpoint_dir.h).
OpenCheckpoint open_checkpoint(const std::filesystem::path& dir, const std::string& tag,
                               const TagWording& wording = {});

// One line per file of the manifest that is missing or not its recorded
// size (a stat each, nothing read); empty when all are there.
std::vector<std::string> missing_or_short_files(const OpenCheckpoint& c);

// Reads every file whole and checks its size and CRC-32C; throws naming the
// first bad one. progress(file index) after each.
void verify_files(const OpenCheckpoint& c, const std::function<void(std::size_t)>& progress = {});

// Parameter i's fp32 master values (its shape's row-major order).
std::vector<float> read_param(const OpenCheckpoint& c, std::size_t i);
// Module tensor `section` (a name of manifest.module_tensors) widened to
// fp32 when it is a 16-bit float; other dtypes as stored. Its bytes.
std::vector<unsigned char> read_module_tensor(const OpenCheckpoint& c, const std::string& section, std::string* dtype);

// Every trainable parameter (fp32, from the master weights) and module
// tensor under the module's names into one safetensors file at `out`.
// Returns the number of tensors.
std::size_t consolidate(const OpenCheckpoint& c, const std::filesystem::path& out,
                        const std::function<void(std::size_t, std::size_t)>& progress = {});

// safetensors' name of a manifest dtype (F32, BF16, ...).
std::string safetensors_dtype(const std::string& dtype);

}  // namespace zero::ckpt
