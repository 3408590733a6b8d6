// Where zerocpp's messages go: the engine's lines about what it built, what a
// checkpoint load found and changed, skipped steps, config warnings. By
// default each is one line on stderr, "zerocpp: <text>". A program that logs
// elsewhere (its own logger, a file, nowhere on ranks other than 0) sets a
// sink; a program that says a thing in its own words (zero-train's resume
// warnings) can drop the engine's line on that topic.
//
// Not routed here: the last words of a job that ends (zero::comm::fail_job,
// MPI's fatal errors), which go straight to stderr before the process ends.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace zero {

enum class LogLevel { info, warning };

// The topics a message is filed under (more may come; a sink passes on what
// it does not know).
namespace log_topic {
inline constexpr std::string_view engine = "engine";          // what the engine built, and its notes
inline constexpr std::string_view config = "config";          // a config setting ignored or changed
inline constexpr std::string_view step = "step";              // a step skipped, the delayed update
inline constexpr std::string_view checkpoint = "checkpoint";  // saves and loads
// A load whose checkpoint trained some parameters with other per-parameter
// settings (weight decay, lr scale) than this engine's rules give them.
inline constexpr std::string_view checkpoint_param_settings = "checkpoint.param_settings";
inline constexpr std::string_view comm = "comm";              // communication ops abandoned on an error
// What an engine destroyed by an exception leaves in the module (stage 3:
// the parameters not gathered back): for a program that goes on using the
// module; one that ends on the error may drop it.
inline constexpr std::string_view engine_teardown = "engine.teardown";
}  // namespace log_topic

struct LogRecord {
  LogLevel level = LogLevel::info;
  std::string_view topic;
  std::string_view text;  // one line, without "zerocpp: " or a newline
};

using LogSink = std::function<void(const LogRecord&)>;

// Sends every later message to `sink` (an empty one: the default, stderr) and
// returns the sink it replaces. Calls to the sink are serialized; a sink
// must not call log() or set_log_sink() itself, and what it throws is
// dropped (a message never fails the operation that said it).
LogSink set_log_sink(LogSink sink);

// The default sink: "zerocpp: <text>" and a newline on stderr.
void log_to_stderr(const LogRecord& record);

// Says `text` under `topic` through the current sink (a leading "zerocpp: "
// in `text` is dropped: the default sink adds it).
void log(LogLevel level, std::string_view topic, std::string_view text);

namespace detail {
// log() of a printf format, at level info or warning.
void log_info(std::string_view topic, const char* format, ...) __attribute__((format(printf, 2, 3)));
void log_warning(std::string_view topic, const char* format, ...) __attribute__((format(printf, 2, 3)));
}  // namespace detail

}  // namespace zero
