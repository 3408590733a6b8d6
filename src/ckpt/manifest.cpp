#include "zero/ckpt/manifest.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "zero/ckpt/crc32c.h"
#include "zero/core/error.h"
#include "zero/version.h"

namespace zero::ckpt {

using nlohmann::json;

const SectionRecord* FileRecord::find(std::string_view section) const {
  for (const SectionRecord& s : sections) {
    if (s.name == section) return &s;
  }
  return nullptr;
}

std::size_t Manifest::dtype_size(std::string_view d) {
  if (d == "fp32" || d == "i32") return 4;
  if (d == "bf16" || d == "fp16") return 2;
  if (d == "f64" || d == "i64") return 8;
  if (d == "u8" || d == "bool") return 1;
  return 0;
}

std::string Manifest::partition_dtype(std::string_view name) const {
  return name == "params" || name == "update" ? dtype : std::string("fp32");
}

std::uint64_t Manifest::numel() const {
  std::uint64_t n = 0;
  for (const ParamRecord& p : params) n += p.numel;
  return n;
}

bool is_plain_file_name(std::string_view name) {
  if (name.empty() || name.size() > 128 || name.front() == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

namespace {

// 8 lower-case hex digits of the CRC-32C of `text`.
std::string crc_hex(const std::string& text) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc32c(0, text.data(), text.size()));
  return buf;
}

// Reads the manifest's fields with errors that name the field and the file.
struct Reader {
  const std::string& where;

  [[noreturn]] void fail(const std::string& field, const std::string& problem) const {
    throw Error(zero::detail::str_cat("checkpoint manifest ", where, ": ", field, " ", problem,
                                      ". The manifest is damaged or not a zerocpp checkpoint's; save the checkpoint "
                                      "again or load another tag"));
  }
  const json& at(const json& j, const char* key, const std::string& field) const {
    if (!j.is_object() || !j.contains(key)) fail(field + "." + key, "is missing");
    return j.at(key);
  }
  std::uint64_t count(const json& j, const char* key, const std::string& field,
                      std::uint64_t max = kMaxBytes) const {
    const json& v = at(j, key, field);
    const std::string f = field + "." + key;
    if (v.is_number_unsigned()) {
      const auto n = v.get<std::uint64_t>();
      if (n > max) fail(f, "is " + std::to_string(n) + ", more than the limit " + std::to_string(max));
      return n;
    }
    if (v.is_number_integer()) fail(f, "is negative (" + std::to_string(v.get<std::int64_t>()) + ")");
    fail(f, "is not a non-negative integer");
  }
  std::int64_t integer(const json& j, const char* key, const std::string& field) const {
    const json& v = at(j, key, field);
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > kMaxBytes) fail(field + "." + key, "is too large");
    if (!v.is_number_integer()) fail(field + "." + key, "is not an integer");
    return v.get<std::int64_t>();
  }
  double number(const json& j, const char* key, const std::string& field) const {
    const json& v = at(j, key, field);
    if (!v.is_number()) fail(field + "." + key, "is not a number");
    return v.get<double>();
  }
  bool boolean(const json& j, const char* key, const std::string& field) const {
    const json& v = at(j, key, field);
    if (!v.is_boolean()) fail(field + "." + key, "is not true or false");
    return v.get<bool>();
  }
  std::string string(const json& j, const char* key, const std::string& field) const {
    const json& v = at(j, key, field);
    if (!v.is_string()) fail(field + "." + key, "is not a string");
    return v.get<std::string>();
  }
  const json& array(const json& j, const char* key, const std::string& field) const {
    const json& v = at(j, key, field);
    if (!v.is_array()) fail(field + "." + key, "is not an array");
    return v;
  }
  std::vector<std::int64_t> shape(const json& j, const std::string& field, std::uint64_t* numel) const {
    const json& v = array(j, "shape", field);
    if (v.size() > 16) fail(field + ".shape", "has more than 16 dimensions");
    std::vector<std::int64_t> s;
    std::uint64_t n = 1;
    for (const json& d : v) {
      if (!d.is_number_unsigned()) fail(field + ".shape", "holds a dimension that is not a non-negative integer");
      const auto k = d.get<std::uint64_t>();
      if (k > kMaxBytes || (k != 0 && n > kMaxBytes / k)) fail(field + ".shape", "is too large");
      n *= k;
      s.push_back(static_cast<std::int64_t>(k));
    }
    if (numel) *numel = n;
    return s;
  }
};

void check_sections(const Reader& r, const FileRecord& f, const std::string& field) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  std::set<std::string> names;
  for (const SectionRecord& s : f.sections) {
    const std::string sf = field + ".sections[" + s.name + "]";
    if (!names.insert(s.name).second) r.fail(sf, "appears twice");
    if (Manifest::dtype_size(s.dtype) == 0) r.fail(sf + ".dtype", "'" + s.dtype + "' is not a known element type");
    if (s.bytes % Manifest::dtype_size(s.dtype) != 0) r.fail(sf + ".bytes", "is not a whole number of elements");
    if (s.offset > f.bytes || s.bytes > f.bytes - s.offset) {
      r.fail(sf, "lies outside its file (offset " + std::to_string(s.offset) + " + " + std::to_string(s.bytes) +
                     " bytes > " + std::to_string(f.bytes) + ")");
    }
    if (s.bytes > 0) ranges.emplace_back(s.offset, s.offset + s.bytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) r.fail(field + ".sections", "overlap");
  }
}

