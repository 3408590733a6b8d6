// CLI11 validators for the tools' numeric options, so that a value out of
// range is a usage error (exit 2) said as "--steps: must be >= 1, got 0"
// rather than CLI11's "not in range 0.000000 to 1.79e308".
#pragma once

#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <system_error>
#include <type_traits>

#include <CLI/CLI.hpp>

namespace zero::tools {

template <typename T>
CLI::Validator in_range(T lo, T hi, const std::string& note = "") {
  std::ostringstream range;
  if (hi == std::numeric_limits<T>::max()) {
    range << ">= " << lo;
  } else {
    range << "in [" << lo << ", " << hi << "]";
  }
  return CLI::Validator(
      [lo, hi, r = range.str(), note](std::string& in) -> std::string {
        T v{};
        if constexpr (std::is_integral_v<T>) {
          // (CLI11's strtoll would read 10^20 as the largest integer, silently,
          // and 010 as octal 8.)
          const char* begin = in.data() + (!in.empty() && in[0] == '+');
          const char* digits = begin + (begin < in.data() + in.size() && *begin == '-');
          const auto [end, ec] = std::from_chars(begin, in.data() + in.size(), v);
          if (ec == std::errc::result_out_of_range) return "must be " + r + note + ", got " + in + " (out of range)";
          if (ec != std::errc() || end != in.data() + in.size() || begin == end) return "'" + in + "' is not a whole number";
          if (*digits == '0' && end - digits > 1) return "'" + in + "' has a leading zero: write it without (" + std::to_string(v) + ")";
        } else if (!CLI::detail::lexical_cast(in, v) || std::isnan(static_cast<double>(v))) {
          return "'" + in + "' is not a number";
        }
        return v >= lo && v <= hi ? std::string() : "must be " + r + note + ", got " + in;
      },
      range.str());
}

template <typename T>
CLI::Validator at_least(T lo, const std::string& note = "") {
  return in_range<T>(lo, std::numeric_limits<T>::max(), note);
}

// A text option given as "" (often an unset shell variable: --resume "$TAG")
// is a usage error, not "not given": "--resume: is empty: give a tag ...".
inline CLI::Validator non_empty(const std::string& what) {
  return CLI::Validator(
      [what](std::string& in) -> std::string {
        return in.empty() ? "is empty: give " + what + ", or leave the option out" : std::string();
      },
      "");
}

// The same for a required option or argument, which cannot be left out.
inline CLI::Validator non_empty_required(const std::string& what) {
  return CLI::Validator([what](std::string& in) -> std::string { return in.empty() ? "is empty: give " + what : ""; },
                        "");
}

}  // namespace zero::tools
