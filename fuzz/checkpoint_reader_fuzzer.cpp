// libFuzzer target for the checkpoint readers (zero_ckpt): the input is the
// text of a manifest.json.
//
// parse_manifest must return a Manifest or throw zero::Error (not
// zero::InternalError); anything else that escapes aborts, a finding. A
// manifest it accepts is then used the way a load uses it, and what its
// validation promises is checked:
//   * manifest_to_json of it parses again, to the same text;
//   * every file name is a plain file name;
//   * each file record: a shard made of the input's bytes is written into
//     this process's temp folder (exactly rec.bytes long, or a few bytes off;
//     only when rec.bytes <= 1 MiB and the input's total stays under 4 MiB,
//     else a short file) and read_file reads its sections, sometimes with an
//     extra range that overlaps them or one past the end. A file of the
//     right size with every range inside it reads without error and copies
//     the right bytes: to dst, or to a sink that gets each range's bytes
//     once, front to back; with the checksum checked, it reads iff the
//     checksum matches. A wrong size or a range past the end is a zero::Error
//     before anything is copied;
//   * locate maps each parameter (whole when numel <= 1 << 20, else a piece)
//     to runs inside the saved partitions (shard < shard_world, src + n <=
//     partition_numel) that hold the parameter's elements, in order;
//   * plan_partition on the saved layout itself is the identity, and on a
//     resharded target (the same buckets repadded for 1 to 4 ranks) fills the
//     target partitions from inside the saved ones, element for element,
//     without overlaps or padding, every parameter element once.
// The same input is also a safetensors header (zero-train --init-from's
// reader): after an 8-byte length, with the input again as data (and, from
// the hash, a length that lies); SafetensorsReader must throw zero::Error or
// accept it, and every entry it accepts reads whole, inside the file.
// A finding prints one line and traps. Files are only ever written under
// temp_dir() with names of this file's making, never the manifest's.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "zero/ckpt/checkpoint_dir.h"
#include "zero/ckpt/crc32c.h"
#include "zero/ckpt/manifest.h"
#include "zero/ckpt/reshard.h"
#include "zero/ckpt/safetensors_reader.h"
#include "zero/ckpt/shard_io.h"
#include "zero/core/error.h"

namespace {

namespace fs = std::filesystem;
namespace ck = zero::ckpt;

constexpr std::uint64_t kMaxFileBytes = std::uint64_t{1} << 20;   // a shard written in full
constexpr std::uint64_t kMaxInputBytes = std::uint64_t{4} << 20;  // all shards of one input
constexpr std::uint64_t kMaxParamNumel = std::uint64_t{1} << 20;  // located whole
constexpr std::uint64_t kPieceNumel = 4096;                       // located of a larger one

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "checkpoint_reader_fuzzer finding: %s\n", what.c_str());
  std::fflush(stderr);
  __builtin_trap();
}