FileRecord read_file_record(const Reader& r, const json& j, const std::string& f) {
  FileRecord fr;
  fr.name = r.string(j, "name", f);
  if (!is_plain_file_name(fr.name)) r.fail(f + ".name", "'" + fr.name + "' is not a plain file name");
  fr.rank = static_cast<int>(r.count(j, "rank", f, 1u << 20));
  fr.bytes = r.count(j, "bytes", f);
  fr.crc32c = static_cast<std::uint32_t>(r.count(j, "crc32c", f, 0xFFFFFFFFu));
  for (const json& s : r.array(j, "sections", f)) {
    SectionRecord sr;
    sr.name = r.string(s, "name", f + ".sections[]");
    sr.dtype = r.string(s, "dtype", f + ".sections[" + sr.name + "]");
    if (s.contains("shape")) sr.shape = r.shape(s, f + ".sections[" + sr.name + "]", nullptr);
    sr.offset = r.count(s, "offset", f + ".sections[" + sr.name + "]");
    sr.bytes = r.count(s, "bytes", f + ".sections[" + sr.name + "]");
    fr.sections.push_back(std::move(sr));
  }
  check_sections(r, fr, f);
  return fr;
}

void check_layout(const Reader& r, const Manifest& m) {
  std::uint64_t flat = 0, part = 0;
  for (std::size_t i = 0; i < m.buckets.size(); ++i) {
    const BucketRecord& b = m.buckets[i];
    const std::string f = "layout.buckets[" + std::to_string(i) + "]";
    if (b.offset != flat) r.fail(f + ".offset", "does not follow the bucket before it");
    if (b.partition_offset != part) r.fail(f + ".partition_offset", "does not follow the bucket before it");
    if (b.numel > b.padded) r.fail(f + ".numel", "is larger than its padded size");
    if (b.padded % static_cast<std::uint64_t>(m.shard_world) != 0 ||
        b.padded / static_cast<std::uint64_t>(m.shard_world) != b.chunk) {
      r.fail(f + ".chunk", "times shard_world is not its padded size");
    }
    flat += b.padded;
    part += b.chunk;
    if (flat > kMaxBytes) r.fail("layout.buckets", "add up to more than the limit");
  }
  if (flat != m.padded_numel) r.fail("layout.padded_numel", "is not the sum of the buckets' sizes");
  if (part != m.partition_numel) r.fail("layout.partition_numel", "is not the sum of the buckets' chunks");
  // Every parameter inside one bucket's values, none overlapping.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  std::set<std::string> names;
  for (const ParamRecord& p : m.params) {
    const std::string f = "params[" + p.name + "]";
    if (p.name.empty()) r.fail("params", "holds a parameter without a name");
    if (!names.insert(p.name).second) r.fail(f, "appears twice");
    auto it = std::upper_bound(m.buckets.begin(), m.buckets.end(), p.offset,
                               [](std::uint64_t o, const BucketRecord& b) { return o < b.offset; });
    if (it == m.buckets.begin()) r.fail(f + ".offset", "is in no bucket");
    const BucketRecord& b = *(it - 1);
    if (p.offset + p.numel > b.offset + b.numel) r.fail(f, "runs past the values of its bucket");
    if (p.numel > 0) ranges.emplace_back(p.offset, p.offset + p.numel);
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) r.fail("params", "overlap in the flat buffer");
  }
}

}  // namespace

