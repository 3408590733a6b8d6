// JSON text to a value, with errors that point into the text. nlohmann's parser
// reports where it stopped as a byte count; people want "file:line:column" and
// the line itself, so that is computed here.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace zero::config {

// 1-based. column counts UTF-8 characters (what editors show), not bytes.
struct TextPosition {
  std::size_t line = 1;
  std::size_t column = 1;
  bool operator==(const TextPosition&) const = default;
};

// The position of the byte at `offset` (0-based) in text. An offset at or past
// the end gives the position just after the last character.
TextPosition locate_offset(std::string_view text, std::size_t offset);

// Parses strict JSON (no comments, no trailing commas). Objects keep the order
// of the file, so that messages come in that order. On malformed text throws
// zero::Error:
//   "<source>:<line>:<column>: malformed JSON: <parser message>"
// followed by the offending line and a caret under the column. A key given
// twice in one object is refused the same way, at the second one, naming the
// first ("<source>:<line>:<column>: key 'a.b' is given twice ...").
nlohmann::ordered_json parse_json(std::string_view text, std::string_view source);

// Replaces bytes that are not valid UTF-8 with '?', so that a message quoting
// user input can itself be written into JSON.
std::string sanitize_utf8(std::string_view text);

}  // namespace zero::config