// The per-process scratch folder, made once, removed at exit.
fs::path g_dir;
const fs::path& temp_dir() {
  if (g_dir.empty()) {
    std::error_code ec;
    fs::path base = fs::temp_directory_path(ec);
    if (ec) base = "/tmp";
    g_dir = base / ("zero_ckpt_fuzz_" + std::to_string(::getpid()));
    fs::create_directories(g_dir, ec);
    if (ec) finding("cannot create " + g_dir.string() + ": " + ec.message());
    std::atexit([] {
      std::error_code e;
      zero::ckpt::remove_tree(g_dir, e);  // (not fs::remove_all: tests/source_rules_test.sh)
    });
  }
  return g_dir;
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::uint64_t hash_input(const std::uint8_t* data, std::size_t size) {
  std::uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (std::size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 0x100000001B3ull;
  return mix(h);
}

// `n` bytes made of the input: the input repeated, from byte `start` on.
std::vector<char> content_from(const std::uint8_t* data, std::size_t size, std::uint64_t start, std::uint64_t n) {
  std::vector<char> c(static_cast<std::size_t>(n));
  const std::size_t s = static_cast<std::size_t>(start % size);
  std::size_t done = std::min(c.size(), size - s);
  if (done > 0) std::memcpy(c.data(), data + s, done);
  const std::size_t wrap = std::min(c.size() - done, s);
  if (wrap > 0) std::memcpy(c.data() + done, data, wrap);
  done += wrap;              // one whole input (rotated), or all of c
  while (done < c.size()) {  // then doubling copies of what is there
    const std::size_t k = std::min(c.size() - done, done);
    std::memcpy(c.data() + done, c.data(), k);
    done += k;
  }
  return c;
}

void write_file(const fs::path& path, const std::vector<char>& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  out.close();
  if (!out) finding("cannot write " + path.string());
}

void check_round_trip(const ck::Manifest& m) {
  const std::string text = ck::manifest_to_json(m);
  std::string again;
  try {
    again = ck::manifest_to_json(ck::parse_manifest(text, "round-trip"));
  } catch (const zero::Error& e) {
    finding(std::string("manifest_to_json output does not parse: ") + e.what() + "\n" + text);
  }
  if (again != text) finding("manifest round trip changed it:\n" + text + "\n--- became ---\n" + again);
}

// ---- read_file ----

struct ReadCase {
  std::vector<ck::ReadRange> ranges;
  std::vector<std::vector<char>> dst;
};

void read_one_file(const std::uint8_t* data, std::size_t size, std::uint64_t h, std::size_t index,
                   const ck::FileRecord& rec, std::uint64_t& budget) {
  if (!ck::is_plain_file_name(rec.name)) finding("file name '" + rec.name + "' is not a plain file name");
  const fs::path path = temp_dir() / ("shard-" + std::to_string(index));
  const bool full = rec.bytes <= kMaxFileBytes && rec.bytes + 64 <= budget;
  std::uint64_t file_bytes;
  if (!full) {
    file_bytes = rec.bytes == 0 ? 1 : (h >> 8) % std::min<std::uint64_t>(rec.bytes, 4096);  // always short
  } else {
    switch (h % 8) {
      case 0: file_bytes = rec.bytes + 1 + (h >> 8) % 16; break;
      case 1: file_bytes = rec.bytes == 0 ? 1 : (h >> 8) % rec.bytes; break;
      default: file_bytes = rec.bytes;
    }
  }
  budget -= std::min(budget, file_bytes);
  const std::vector<char> content = content_from(data, size, h >> 48, file_bytes);
  write_file(path, content);

  // The sections, in the manifest's order; sometimes one more range that may
  // overlap them, sometimes one that lies past the end.
  ReadCase rc;
  for (const ck::SectionRecord& s : rec.sections) rc.ranges.push_back({s.offset, s.bytes, nullptr});
  if (full && ((h >> 4) & 1)) {
    const std::uint64_t off = (h >> 16) % (rec.bytes + 1);
    rc.ranges.push_back({off, (h >> 40) % (rec.bytes - off + 1), nullptr});
  }
  bool past_end = false;
  if ((h >> 5) % 8 == 0) {
    const std::uint64_t a = (h >> 24) % (std::min<std::uint64_t>(rec.bytes, 64) + 1);
    rc.ranges.push_back({rec.bytes - a, a + 1 + (h >> 32) % 4, nullptr});
    past_end = true;
  }
  if (full) {
    for (ck::ReadRange& r : rc.ranges) {
      rc.dst.emplace_back(past_end ? 0 : static_cast<std::size_t>(r.bytes), '\0');
      r.dst = rc.dst.back().data();  // only copied to when every range is inside the file
    }
  }
  const bool readable = file_bytes == rec.bytes && !past_end;
  const std::string what = "read_file of files[" + std::to_string(index) + "] (" + std::to_string(file_bytes) +
                           " bytes on disk, manifest " + std::to_string(rec.bytes) + ")";

  // 1. No checksum, to dst.
  try {
    ck::read_file(path, rec, rc.ranges, /*verify=*/false);
    if (!readable) finding(what + " did not throw");
  } catch (const zero::InternalError& e) {
    finding(what + " threw an internal error: " + e.what());
  } catch (const zero::Error& e) {
    if (readable) finding(what + " threw: " + e.what());
  }
  if (readable) {
    for (std::size_t k = 0; k < rc.ranges.size(); ++k) {
      const ck::ReadRange& r = rc.ranges[k];
      if (r.bytes > 0 && std::memcmp(rc.dst[k].data(), content.data() + r.offset, r.bytes) != 0) {
        finding(what + ": range " + std::to_string(k) + " got the wrong bytes");
      }
    }
  }
  if (!full) return;

  // 2. With the checksum (the manifest's, or the file's own), to a sink.
  const std::uint32_t actual = ck::crc32c(0, content.data(), content.size());
  ck::FileRecord rec2 = rec;
  if ((h >> 9) & 1) rec2.crc32c = actual;
  const bool verifies = readable && rec2.crc32c == actual;
  std::vector<std::uint64_t> got(rc.ranges.size(), 0);
  const ck::RangeSink sink = [&](std::size_t k, std::uint64_t off, const void* p, std::size_t n) {
    if (!readable) finding(what + ": the sink got bytes of a file that cannot be read");
    if (k >= rc.ranges.size()) finding(what + ": the sink got range " + std::to_string(k));
    const ck::ReadRange& r = rc.ranges[k];
    if (off != got[k] || n == 0 || n > r.bytes - off) {
      finding(what + ": the sink got " + std::to_string(n) + " bytes at " + std::to_string(off) + " of range " +
              std::to_string(k) + " (" + std::to_string(r.bytes) + " bytes, " + std::to_string(got[k]) +
              " had)");
    }
    if (std::memcmp(p, content.data() + r.offset + off, n) != 0) finding(what + ": the sink got the wrong bytes");
    got[k] += n;
  };
  try {
    ck::read_file(path, rec2, rc.ranges, /*verify=*/true, sink);
    if (!verifies) finding(what + " with a checksum that does not match did not throw");
  } catch (const zero::InternalError& e) {
    finding(what + " threw an internal error: " + e.what());
  } catch (const zero::Error& e) {
    if (verifies) finding(what + " with a matching checksum threw: " + e.what());
  }
  if (verifies) {
    for (std::size_t k = 0; k < rc.ranges.size(); ++k) {
      if (got[k] != rc.ranges[k].bytes) finding(what + ": the sink got range " + std::to_string(k) + " in part");
    }
  }
}

// ---- locate / plan_partition ----

// The bucket whose values hold flat index `flat`, as parse_manifest places a
// parameter (the last bucket starting at or before it).
std::size_t bucket_at(const std::vector<ck::BucketRecord>& buckets, std::uint64_t flat) {
  auto it = std::upper_bound(buckets.begin(), buckets.end(), flat,
                             [](std::uint64_t f, const ck::BucketRecord& b) { return f < b.offset; });
  if (it == buckets.begin()) finding("flat index " + std::to_string(flat) + " is in no bucket");
  return static_cast<std::size_t>(it - buckets.begin()) - 1;
}

// The bucket whose chunk holds partition position `pos` (-1: none).
long chunk_at(const std::vector<ck::BucketRecord>& buckets, std::uint64_t pos) {
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i].chunk > 0 && pos >= buckets[i].partition_offset && pos - buckets[i].partition_offset < buckets[i].chunk) {
      return static_cast<long>(i);
    }
  }
  return -1;
}

