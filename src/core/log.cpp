#include "zero/core/log.h"

#include <cstdarg>
#include <cstdio>
#include <string>
#include <mutex>
#include <utility>

namespace zero {
namespace {

// Never destroyed: a destructor that says something at the process's exit
// (an engine in a global, a Work abandoned) runs after function statics
// are gone.
std::mutex& sink_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

LogSink& current_sink() {
  static auto* sink = new LogSink;  // empty: log_to_stderr
  return *sink;
}

}  // namespace

LogSink set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  return std::exchange(current_sink(), std::move(sink));
}

void log_to_stderr(const LogRecord& record) {
  std::fprintf(stderr, "zerocpp: %.*s\n", static_cast<int>(record.text.size()), record.text.data());
}

void log(LogLevel level, std::string_view topic, std::string_view text) {
  constexpr std::string_view prefix = "zerocpp: ";
  if (text.substr(0, prefix.size()) == prefix) text.remove_prefix(prefix.size());
  const LogRecord record{level, topic, text};
  std::lock_guard<std::mutex> lock(sink_mutex());
  try {
    if (current_sink()) {
      current_sink()(record);
    } else {
      log_to_stderr(record);
    }
  } catch (...) {
    // A message never fails the operation that said it.
  }
}

namespace detail {
namespace {

void log_v(LogLevel level, std::string_view topic, const char* format, std::va_list args) {
  std::va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  try {
    std::string text(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
    if (n > 0) std::vsnprintf(text.data(), text.size() + 1, format, again);
    log(level, topic, text);
  } catch (...) {
    // (No memory for the text: a message never fails the operation that said it.)
  }
  va_end(again);
}

}  // namespace

void log_info(std::string_view topic, const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  log_v(LogLevel::info, topic, format, args);
  va_end(args);
}

void log_warning(std::string_view topic, const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  log_v(LogLevel::warning, topic, format, args);
  va_end(args);
}

}  // namespace detail
}  // namespace zero
