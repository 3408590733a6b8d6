// Every key zerocpp recognises, per section: the ones it reads, and the
// DeepSpeed keys it accepts without using them. This table is what the
// "unknown key" warnings and their suggestions are computed from; the parser
// asserts that it reads only keys listed here as kRead.
#pragma once

#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace zero::config::detail {

enum class KeyKind {
  kRead,         // parsed into Config
  kIgnored,      // a DeepSpeed key that does not change training here: a note,
                 // unless the value is `neutral` (what zerocpp does anyway)
  kUnsupported,  // a DeepSpeed feature zerocpp lacks: a warning, unless the
                 // value is `neutral` (the feature turned off)
};

struct KnownKey {
  std::string_view section;  // "" for the top level, else a dotted path
  std::string_view name;
  KeyKind kind;
  std::string_view why = {};      // for kIgnored / kUnsupported: the reason, a clause
  // JSON: kUnsupported's "off" value, kIgnored's "as zerocpp does"; "*":
  // every value (a key that tunes only DeepSpeed's performance).
  std::string_view neutral = {};
};

std::span<const KnownKey> known_keys();

// The entry for section.name, or nullptr.
const KnownKey* find_known_key(std::string_view section, std::string_view name);

// All names known in a section, in table order.
std::vector<std::string_view> names_in_section(std::string_view section);

// For an unknown key that is an older or other framework's name of a key
// zerocpp reads: the sentence that points to it ("did you mean ...?").
std::optional<std::string_view> renamed_key_hint(std::string_view section, std::string_view name);

// Sections other than `section` that know a key called `name`, those that
// read it first (for "it belongs inside ..." hints).
std::vector<std::string_view> sections_knowing(std::string_view name, std::string_view section);

}  // namespace zero::config::detail