std::string run_text(const ck::ElementRun& r) {
  return "{shard " + std::to_string(r.shard) + ", src " + std::to_string(r.src) + ", dst " + std::to_string(r.dst) +
         ", n " + std::to_string(r.n) + "}";
}

// The invariant parse_manifest's validation must guarantee for any run.
void check_inside(const ck::Manifest& m, const ck::ElementRun& r, const std::string& what) {
  if (r.n == 0) finding(what + ": an empty run");
  if (r.shard < 0 || r.shard >= m.shard_world) {
    finding(what + ": run " + run_text(r) + " names a shard outside shard_world " + std::to_string(m.shard_world));
  }
  if (r.n > m.partition_numel || r.src > m.partition_numel - r.n) {
    finding(what + ": run " + run_text(r) + " lies past partition_numel " + std::to_string(m.partition_numel));
  }
}

// Runs of locate(m, param, first, n, dst): inside the partitions, dst
// contiguous from `dst`, each element where the layout puts it.
void check_locate(const ck::Manifest& m, std::size_t param, std::uint64_t first, std::uint64_t n, std::uint64_t dst,
                  const std::vector<ck::ElementRun>& runs) {
  const ck::ParamRecord& p = m.params[param];
  const std::string what = "locate(params[" + p.name + "], " + std::to_string(first) + ", " + std::to_string(n) + ")";
  std::uint64_t done = 0;
  for (const ck::ElementRun& r : runs) {
    check_inside(m, r, what);
    if (r.dst != dst + done) finding(what + ": run " + run_text(r) + " is not where the one before it ended");
    if (r.n > n - done) finding(what + ": the runs hold more than " + std::to_string(n) + " elements");
    const std::uint64_t flat = p.offset + first + done;
    const ck::BucketRecord& b = m.buckets[bucket_at(m.buckets, flat)];
    const std::uint64_t into = flat - b.offset;
    // A parameter lies in one bucket, so its runs lie in one chunk each.
    if (r.src < b.partition_offset || r.src - b.partition_offset + r.n > b.chunk ||
        static_cast<std::uint64_t>(r.shard) * b.chunk + (r.src - b.partition_offset) != into) {
      finding(what + ": run " + run_text(r) + " does not hold flat element " + std::to_string(flat));
    }
    done += r.n;
  }
  if (done != n) finding(what + ": the runs hold " + std::to_string(done) + " elements");
}

