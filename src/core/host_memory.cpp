#include "zero/core/host_memory.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

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
  return static_cast<std::int64_t>(n * static_cast<long double>(scale));
}

}  // namespace

std::optional<std::int64_t> host_memory_available() {
  const auto a = mem_available();
  const auto e = env_limit();
  if (a && e) return std::min(*a, *e);
  return e ? e : a;
}

std::string host_memory_source() {
  const auto a = mem_available();
  const auto e = env_limit();
  return e && (!a || *e <= *a) ? "ZERO_HOST_MEMORY_LIMIT" : "MemAvailable";
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
