#include "value_text.h"

#include "zero/config/json_error.h"

namespace zero::config::detail {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::size_t kMaxChars = 60;
constexpr std::size_t kMaxElements = 4;
constexpr int kMaxDepth = 2;

// Cuts s to at most n bytes without splitting a UTF-8 character.
std::string cut(std::string s, std::size_t n) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  s.resize(n);
  return s + "...";
}

std::string quoted(const std::string& s) {
  // dump() of a lone string escapes quotes and control characters; replace
  // keeps it from throwing on bytes that are not UTF-8.
  std::string q = Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
  if (q.size() <= kMaxChars + 2) return q;
  return cut(q.substr(0, q.size() - 1), kMaxChars) + "\"";
}

void describe(const Json& v, int depth, std::string& out) {
  if (v.is_string()) {
    out += quoted(v.get_ref<const std::string&>());
  } else if (v.is_array() || v.is_object()) {
    const bool array = v.is_array();
    out += array ? '[' : '{';
    if (depth >= kMaxDepth && !v.empty()) {
      out += "...";
    } else {
      std::size_t n = 0;
      for (auto it = v.begin(); it != v.end(); ++it, ++n) {
        if (n > 0) out += ", ";
        if (n == kMaxElements) {
          out += "...";
          break;
        }
        if (!array) out += quoted(it.key()) + ": ";
        describe(it.value(), depth + 1, out);
      }
    }
    out += array ? ']' : '}';
  } else {
    out += v.dump();  // number, bool, null, binary: no nesting
  }
}

}  // namespace

std::string describe_value(const Json& value) {
  std::string out;
  describe(value, 0, out);
  return out;
}

std::string describe_key(std::string_view key) {
  std::string q = quoted(std::string(key));
  return sanitize_utf8(q.substr(1, q.size() - 2));
}

}  // namespace zero::config::detail