void check_locate_all(const ck::Manifest& m, std::uint64_t h) {
  std::vector<ck::ElementRun> runs;
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const ck::ParamRecord& p = m.params[i];
    const std::uint64_t hi = mix(h + i);
    const std::uint64_t dst = hi % 1000;
    if (p.numel <= kMaxParamNumel) {
      runs.clear();
      ck::locate(m, i, 0, p.numel, dst, runs);
      check_locate(m, i, 0, p.numel, dst, runs);
    }
    if (p.numel > 0) {  // a piece
      const std::uint64_t first = (hi >> 10) % p.numel;
      const std::uint64_t n = (hi >> 40) % (std::min(p.numel - first, kPieceNumel) + 1);
      runs.clear();
      ck::locate(m, i, first, n, dst, runs);
      check_locate(m, i, first, n, dst, runs);
    }
  }
}

// A target layout: `buckets` (like a saved one), params by saved index.
struct Target {
  int world = 1;
  std::vector<ck::BucketRecord> buckets;
  std::vector<ck::TargetParam> params;
  std::uint64_t partition_numel = 0;
};

// plan_partition for every rank of `t`: each run inside both sides, element
// for element (saved and target position the same place of the same
// bucket, never target padding), no target position twice, every parameter
// element once. `identity`: t is the saved layout itself.
void check_plan(const ck::Manifest& m, const Target& t, bool identity) {
  std::uint64_t expected = 0, total = 0;
  for (const ck::TargetParam& p : t.params) expected += p.numel;
  for (int rank = 0; rank < t.world; ++rank) {
    const std::string what = "plan_partition(" + std::string(identity ? "same layout" : "resharded to ") +
                             (identity ? "" : std::to_string(t.world)) + ", rank " + std::to_string(rank) + ")";
    std::vector<ck::ElementRun> runs = ck::plan_partition(m, t.buckets, t.params, rank);
    for (const ck::ElementRun& r : runs) {
      check_inside(m, r, what);
      if (r.n > t.partition_numel || r.dst > t.partition_numel - r.n) {
        finding(what + ": run " + run_text(r) + " lies past the target's " + std::to_string(t.partition_numel));
      }
      if (identity && (r.shard != rank || r.src != r.dst)) finding(what + ": run " + run_text(r) + " moves elements");
      // Piece by piece, split where a chunk ends on either side.
      std::uint64_t src = r.src, dst = r.dst, left = r.n;
      while (left > 0) {
        const long sb = chunk_at(m.buckets, src), tb = chunk_at(t.buckets, dst);
        if (sb < 0 || tb < 0) finding(what + ": run " + run_text(r) + " reaches past every chunk");
        if (sb != tb) finding(what + ": run " + run_text(r) + " moves elements to another bucket");
        const ck::BucketRecord& s = m.buckets[static_cast<std::size_t>(sb)];
        const ck::BucketRecord& d = t.buckets[static_cast<std::size_t>(tb)];
        const std::uint64_t s_into = static_cast<std::uint64_t>(r.shard) * s.chunk + (src - s.partition_offset);
        const std::uint64_t d_into = static_cast<std::uint64_t>(rank) * d.chunk + (dst - d.partition_offset);
        if (s_into != d_into) finding(what + ": run " + run_text(r) + " moves elements within their bucket");
        const std::uint64_t piece =
            std::min({left, s.partition_offset + s.chunk - src, d.partition_offset + d.chunk - dst});
        if (d_into + piece > d.numel) finding(what + ": run " + run_text(r) + " fills padding");
        src += piece;
        dst += piece;
        left -= piece;
      }
      total += r.n;
    }
    std::sort(runs.begin(), runs.end(), [](const ck::ElementRun& a, const ck::ElementRun& b) { return a.dst < b.dst; });
    for (std::size_t k = 1; k < runs.size(); ++k) {
      if (runs[k].dst < runs[k - 1].dst + runs[k - 1].n) finding(what + ": runs overlap at " + std::to_string(runs[k].dst));
    }
  }
  if (total != expected) {
    finding("plan_partition: the runs of all ranks hold " + std::to_string(total) + " elements, the parameters " +
            std::to_string(expected));
  }
}

