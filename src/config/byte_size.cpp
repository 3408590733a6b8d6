#include "zero/config/byte_size.h"

#include <array>
#include <cctype>
#include <cstdio>
#include <limits>

namespace zero::config {
namespace {

struct Unit {
  std::string_view name;  // lower case
  std::int64_t bytes;
};

constexpr std::int64_t kKi = 1024;
constexpr std::array<Unit, 11> kUnits = {{
    {"b", 1},
    {"kb", 1000},
    {"mb", 1000 * 1000},
    {"gb", 1000LL * 1000 * 1000},
    {"tb", 1000LL * 1000 * 1000 * 1000},
    {"pb", 1000LL * 1000 * 1000 * 1000 * 1000},
    {"kib", kKi},
    {"mib", kKi * kKi},
    {"gib", kKi * kKi * kKi},
    {"tib", kKi * kKi * kKi * kKi},
    {"pib", kKi * kKi * kKi * kKi * kKi},
}};

bool is_space(char c) { return c == ' ' || c == '\t'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::optional<std::int64_t> unit_bytes(std::string_view unit) {
  if (unit.empty()) return 1;
  if (unit.size() > 3) return std::nullopt;
  char lower[3];
  for (std::size_t i = 0; i < unit.size(); ++i) {
    lower[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(unit[i])));
  }
  std::string_view name(lower, unit.size());
  for (const Unit& u : kUnits) {
    if (u.name == name) return u.bytes;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::int64_t> parse_byte_size(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && is_space(text[i])) ++i;
  // Integer part, kept exact: a double would round sizes above 2^53.
  std::int64_t whole = 0;
  std::size_t digits = 0;
  for (; i < text.size() && is_digit(text[i]); ++i, ++digits) {
    int d = text[i] - '0';
    if (whole > (std::numeric_limits<std::int64_t>::max() - d) / 10) return std::nullopt;
    whole = whole * 10 + d;
  }
  // Fraction as numerator / 10^k, k <= 18 so that it fits in int64; further
  // digits are below a byte for any unit here and are dropped.
  std::int64_t frac = 0, frac_scale = 1;
  std::size_t frac_digits = 0;
  if (i < text.size() && text[i] == '.') {
    ++i;
    for (; i < text.size() && is_digit(text[i]); ++i, ++frac_digits) {
      if (frac_scale <= std::numeric_limits<std::int64_t>::max() / 100) {
        frac = frac * 10 + (text[i] - '0');
        frac_scale *= 10;
      }
    }
    if (frac_digits == 0) return std::nullopt;  // "2." is a typo, not 2
  }
  if (digits == 0) return std::nullopt;
  while (i < text.size() && is_space(text[i])) ++i;
  std::size_t unit_begin = i;
  while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
  std::optional<std::int64_t> unit = unit_bytes(text.substr(unit_begin, i - unit_begin));
  while (i < text.size() && is_space(text[i])) ++i;
  if (!unit || i != text.size()) return std::nullopt;

  if (whole > std::numeric_limits<std::int64_t>::max() / *unit) return std::nullopt;
  std::int64_t bytes = whole * *unit;
  // frac < frac_scale <= 10^18 and unit <= 2^50: the product fits in 128 bits.
  auto frac_bytes = static_cast<std::int64_t>(static_cast<__int128>(frac) * *unit / frac_scale);
  if (bytes > std::numeric_limits<std::int64_t>::max() - frac_bytes) return std::nullopt;
  return bytes + frac_bytes;
}

std::string format_byte_size(std::int64_t bytes) {
  static constexpr std::array<std::string_view, 6> kNames = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (unit + 1 < kNames.size() && (value >= 1024.0 || value <= -1024.0)) {
    value /= 1024.0;
    ++unit;
  }
  char buf[64];
  if (unit == 0 || value == static_cast<double>(static_cast<std::int64_t>(value))) {
    std::snprintf(buf, sizeof buf, "%.0f %s", value, kNames[unit].data());
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", value, kNames[unit].data());
  }
  return buf;
}

}  // namespace zero::config
