#include "section_reader.h"

#include <cctype>
#include <charconv>
#include <cmath>

#include "known_keys.h"
#include "value_text.h"
#include "zero/config/byte_size.h"
#include "zero/config/json_error.h"
#include "zero/config/key_suggestion.h"
#include "zero/core/error.h"

namespace zero::config::detail {
namespace {

std::string format_number(double v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, end);
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

std::string quote(std::string_view s) { return "'" + std::string(s) + "'"; }

// Hugging Face's placeholder for a value it fills in.
bool is_auto_value(const Json& v) { return v.is_string() && v.get_ref<const std::string&>() == "auto"; }

// Is `value` the "feature off" value of an unsupported key? An object
// neutral ({"enabled": false}) matches when those keys match, whatever else
// the section holds.
bool is_neutral(const Json& value, std::string_view neutral) {
  if (value.is_null()) return true;
  if (neutral.empty()) return false;
  if (neutral == "*") return true;  // performance only: nothing worth a note, whatever the value
  Json n = Json::parse(neutral);
  if (n.is_object()) {
    if (!value.is_object()) return false;
    for (auto it = n.begin(); it != n.end(); ++it) {
      auto found = value.find(it.key());
      // Primitive against primitive: no deep comparison of user data; a
      // boolean also as the string "true"/"false" (as read_bool reads it).
      if (found == value.end() || !found->is_primitive()) return false;
      if (it.value().is_boolean() && found->is_string()) {
        const std::string& s = found->get_ref<const std::string&>();
        if (!equals_ignoring_case(s, it.value().get<bool>() ? "true" : "false")) return false;
      } else if (*found != it.value()) {
        return false;
      }
    }
    return true;
  }
  return value.is_primitive() && value == n;
}

// int64 from a JSON number: integers as they are, and floats with an integral
// value (5e8 is how many DeepSpeed configs write bucket sizes).
std::optional<std::int64_t> as_int64(const Json& v) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<std::int64_t>();
  if (v.is_number_unsigned()) {
    auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    // 2^63 is exactly representable; anything >= it does not fit.
    if (std::isfinite(d) && d == std::trunc(d) && d >= -0x1p63 && d < 0x1p63) {
      return static_cast<std::int64_t>(d);
    }
  }
  return std::nullopt;
}

}  // namespace

void ParseContext::warn(std::string_view sentence) {
  if (warnings_) warnings_->push_back(sanitize_utf8(source_ + ": " + std::string(sentence)));
}

void ParseContext::fail(std::string_view path, std::string_view message) const {
  std::string text = source_ + ": ";
  if (!path.empty()) text += std::string(path) + ": ";
  throw Error(sanitize_utf8(text + std::string(message)));
}

void ParseContext::note_auto(std::string path) {
  if (!warnings_) return;
  autos_.emplace_back(warnings_->size(), std::move(path));
  warnings_->emplace_back();  // (its place; name_auto_values writes it)
}

void ParseContext::name_auto_values(const nlohmann::json& resolved) {
  for (const auto& [index, path] : autos_) {
    const nlohmann::json* at = &resolved;
    std::size_t from = 0;
    while (at && from <= path.size()) {
      const std::size_t dot = std::min(path.find('.', from), path.size());
      auto it = at->is_object() ? at->find(path.substr(from, dot - from)) : at->end();
      at = at->is_object() && it != at->end() ? &*it : nullptr;
      from = dot + 1;
    }
    std::string used;
    if (at) {
      used = at->dump();
      const bool zero = at->is_number() && at->get<double>() == 0.0;
      if (zero && path == "gradient_clipping") used += " (no clipping)";
      if (zero && path == "device_memory_limit") used += " (no limit)";
      if (zero && path == "fp16.loss_scale") used += " (a dynamic loss scale)";
    }
    (*warnings_)[index] = sanitize_utf8(
        source_ + ": " + quote(path) + " is \"auto\", which zerocpp reads as not given: " +
        (at ? "it uses " + used + " (the Hugging Face Trainer would fill in its own value; give one to be sure)."
            : "the default or a value derived from other keys is used."));
  }
  autos_.clear();
}

std::string IntRange::describe() const {
  constexpr auto kMax64 = std::numeric_limits<std::int64_t>::max();
  constexpr auto kMin64 = std::numeric_limits<std::int64_t>::min();
  constexpr auto kMax32 = std::numeric_limits<int>::max();
  if (hi == kMax64 || hi == kMax32) {
    std::string bound = hi == kMax32 ? " (at most " + std::to_string(kMax32) + ")" : "";
    if (lo == 1) return "a positive integer" + bound;
    if (lo == kMin64) return "an integer" + bound;
    return "an integer >= " + std::to_string(lo) + bound;
  }
  return "an integer " + std::to_string(lo) + ".." + std::to_string(hi);
}