void check_plans(const ck::Manifest& m, std::uint64_t h) {
  if (m.shard_world > 64 || m.params.size() * static_cast<std::size_t>(m.shard_world) > (1u << 16)) return;
  Target same;
  same.world = m.shard_world;
  same.buckets = m.buckets;
  same.partition_numel = m.partition_numel;
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const ck::ParamRecord& p = m.params[i];
    same.params.push_back({i, p.offset, p.numel, static_cast<int>(bucket_at(m.buckets, p.offset))});
  }
  check_plan(m, same, true);

  // The same buckets repadded for another world size.
  Target t;
  t.world = 1 + static_cast<int>((h >> 12) % 4);
  const auto w = static_cast<std::uint64_t>(t.world);
  std::uint64_t flat = 0;
  for (const ck::BucketRecord& b : m.buckets) {
    ck::BucketRecord nb;
    nb.offset = flat;
    nb.numel = b.numel;
    nb.padded = (b.numel + w - 1) / w * w;
    nb.chunk = nb.padded / w;
    nb.partition_offset = t.partition_numel;
    flat += nb.padded;
    t.partition_numel += nb.chunk;
    t.buckets.push_back(nb);
  }
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const ck::ParamRecord& p = m.params[i];
    const std::size_t k = bucket_at(m.buckets, p.offset);
    t.params.push_back({i, p.offset - m.buckets[k].offset + t.buckets[k].offset, p.numel, static_cast<int>(k)});
  }
  check_plan(m, t, false);
}

}  // namespace

void check_safetensors(const std::uint8_t* data, std::size_t size, std::uint64_t h) {
  const fs::path path = temp_dir() / "weights.safetensors";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    std::uint64_t n = size;
    if (h % 7 == 0) n += h % 64;  // a length past the header
    if (h % 11 == 0) n = h;       // one past any file
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(std::min<std::size_t>(size, h % 512)));
  }
  const std::uint64_t file_bytes = fs::file_size(path);
  try {
    const ck::SafetensorsReader r(path);
    std::uint64_t total = 0;
    for (const ck::SafetensorsEntry& e : r.entries()) {
      if (r.find(e.name) != &e) finding("safetensors: find('" + e.name + "') is not its entry");
      if (e.bytes > file_bytes) finding("safetensors: an entry longer than the file was accepted");
      total += e.bytes;
      std::vector<unsigned char> buf(e.bytes);
      r.read(e, buf.data());  // throws on a short read: a finding below
    }
    if (total > file_bytes) finding("safetensors: entries longer than the file were accepted");
  } catch (const zero::InternalError& e) {
    finding(std::string("SafetensorsReader threw an internal error: ") + e.what());
  } catch (const zero::Error& e) {
    const std::string what = e.what();
    if (what.find("cannot read '") != std::string::npos) finding("safetensors: an accepted entry did not read: " + what);
  }
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_safetensors(data, size, hash_input(data, size));
  ck::Manifest m;
  try {
    m = ck::parse_manifest(text, "fuzz/manifest.json");
  } catch (const zero::InternalError& e) {
    finding(std::string("parse_manifest threw an internal error: ") + e.what());
  } catch (const zero::Error&) {
    return 0;  // expected for most inputs
  }
  const std::uint64_t h = hash_input(data, size);
  check_round_trip(m);
  try {
    check_locate_all(m, h);
    check_plans(m, h);
  } catch (const zero::Error& e) {
    finding(std::string("locate/plan_partition threw on a manifest parse_manifest accepted: ") + e.what());
  }
  std::uint64_t budget = kMaxInputBytes;
  for (std::size_t i = 0; i < m.files.size(); ++i) read_one_file(data, size, mix(h ^ i), i, m.files[i], budget);
  return 0;
}