FileRecord parse_file_record(const nlohmann::json& j, const std::string& where) {
  return read_file_record(Reader{where}, j, "file");
}

nlohmann::json file_record_to_json(const FileRecord& f) {
  json sections = json::array();
  for (const SectionRecord& s : f.sections) {
    // A module tensor's shape (possibly [], a scalar) is always written; an
    // absent shape reads back as [] too.
    json e = {{"name", s.name}, {"dtype", s.dtype}, {"offset", s.offset}, {"bytes", s.bytes}};
    if (!s.shape.empty() || s.name.rfind("module.", 0) == 0) e["shape"] = s.shape;
    sections.push_back(e);
  }
  return {{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}, {"crc32c", f.crc32c}, {"sections", sections}};
}

Manifest parse_manifest(std::string_view text, const std::string& where) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    ZERO_CHECK(false, "checkpoint manifest ", where, " is not valid JSON (", e.what(),
               "): the save that wrote it did not finish, or the file was changed; load another tag");
  }
  const Reader r{where};
  Manifest m;
  // Not j.value("format", ...): it throws json::type_error when "format" is not a string.
  const auto format = j.is_object() ? j.find("format") : j.end();
  ZERO_CHECK(format != j.end() && format->is_string() && format->get_ref<const std::string&>() == kFormatName,
             "checkpoint manifest ", where,
             " is not a zerocpp checkpoint manifest (no \"format\": \"", kFormatName, "\")");
  const std::int64_t version = r.integer(j, "format_version", "manifest");
  m.format_version = static_cast<int>(std::max<std::int64_t>(version, 0));
  ZERO_CHECK(m.format_version <= kFormatVersion, "checkpoint manifest ", where, " has format version ",
             m.format_version, ", newer than this zerocpp reads (", kFormatVersion,
             "): load it with the zerocpp that wrote it, or a newer one");
  ZERO_CHECK(m.format_version >= 1, "checkpoint manifest ", where, " has format version ", m.format_version,
             ", which does not exist");
  // The manifest's own checksum (format 2): the shards have theirs, and a
  // byte changed here (a name, a shape, a step count) would otherwise load
  // as a different model or state without a word.
  if (const auto sum = j.find("manifest_crc32c"); sum != j.end()) {
    ZERO_CHECK(sum->is_string(), "checkpoint manifest ", where, ": manifest_crc32c is not a string");
    const std::string stored = sum->get<std::string>();
    json body = j;
    body.erase("manifest_crc32c");
    const std::string computed = crc_hex(body.dump());
    ZERO_CHECK(stored == computed, "checkpoint manifest ", where,
               " is damaged: its contents do not match its checksum (manifest_crc32c ", stored, ", computed ",
               computed, "): it was changed after the save wrote it. Load another tag, or restore the file");
  } else {
    ZERO_CHECK(version < 2, "checkpoint manifest ", where, " has format version ", version,
               " but no manifest_crc32c: it was changed after the save wrote it. Load another tag");
  }
  ZERO_CHECK(version <= kFormatVersion, "checkpoint manifest ", where, " has format version ", version,
             ", newer than this zerocpp reads (", kFormatVersion,
             "): load it with the zerocpp that wrote it, or a newer one");
  m.tag = r.string(j, "tag", "manifest");
  m.world_size = static_cast<int>(r.count(j, "world_size", "manifest", 1u << 20));
  if (m.world_size < 1) r.fail("manifest.world_size", "is 0");
  m.stage = static_cast<int>(r.count(j, "stage", "manifest", 3));
  m.dtype = r.string(j, "dtype", "manifest");
  if (m.dtype != "fp32" && m.dtype != "bf16" && m.dtype != "fp16") r.fail("manifest.dtype", "is not fp32, bf16 or fp16");
  m.optimizer = r.string(j, "optimizer", "manifest");
  m.moments = static_cast<int>(r.count(j, "moments", "manifest", 2));
  if (m.moments < 1) r.fail("manifest.moments", "is 0");
  m.offload = r.boolean(j, "offload", "manifest");
  m.delayed_update = r.boolean(j, "delayed_update", "manifest");

  const json& L = r.at(j, "layout", "manifest");
  m.shard_world = static_cast<int>(r.count(L, "shard_world", "layout", 1u << 20));
  if (m.shard_world != (m.stage == 0 ? 1 : m.world_size)) {
    r.fail("layout.shard_world", "is not 1 at stage 0 and the world size otherwise");
  }
  m.padded_numel = r.count(L, "padded_numel", "layout");
  m.partition_numel = r.count(L, "partition_numel", "layout");
  for (const json& b : r.array(L, "buckets", "layout")) {
    BucketRecord br;
    br.offset = r.count(b, "offset", "layout.buckets[]");
    br.numel = r.count(b, "numel", "layout.buckets[]");
    br.padded = r.count(b, "padded", "layout.buckets[]");
    br.chunk = r.count(b, "chunk", "layout.buckets[]");
    br.partition_offset = r.count(b, "partition_offset", "layout.buckets[]");
    m.buckets.push_back(br);
  }
  for (const json& p : r.array(j, "params", "manifest")) {
    ParamRecord pr;
    pr.name = r.string(p, "name", "params[]");
    pr.shape = r.shape(p, "params[" + pr.name + "]", &pr.numel);
    pr.offset = r.count(p, "offset", "params[" + pr.name + "]");
    // Optional: the parameter's own optimizer settings, each a number >= 0.
    for (auto [key, field] : {std::pair{"weight_decay", &ParamRecord::weight_decay},
                              std::pair{"lr_scale", &ParamRecord::lr_scale}}) {
      if (!p.contains(key)) continue;
      const double v = r.number(p, key, "params[" + pr.name + "]");
      if (!(v >= 0.0) || !(v <= std::numeric_limits<float>::max())) {
        r.fail("params[" + pr.name + "]." + key, "is not a finite number >= 0 (that a float holds)");
      }
      pr.*field = v;
    }
    if (p.contains("muon")) pr.muon = r.boolean(p, "muon", "params[" + pr.name + "]");
    m.params.push_back(std::move(pr));
  }
  if (m.params.empty()) r.fail("manifest.params", "is empty");
  check_layout(r, m);
  for (const json& s : r.array(j, "partition_sections", "manifest")) {
    if (!s.is_string()) r.fail("manifest.partition_sections", "holds a non-string");
    m.partition_sections.push_back(s.get<std::string>());
  }
  const auto has_section = [&](const char* n) {
    return std::find(m.partition_sections.begin(), m.partition_sections.end(), n) != m.partition_sections.end();
  };
  for (const char* needed : {"master", "exp_avg"}) {
    if (!has_section(needed)) r.fail("manifest.partition_sections", std::string("lacks \"") + needed + "\"");
  }
  if (m.moments == 2 && !has_section("exp_avg_sq")) r.fail("manifest.partition_sections", "lacks \"exp_avg_sq\"");

  const json& E = r.at(j, "engine", "manifest");
  m.engine.steps = static_cast<std::int64_t>(r.count(E, "steps", "engine"));
  m.engine.optimizer_step = static_cast<std::int64_t>(r.count(E, "optimizer_step", "engine"));
  m.engine.skipped = static_cast<std::int64_t>(r.count(E, "skipped", "engine"));
  m.engine.lr = r.number(E, "lr", "engine");
  if (E.contains("config_lr")) m.engine.config_lr = r.number(E, "config_lr", "engine");
  if (E.contains("betas")) {  // (older checkpoints have none: the config's betas)
    const json& b = E.at("betas");
    // (Any finite pair: a momentum decay can leave the next step's beta1 at
    // 1 or past it, which the engine refuses when it would step with it.)
    auto finite = [](const json& v) { return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0.0; };
    if (!b.is_array() || b.size() != 2 || !finite(b[0]) || !finite(b[1])) {
      r.fail("engine.betas", "is not two finite numbers >= 0");
    }
    m.engine.betas = std::pair{b[0].get<double>(), b[1].get<double>()};
  }
  m.engine.update_pending = r.boolean(E, "update_pending", "engine");
  const json& S = r.at(E, "loss_scaler", "engine");
  m.engine.scaler.scale = r.number(S, "scale", "engine.loss_scaler");
  if (!(m.engine.scaler.scale > 0.0) || m.engine.scaler.scale > 3.4e38) r.fail("engine.loss_scaler.scale", "is not a positive finite float");
  m.engine.scaler.hysteresis_left = static_cast<int>(r.count(S, "hysteresis_left", "engine.loss_scaler", 1u << 30));
  m.engine.scaler.iter = static_cast<std::int64_t>(r.count(S, "iter", "engine.loss_scaler"));
  m.engine.scaler.last_overflow_iter = r.integer(S, "last_overflow_iter", "engine.loss_scaler");
  if (m.engine.scaler.last_overflow_iter < -1) r.fail("engine.loss_scaler.last_overflow_iter", "is below -1");
  m.engine.scaler.skipped = static_cast<std::int64_t>(r.count(S, "skipped", "engine.loss_scaler"));
  if (m.engine.update_pending && !has_section("params")) {
    r.fail("manifest.partition_sections", "lacks \"params\", which a pending delayed update needs");
  }

  const json& F = r.array(j, "files", "manifest");
  if (F.size() != static_cast<std::size_t>(m.world_size)) r.fail("manifest.files", "does not list one file per rank");
  std::set<std::string> file_names;
  for (std::size_t i = 0; i < F.size(); ++i) {
    const std::string f = "files[" + std::to_string(i) + "]";
    FileRecord fr = read_file_record(r, F[i], f);
    if (!file_names.insert(fr.name).second) r.fail(f + ".name", "appears twice");
    if (fr.rank != static_cast<int>(i)) r.fail(f + ".rank", "is not " + std::to_string(i));
    if (fr.rank < m.shard_world) {
      for (const std::string& name : m.partition_sections) {
        const SectionRecord* s = fr.find(name);
        if (!s) r.fail(f + ".sections", "lacks the partition section \"" + name + "\"");
        if (s->dtype != m.partition_dtype(name)) r.fail(f + ".sections[" + name + "].dtype", "is not " + m.partition_dtype(name));
        if (s->bytes != m.partition_numel * Manifest::dtype_size(s->dtype)) {
          r.fail(f + ".sections[" + name + "].bytes", "is not partition_numel elements");
        }
      }
    }
    m.files.push_back(std::move(fr));
  }
  for (const json& t : r.array(j, "module_tensors", "manifest")) {
    if (!t.is_string()) r.fail("manifest.module_tensors", "holds a non-string");
    const std::string n = t.get<std::string>();
    const SectionRecord* s = m.files[0].find(n);
    if (!s) r.fail("manifest.module_tensors", "names '" + n + "', which is not a section of files[0]");
    std::uint64_t numel = 1;
    for (std::int64_t d : s->shape) numel *= static_cast<std::uint64_t>(d);
    if (numel * Manifest::dtype_size(s->dtype) != s->bytes) {
      r.fail("files[0].sections[" + n + "]", "holds a number of bytes its shape and dtype do not give");
    }
    m.module_tensors.push_back(n);
  }
  if (j.contains("frozen_parameters_excluded")) {
    const json& f = j.at("frozen_parameters_excluded");
    if (!f.is_boolean()) r.fail("manifest.frozen_parameters_excluded", "is not true or false");
    m.frozen_excluded = f.get<bool>();
  }
  if (j.contains("client_state")) m.client_state = j.at("client_state");
  return m;
}

