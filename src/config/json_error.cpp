#include "zero/config/json_error.h"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <iterator>
#include <map>

#include "zero/core/error.h"

namespace zero::config {
namespace {

using Json = nlohmann::ordered_json;

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of the valid UTF-8 sequence starting at text[i], 0 when invalid.
std::size_t utf8_length(std::string_view text, std::size_t i) {
  auto c = static_cast<unsigned char>(text[i]);
  std::size_t len;
  std::uint32_t cp;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > text.size()) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    auto d = static_cast<unsigned char>(text[i + k]);
    if (!is_continuation(d)) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return len;
}

// nlohmann's message is "[json.exception.parse_error.101] parse error at line
// 1, column 5: syntax error while parsing ..."; keep what comes after the
// location, since the location is given in our own form.
std::string parser_message(std::string what) {
  if (!what.empty() && what[0] == '[') {
    std::size_t close = what.find("] ");
    if (close != std::string::npos) what.erase(0, close + 2);
  }
  if (what.rfind("parse error", 0) == 0) {
    std::size_t colon = what.find(": ");
    if (colon != std::string::npos) what.erase(0, colon + 2);
  }
  return what;
}

// A pointer into the text that records how far the parser has read, so that a
// SAX callback (which nlohmann gives no position) can say where it is.
class ReadingPointer {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  ReadingPointer() = default;
  ReadingPointer(const char* at, const char** furthest) : at_(at), furthest_(furthest) {}
  reference operator*() const { return *at_; }
  ReadingPointer& operator++() {
    ++at_;
    if (at_ > *furthest_) *furthest_ = at_;
    return *this;
  }
  ReadingPointer operator++(int) {
    ReadingPointer before = *this;
    ++*this;
    return before;
  }
  bool operator==(const ReadingPointer& other) const { return at_ == other.at_; }
  bool operator!=(const ReadingPointer& other) const { return at_ != other.at_; }

 private:
  const char* at_ = nullptr;
  const char** furthest_ = nullptr;
};

// Builds the document from SAX events. nlohmann's own DOM builder is in its
// detail namespace; this one also sees each key, to refuse duplicates (a
// second "zero_optimization" block silently replacing the first is a classic
// mistake, and DeepSpeed refuses such a file), and records where the parser
// stopped on every kind of error, including number overflow, which nlohmann
// raises as out_of_range without a byte position.
class DomBuilder {
 public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  // text: what is parsed; read: the parser's furthest position in it.
  DomBuilder(std::string_view text, const char* const* read) : text_(text), read_(read) {}

  bool null() { return add(Json(nullptr)) != nullptr; }
  bool boolean(bool v) { return add(Json(v)) != nullptr; }
  bool number_integer(number_integer_t v) { return add(Json(v)) != nullptr; }
  bool number_unsigned(number_unsigned_t v) { return add(Json(v)) != nullptr; }
  bool number_float(number_float_t v, const string_t&) { return add(Json(v)) != nullptr; }
  bool string(string_t& v) { return add(Json(std::move(v))) != nullptr; }
  bool binary(binary_t& v) { return add(Json::binary(std::move(v))) != nullptr; }

  bool start_object(std::size_t) {
    Json* slot = add(Json::object());
    stack_.push_back({slot, {}, 0, {}});
    return true;
  }
  bool key(string_t& k) {
    Level& top = stack_.back();
    const std::size_t at = key_offset();
    auto [first, inserted] = top.key_offsets.emplace(k, at);
    if (!inserted) {
      const std::string parent = path();
      TextPosition before = locate_offset(text_, first->second);
      failed_ = true;
      error_offset_ = at;
      error_message_ = "key '" + parent + (parent.empty() ? "" : ".") + k +
                       "' is given twice in the same object (first at line " + std::to_string(before.line) +
                       ", column " + std::to_string(before.column) +
                       "): keep one of them (DeepSpeed refuses such a file too)";
      return false;
    }
    top.key = std::move(k);
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    Json* slot = add(Json::array());
    stack_.push_back({slot, {}, 0, {}});
    return true;
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    failed_ = true;
    // The parser counts the characters it read, the offending one included:
    // the 0-based offset is one less.
    error_offset_ = position == 0 ? 0 : position - 1;
    error_message_ = "malformed JSON: " + parser_message(e.what());
    return false;
  }

  bool failed() const { return failed_; }
  std::size_t error_offset() const { return error_offset_; }
  const std::string& error_message() const { return error_message_; }
  Json take() { return std::move(root_); }

 private:
  struct Level {
    Json* value;
    std::string key;    // objects: the key whose value comes next
    std::size_t index;  // arrays: the index of the next element
    std::map<std::string, std::size_t> key_offsets;  // objects: where each key was
  };

