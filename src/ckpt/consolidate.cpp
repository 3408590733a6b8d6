#include "zero/ckpt/consolidate.h"

#include <cstring>

#include "zero/ckpt/checkpoint_dir.h"
#include "zero/ckpt/reshard.h"
#include "zero/ckpt/safetensors.h"
#include "zero/ckpt/shard_io.h"
#include "zero/core/error.h"
#include "zero/core/half.h"

namespace zero::ckpt {

namespace fs = std::filesystem;

OpenCheckpoint open_checkpoint(const fs::path& dir, const std::string& tag, const TagWording& wording) {
  OpenCheckpoint c;
  const std::string t = resolve_tag(dir, tag, wording);
  c.folder = dir / t;
  const fs::path m = c.folder / kManifestName;
  c.manifest = parse_manifest(read_text(m), m.string());
  return c;
}

void verify_files(const OpenCheckpoint& c, const std::function<void(std::size_t)>& progress) {
  for (std::size_t i = 0; i < c.manifest.files.size(); ++i) {
    read_file(c.folder / c.manifest.files[i].name, c.manifest.files[i], {});
    if (progress) progress(i);
  }
}

std::vector<std::string> missing_or_short_files(const OpenCheckpoint& c) {
  std::vector<std::string> problems;
  for (const FileRecord& f : c.manifest.files) {
    std::error_code ec;
    const std::uintmax_t size = fs::file_size(c.folder / f.name, ec);
    if (ec) {
      problems.push_back(f.name + ": " + (ec == std::errc::no_such_file_or_directory ? "missing" : ec.message()));
    } else if (size != f.bytes) {
      problems.push_back(zero::detail::str_cat(f.name, ": ", size, " bytes, the manifest records ", f.bytes,
                                               size < f.bytes ? " (truncated)" : " (grown)"));
    }
  }
  return problems;
}

std::vector<float> read_param(const OpenCheckpoint& c, std::size_t i) {
  const Manifest& m = c.manifest;
  std::vector<float> out(m.params.at(i).numel);
  std::vector<ElementRun> runs;
  locate(m, i, 0, out.size(), 0, runs);
  for (const ElementRun& r : runs) {
    const FileRecord& f = m.files[static_cast<std::size_t>(r.shard)];
    const SectionRecord* s = f.find("master");
    ZERO_CHECK(s != nullptr, "checkpoint file ", f.name, " has no master section");
    read_range(c.folder / f.name, f, s->offset + r.src * 4, r.n * 4, out.data() + r.dst);
  }
  return out;
}

std::vector<unsigned char> read_module_tensor(const OpenCheckpoint& c, const std::string& section, std::string* dtype) {
  const FileRecord& f = c.manifest.files.at(0);
  const SectionRecord* s = f.find(section);
  ZERO_CHECK(s != nullptr, "checkpoint has no module tensor ", section);
  std::vector<unsigned char> raw(s->bytes);
  read_range(c.folder / f.name, f, s->offset, s->bytes, raw.data());
  *dtype = s->dtype;
  if (s->dtype != "bf16" && s->dtype != "fp16") return raw;
  const std::size_t n = raw.size() / 2;
  std::vector<unsigned char> wide(n * 4);
  for (std::size_t k = 0; k < n; ++k) {
    std::uint16_t h;
    std::memcpy(&h, raw.data() + 2 * k, 2);
    const float v = s->dtype == "bf16" ? bf16_to_float(h) : fp16_to_float(h);
    std::memcpy(wide.data() + 4 * k, &v, 4);
  }
  *dtype = "fp32";
  return wide;
}

std::string safetensors_dtype(const std::string& d) {
  if (d == "fp32") return "F32";
  if (d == "bf16") return "BF16";
  if (d == "fp16") return "F16";
  if (d == "f64") return "F64";
  if (d == "i64") return "I64";
  if (d == "i32") return "I32";
  if (d == "u8") return "U8";
  if (d == "bool") return "BOOL";
  ZERO_CHECK(false, "no safetensors dtype for ", d);
  return {};
}

std::size_t consolidate(const OpenCheckpoint& c, const fs::path& out,
                        const std::function<void(std::size_t, std::size_t)>& progress) {
  const Manifest& m = c.manifest;
  std::vector<SafetensorsEntry> entries;
  for (const ParamRecord& p : m.params) entries.push_back({p.name, "F32", p.shape, p.numel * 4});
  for (const std::string& t : m.module_tensors) {
    const SectionRecord* s = m.files[0].find(t);
    const bool half = s->dtype == "bf16" || s->dtype == "fp16";
    entries.push_back({t.substr(7), half ? "F32" : safetensors_dtype(s->dtype), s->shape, half ? s->bytes * 2 : s->bytes});
  }
  SafetensorsWriter w(out, entries, {{"format", "pt"}, {"zerocpp_tag", m.tag}});
  const std::size_t total = entries.size();
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const std::vector<float> v = read_param(c, i);
    w.write(i, 0, v.data(), v.size() * 4);
    if (progress) progress(i + 1, total);
  }
  for (std::size_t k = 0; k < m.module_tensors.size(); ++k) {
    std::string dtype;
    const std::vector<unsigned char> v = read_module_tensor(c, m.module_tensors[k], &dtype);
    w.write(m.params.size() + k, 0, v.data(), v.size());
    if (progress) progress(m.params.size() + k + 1, total);
  }
  w.finish();
  return total;
}

}  // namespace zero::ckpt
