#include "zero/core/host_memory.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include <unistd.h>

#include "zero/core/error.h"

namespace zero {
namespace {

std::optional<std::int64_t> mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

std::optional<std::int64_t> env_limit() {
  const char* v = std::getenv("ZERO_HOST_MEMORY_LIMIT");
  if (v == nullptr || *v == '\0') return std::nullopt;
  const std::string s(v);
  std::size_t used = 0;
  long double n = 0;
  try {
    n = std::stold(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::int64_t scale = 1;
  if (used > 0 && used < s.size()) {
    switch (std::toupper(static_cast<unsigned char>(s[used]))) {
      case 'K': scale = 1LL << 10; break;
      case 'M': scale = 1LL << 20; break;
      case 'G': scale = 1LL << 30; break;
      case 'T': scale = 1LL << 40; break;
      default: used = 0;
    }
    if (used > 0) ++used;
  }
  ZERO_CHECK(used == s.size() && n > 0, "ZERO_HOST_MEMORY_LIMIT='", s,
             "' is not a byte count: give bytes, or a number with K, M, G or T (powers of 1024), e.g. 64G");
  const long double bytes = n * static_cast<long double>(scale);
  ZERO_CHECK(bytes >= 1.0L, "ZERO_HOST_MEMORY_LIMIT='", s, "' is less than one byte: give bytes, or a number with K, "
             "M, G or T (powers of 1024), e.g. 64G");
  // As large as anything (inf, 1e30): no limit of its own, the host's and
  // the cgroup's still hold (the least of them counts).
  constexpr long double kMost = static_cast<long double>(std::numeric_limits<std::int64_t>::max());
  if (!(bytes < kMost)) return std::numeric_limits<std::int64_t>::max();
  return static_cast<std::int64_t>(bytes);
}

// The first number in a file ("max" and the like: nullopt).
std::optional<std::int64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  long long v = 0;
  if (!(in >> v)) return std::nullopt;
  return static_cast<std::int64_t>(v);
}

// A key's value in a memory.stat file.
std::optional<std::int64_t> stat_value(const std::string& path, const std::string& want) {
  std::ifstream in(path);
  std::string key;
  long long v = 0;
  while (in >> key >> v) {
    if (key == want) return static_cast<std::int64_t>(v);
  }
  return std::nullopt;
}

// cgroup v1 writes "no limit" as a huge page-rounded number.
constexpr std::int64_t kNoLimit = std::int64_t{1} << 60;

// What a cgroup with this limit and usage leaves (its inactive page cache
// is reclaimed before the cgroup's OOM killer runs).
std::int64_t left_under(std::int64_t limit, std::int64_t usage, std::int64_t inactive_file) {
  return std::max<std::int64_t>(0, limit - usage + inactive_file);
}

struct Source {
  std::int64_t bytes;
  std::string name;
};

// The smallest of MemAvailable, the cgroup's limit and the variable.
std::optional<Source> smallest_source() {
  std::optional<Source> best;
  auto offer = [&](std::optional<std::int64_t> bytes, std::string name) {
    if (bytes && (!best || *bytes < best->bytes)) best = Source{*bytes, std::move(name)};
  };
  offer(mem_available(), "MemAvailable");
  // (ZERO_TEST_PROC_CGROUP and ZERO_TEST_CGROUP_MOUNT point the tests at a
  // tree of their own.)
  const char* proc = std::getenv("ZERO_TEST_PROC_CGROUP");
  const char* mount = std::getenv("ZERO_TEST_CGROUP_MOUNT");
  if (const auto cg = detail::cgroup_memory_available(proc ? proc : "/proc/self/cgroup",
                                                      mount ? mount : "/sys/fs/cgroup")) {
    offer(cg->available, "the memory limit of this process's cgroup, " + cg->limit_file);
  }
  offer(env_limit(), "ZERO_HOST_MEMORY_LIMIT");
  return best;
}

}  // namespace

namespace detail {

std::optional<CgroupMemory> cgroup_memory_available(const std::string& proc_self_cgroup, const std::string& mount) {
  std::ifstream in(proc_self_cgroup);
  std::optional<CgroupMemory> best;
  auto offer = [&](std::int64_t available, const std::string& file) {
    if (!best || available < best->available) best = CgroupMemory{available, file};
  };
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t a = line.find(':');
    const std::size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (path.empty() || path.back() != '/') path += '/';
    std::vector<std::string> names;
    std::stringstream list(controllers);
    for (std::string name; std::getline(list, name, ',');) names.push_back(name);
    if (std::find(names.begin(), names.end(), "memory") != names.end()) {
      // v1: every level from the process's cgroup up to the mount's root (a
      // level's usage counts its descendants: an ancestor's limit is shared
      // with its other children; missing levels are skipped: in a container
      // whose cgroup namespace is the host's, Docker's on v1, the path names
      // the host's hierarchy while the mount's root is the container's own
      // cgroup, which the walk reaches last).
      const std::string root = mount + "/memory";
      for (std::string p = path; !p.empty(); p = p.substr(0, p.find_last_of('/', p.size() - 2) + 1)) {
        const std::string dir = root + p;
        const auto limit = read_number(dir + "memory.limit_in_bytes");
        const auto usage = read_number(dir + "memory.usage_in_bytes");
        if (limit && usage && *limit < kNoLimit) {
          offer(left_under(*limit, *usage, stat_value(dir + "memory.stat", "total_inactive_file").value_or(0)),
                dir + "memory.limit_in_bytes");
        }
        if (p == "/") break;
      }
    } else if (id == "0" && controllers.empty()) {
      // v2: every level from the process's cgroup up to the mount's root
      // (missing levels skipped: a container's namespace shows its own root).
      for (std::string p = path; !p.empty(); p = p.substr(0, p.find_last_of('/', p.size() - 2) + 1)) {
        const std::string dir = mount + p;
        const auto limit = read_number(dir + "memory.max");  // ("max": none)
        const auto usage = read_number(dir + "memory.current");
        if (limit && usage && *limit < kNoLimit) {
          offer(left_under(*limit, *usage, stat_value(dir + "memory.stat", "inactive_file").value_or(0)),
                dir + "memory.max");
        }
        if (p == "/") break;
      }
    }
  }
  return best;
}

}  // namespace detail

std::optional<std::int64_t> host_memory_available() {
  const auto s = smallest_source();
  return s ? std::optional<std::int64_t>(s->bytes) : std::nullopt;
}

std::string host_memory_source() {
  const auto s = smallest_source();
  return s ? s->name : "MemAvailable";
}

std::optional<std::int64_t> resident_set_bytes() {
  std::ifstream in("/proc/self/statm");
  std::int64_t size_pages = 0, resident_pages = 0;
  if (!(in >> size_pages >> resident_pages)) return std::nullopt;
  const long page = sysconf(_SC_PAGESIZE);
  if (page <= 0) return std::nullopt;
  return resident_pages * static_cast<std::int64_t>(page);
}

}  // namespace zero