std::string RealRange::describe() const {
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  if (has_lo && has_hi) {
    return "a number in " + std::string(lo_open ? "(" : "[") + format_number(lo) + ", " +
           format_number(hi) + (hi_open ? ")" : "]");
  }
  if (has_lo) return std::string("a number ") + (lo_open ? "> " : ">= ") + format_number(lo);
  if (has_hi) return std::string("a number ") + (hi_open ? "< " : "<= ") + format_number(hi);
  return "a number";
}

bool RealRange::contains(double v) const {
  if (lo_open ? !(v > lo) : !(v >= lo)) return false;
  if (hi_open ? !(v < hi) : !(v <= hi)) return false;
  return true;
}

SectionReader::SectionReader(ParseContext& ctx, std::string path, const Json* object,
                             std::optional<std::string_view> table_section)
    : ctx_(ctx),
      path_(std::move(path)),
      table_section_(table_section ? std::string(*table_section) : path_),
      object_(object) {
  ZERO_INTERNAL_ASSERT(object_ == nullptr || object_->is_object(), "section ", path_);
  report_keys();
}

void SectionReader::report_keys() {
  if (!object_) return;
  const std::vector<std::string_view> names = names_in_section(table_section_);
  for (auto it = object_->begin(); it != object_->end(); ++it) {
    const std::string& key = it.key();
    const KnownKey* known = find_known_key(table_section_, key);
    const std::string shown = quote(path_of(describe_key(key)));
    if (!known) {
      std::string sentence = "unknown key " + shown + " is ignored";
      // A right name in the wrong place is likelier than a typo that happens
      // to be near another name here.
      if (auto hint = renamed_key_hint(table_section_, key)) {
        sentence += "; " + std::string(*hint);
      } else if (auto homes = sections_knowing(key, table_section_); !homes.empty()) {
        std::string home(homes.front());
        sentence += home.empty() ? "; it belongs at the top level"
                                 : "; it belongs inside " + quote(home) + " (" +
                                       quote(home + "." + key) + ")";
      } else if (auto guess = closest_key(key, names)) {
        sentence += "; did you mean " + quote(*guess) + "?";
      }
      ctx_.warn(sentence);
    } else if (known->kind == KeyKind::kIgnored) {
      // The value zerocpp behaves as anyway (prescale_gradients: false): nothing to say.
      if (!known->neutral.empty() && is_neutral(it.value(), known->neutral)) continue;
      ctx_.warn(shown + " is a DeepSpeed key that zerocpp ignores: " + std::string(known->why) + ".");
    } else if (known->kind == KeyKind::kUnsupported) {
      if (is_neutral(it.value(), known->neutral)) {
        ctx_.warn(shown + " turns off " + std::string(known->why) +
                  ", which zerocpp does not have; it is ignored.");
      } else {
        ctx_.warn(shown + " asks for " + std::string(known->why) +
                  ", which zerocpp does not support; it is ignored and training runs without it.");
      }
    }
  }
}

