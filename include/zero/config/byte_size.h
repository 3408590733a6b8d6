// Byte counts written for people: "2GB", "512MiB", "1.5 GiB", "1048576".
// Used by device_memory_limit and usable by command-line flags.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace zero::config {

// A decimal number (digits, optionally ".digits") followed by an optional unit,
// with optional spaces between and around. Units (case-insensitive):
//   B; KB MB GB TB PB (powers of 1000); KiB MiB GiB TiB PiB (powers of 1024).
// A bare "G" or "M" is refused on purpose: it is ambiguous between the two.
// Fractions of a byte are dropped ("1.5 KiB" = 1536, "0.5B" = 0).
// nullopt when the text is not of this form or does not fit in int64.
std::optional<std::int64_t> parse_byte_size(std::string_view text);

// "1.50 GiB", "512 MiB", "100 B": binary units, up to two decimals.
std::string format_byte_size(std::int64_t bytes);

}  // namespace zero::config