  // The key callback comes when the parser has read the key's closing quote:
  // its opening quote is the last unescaped one before that.
  std::size_t key_offset() const {
    std::size_t close = static_cast<std::size_t>(*read_ - text_.data());
    if (close == 0) return 0;
    for (std::size_t i = close - 1; i-- > 0;) {
      if (text_[i] != '"') continue;
      std::size_t slashes = 0;
      while (slashes < i && text_[i - 1 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) return i;
    }
    return 0;
  }

  // Only the innermost container is ever appended to, so the pointers to the
  // outer ones on the stack stay valid.
  Json* add(Json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Level& top = stack_.back();
    if (top.value->is_array()) {
      top.value->push_back(std::move(v));
      ++top.index;
      return &top.value->back();
    }
    Json& slot = (*top.value)[top.key];
    slot = std::move(v);
    return &slot;
  }

  // "a.b[2].c" of the innermost container, for the duplicate-key error.
  std::string path() const {
    std::string out;
    for (std::size_t i = 0; i + 1 < stack_.size(); ++i) {
      const Level& level = stack_[i];
      if (level.value->is_array()) {
        out += "[" + std::to_string(level.index - 1) + "]";
      } else {
        if (!out.empty()) out += ".";
        out += level.key;
      }
    }
    return out;
  }

  std::string_view text_;
  const char* const* read_;
  Json root_;
  std::vector<Level> stack_;
  bool failed_ = false;
  std::size_t error_offset_ = 0;
  std::string error_message_;
};

// The line holding `offset`, cut to a window around it when long, with
// control characters blanked, and a caret line under the column.
std::string excerpt(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  std::size_t begin = 0;
  if (offset > 0) {
    std::size_t newline = text.rfind('\n', offset - 1);
    if (newline != std::string_view::npos) begin = newline + 1;
  }
  std::size_t end = text.find('\n', offset);
  if (end == std::string_view::npos) end = text.size();

  constexpr std::size_t kBefore = 60, kAfter = 20;
  std::size_t from = offset - begin > kBefore ? offset - kBefore : begin;
  std::size_t to = end - offset > kAfter ? offset + kAfter : end;
  while (from > begin && from < text.size() && is_continuation(text[from])) --from;
  while (to < end && is_continuation(text[to])) ++to;

  std::string line = from > begin ? "..." : "";
  std::size_t caret = line.size();
  for (std::size_t i = from; i < to;) {
    auto c = static_cast<unsigned char>(text[i]);
    std::size_t len = utf8_length(text, i);
    if (len == 0) {
      line += '?';
      len = 1;
    } else if (c < 0x20 || c == 0x7F) {
      line += ' ';
    } else {
      line.append(text.substr(i, len));
    }
    if (i < offset) ++caret;
    i += len;
  }
  if (to < end) line += "...";
  return "  " + line + "\n  " + std::string(caret, ' ') + "^";
}

// DeepSpeed reads its config with hjson, which takes comments and trailing
// commas: a file written for it may have them. Where the parser stopped on
// one, what to change.
std::string hjson_hint(std::string_view text, std::size_t offset) {
  if (offset >= text.size()) return {};
  const char at = text[offset];
  const std::string reads = " (DeepSpeed reads its config as hjson, which allows it; zerocpp reads strict JSON)";
  if (at == '#' || (at == '/' && offset + 1 < text.size() && (text[offset + 1] == '/' || text[offset + 1] == '*'))) {
    return "; this is a comment: remove it" + reads;
  }
  if (at == '}' || at == ']') {
    std::size_t i = offset;
    while (i > 0 && std::isspace(static_cast<unsigned char>(text[i - 1]))) --i;
    if (i > 0 && text[i - 1] == ',') return "; a trailing comma precedes it: remove the comma" + reads;
  }
  return {};
}

}  // namespace

TextPosition locate_offset(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  TextPosition pos;
  std::size_t line_begin = 0;
  for (std::size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++pos.line;
      line_begin = i + 1;
    }
  }
  // A UTF-8 byte-order mark is skipped by the parser and invisible in editors.
  if (line_begin == 0 && text.substr(0, 3) == "\xEF\xBB\xBF" && offset >= 3) line_begin = 3;
  for (std::size_t i = line_begin; i < offset; ++i) {
    if (!is_continuation(static_cast<unsigned char>(text[i]))) ++pos.column;
  }
  return pos;
}

nlohmann::ordered_json parse_json(std::string_view text, std::string_view source) {
  const char* read = text.data();
  DomBuilder builder(text, &read);
  bool ok = Json::sax_parse(ReadingPointer(text.data(), &read), ReadingPointer(text.data() + text.size(), &read),
                            &builder, nlohmann::json::input_format_t::json,
                            /*strict=*/true, /*ignore_comments=*/false);
  if (!ok || builder.failed()) {
    std::size_t offset = builder.failed() ? builder.error_offset() : 0;
    TextPosition at = locate_offset(text, offset);
    std::string message = builder.failed() ? builder.error_message() : std::string("malformed JSON: the parser stopped");
    throw Error(sanitize_utf8(std::string(source) + ":" + std::to_string(at.line) + ":" +
                              std::to_string(at.column) + ": " + message +
                              hjson_hint(text, offset) + "\n" + excerpt(text, offset)));
  }
  return builder.take();
}

std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    std::size_t len = utf8_length(text, i);
    if (len == 0) {
      out += '?';
      ++i;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
  }
  return out;
}

}  // namespace zero::config