std::string SectionReader::path_of(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

void SectionReader::fail_expected(std::string_view key, std::string_view expected,
                                  const Json& got) const {
  fail(key, "expected " + std::string(expected) + ", got " + describe_value(got));
}

void SectionReader::fail(std::string_view key, std::string_view message) const {
  ctx_.fail(path_of(key), message);
}

void SectionReader::note_ignored(std::string_view key, std::string_view why) {
  ctx_.warn(quote(path_of(key)) + " is ignored: " + std::string(why) + ".");
}

const Json* SectionReader::find(std::string_view key) const {
  const KnownKey* known = find_known_key(table_section_, key);
  ZERO_INTERNAL_ASSERT(known && known->kind == KeyKind::kRead, "key ", path_of(key),
                       " is read but not listed as read in known_keys.cpp");
  if (!object_) return nullptr;
  auto it = object_->find(key);
  if (it == object_->end() || it->is_null()) return nullptr;
  return &*it;
}

bool SectionReader::is_auto(std::string_view key) const {
  if (!object_) return false;
  auto it = object_->find(key);
  return it != object_->end() && is_auto_value(*it);
}

const Json* SectionReader::find_unless_auto(std::string_view key) {
  const Json* v = find(key);
  if (v && is_auto_value(*v)) {
    ctx_.note_auto(path_of(key));
    return nullptr;
  }
  return v;
}

std::optional<bool> SectionReader::read_bool(std::string_view key) {
  const Json* v = find_unless_auto(key);
  if (!v) return std::nullopt;
  // "true" and "false" as strings: DeepSpeed's pydantic sections read them
  // as the booleans, and real configs have them.
  if (v->is_string()) {
    const std::string& s = v->get_ref<const std::string&>();
    if (equals_ignoring_case(s, "true") || equals_ignoring_case(s, "false")) {
      const bool b = equals_ignoring_case(s, "true");
      ctx_.warn(quote(path_of(key)) + " is the string " + describe_value(*v) + ", read as " + (b ? "true" : "false") +
                " (write " + (b ? "true" : "false") + " without quotes).");
      return b;
    }
  }
  if (!v->is_boolean()) fail_expected(key, "true or false", *v);
  return v->get<bool>();
}

std::optional<std::int64_t> SectionReader::read_int(std::string_view key, IntRange range) {
  const Json* v = find_unless_auto(key);
  if (!v) return std::nullopt;
  std::optional<std::int64_t> i = v->is_number() ? as_int64(*v) : std::nullopt;
  // A whole number past the 64-bit integers is an integer too large, not
  // "not an integer".
  if (!i && v->is_number() && std::fabs(v->get<double>()) >= 9.2e18 && std::isfinite(v->get<double>())) {
    fail(key, "expected " + range.describe() + ", got " + describe_value(*v) + ": too large (at most " +
                  std::to_string(std::min(range.hi, std::numeric_limits<std::int64_t>::max())) + ")");
  }
  if (!i || *i < range.lo || *i > range.hi) fail_expected(key, range.describe(), *v);
  return i;
}

std::optional<int> SectionReader::read_int32(std::string_view key, IntRange range) {
  range.lo = std::max<std::int64_t>(range.lo, std::numeric_limits<int>::min());
  range.hi = std::min<std::int64_t>(range.hi, std::numeric_limits<int>::max());
  std::optional<std::int64_t> i = read_int(key, range);
  if (!i) return std::nullopt;
  return static_cast<int>(*i);
}

std::optional<float> SectionReader::read_float(std::string_view key, RealRange range) {
  const Json* v = find_unless_auto(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) fail_expected(key, range.describe(), *v);
  double d = v->get<double>();
  // Converting a double beyond float's range is undefined behaviour.
  if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max()) {
    fail(key, "expected " + range.describe() + " that fits a 32-bit float, got " +
                  describe_value(*v));
  }
  auto f = static_cast<float>(d);
  // Checked after the conversion: 1e-50 becomes 0 and must fail "> 0".
  if (!range.contains(f)) fail_expected(key, range.describe(), *v);
  return f;
}

std::optional<std::string> SectionReader::read_string(std::string_view key) {
  const Json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) fail_expected(key, "a string", *v);
  return v->get<std::string>();
}

std::optional<std::string> SectionReader::read_choice(
    std::string_view key, std::initializer_list<std::string_view> choices) {
  const Json* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_string()) {
    const std::string& s = v->get_ref<const std::string&>();
    for (std::string_view c : choices) {
      if (equals_ignoring_case(s, c)) return std::string(c);
    }
  }
  std::string expected = "one of ";
  for (std::string_view c : choices) {
    if (expected.size() > 7) expected += ", ";
    expected += "\"" + std::string(c) + "\"";
  }
  fail_expected(key, expected, *v);
}

std::optional<std::int64_t> SectionReader::read_byte_size(std::string_view key) {
  const Json* v = find_unless_auto(key);
  if (!v) return std::nullopt;
  std::optional<std::int64_t> bytes;
  if (v->is_number()) {
    bytes = as_int64(*v);
  } else if (v->is_string()) {
    bytes = parse_byte_size(v->get_ref<const std::string&>());
  }
  if (!bytes || *bytes < 0) {
    fail_expected(key,
                  "a byte count >= 0: an integer, or a string such as \"2GB\", \"512MiB\" or "
                  "\"1.5 GiB\" (KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024)",
                  *v);
  }
  return bytes;
}

const Json* SectionReader::read_object(std::string_view key, std::string_view example) {
  const Json* v = find(key);
  if (!v) return nullptr;
  if (!v->is_object()) fail_expected(key, "an object such as " + std::string(example), *v);
  return v;
}

}  // namespace zero::config::detail