std::string manifest_to_json(const Manifest& m) {
  json j;
  j["format"] = kFormatName;
  j["format_version"] = m.format_version;
  // Which zerocpp wrote it (informational: the format version is what a
  // reader checks).
  j["zerocpp_version"] = version();
  j["tag"] = m.tag;
  j["world_size"] = m.world_size;
  j["stage"] = m.stage;
  j["dtype"] = m.dtype;
  j["optimizer"] = m.optimizer;
  j["moments"] = m.moments;
  j["offload"] = m.offload;
  j["delayed_update"] = m.delayed_update;
  json buckets = json::array();
  for (const BucketRecord& b : m.buckets) {
    buckets.push_back({{"offset", b.offset}, {"numel", b.numel}, {"padded", b.padded}, {"chunk", b.chunk},
                       {"partition_offset", b.partition_offset}});
  }
  j["layout"] = {{"shard_world", m.shard_world}, {"padded_numel", m.padded_numel},
                 {"partition_numel", m.partition_numel}, {"buckets", buckets}};
  json params = json::array();
  for (const ParamRecord& p : m.params) {
    json pj = {{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}};
    if (p.weight_decay) pj["weight_decay"] = *p.weight_decay;
    if (p.lr_scale) pj["lr_scale"] = *p.lr_scale;
    if (p.muon) pj["muon"] = *p.muon;
    params.push_back(std::move(pj));
  }
  j["params"] = params;
  j["partition_sections"] = m.partition_sections;
  const LossScalerRecord& s = m.engine.scaler;
  j["engine"] = {{"steps", m.engine.steps}, {"optimizer_step", m.engine.optimizer_step},
                 {"skipped", m.engine.skipped}, {"lr", m.engine.lr}, {"update_pending", m.engine.update_pending},
                 {"loss_scaler", {{"scale", s.scale}, {"hysteresis_left", s.hysteresis_left}, {"iter", s.iter},
                                  {"last_overflow_iter", s.last_overflow_iter}, {"skipped", s.skipped}}}};
  if (m.engine.betas) j["engine"]["betas"] = {m.engine.betas->first, m.engine.betas->second};
  if (m.engine.config_lr) j["engine"]["config_lr"] = *m.engine.config_lr;
  json files = json::array();
  for (const FileRecord& f : m.files) files.push_back(file_record_to_json(f));
  j["files"] = files;
  j["module_tensors"] = m.module_tensors;
  if (m.frozen_excluded) j["frozen_parameters_excluded"] = true;
  j["client_state"] = m.client_state;
  sign_manifest(j);
  return j.dump(1);
}

void sign_manifest(json& j) {
  j.erase("manifest_crc32c");
  j["manifest_crc32c"] = crc_hex(j.dump());
}

}  // namespace zero::ckpt
