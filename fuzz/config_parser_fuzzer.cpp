// libFuzzer target for parse_config: arbitrary bytes, world sizes 1..8.
//
// Accepted outcomes: a Config, or a zero::Error whose message is valid UTF-8
// (callers print messages and put them in JSON reports). Findings: a crash, a
// sanitizer report, any other exception (an uncaught one aborts), a
// zero::InternalError, or a Config that does not survive
// parse_config(to_json(c).dump()) unchanged.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "zero/config/byte_size.h"
#include "zero/config/config.h"
#include "zero/core/error.h"

namespace {

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "config_parser_fuzzer finding: %s\n", what.c_str());
  std::abort();
}

void check_message(const std::string& message) {
  if (message.empty()) finding("empty message");
  try {
    (void)nlohmann::json(message).dump();  // throws on bytes that are not UTF-8
  } catch (const nlohmann::json::exception&) {
    finding("message is not valid UTF-8: " + message);
  }
}

void check_round_trip(zero::config::Config config, int world_size) {
  const std::string dumped = zero::config::to_json(config).dump();
  zero::config::Config back;
  try {
    back = zero::config::parse_config(dumped, world_size, "round-trip");
  } catch (const zero::Error& e) {
    finding(std::string("to_json output does not parse: ") + e.what() + "\n" + dumped);
  }
  if (!back.warnings.empty()) finding("to_json output warns: " + back.warnings[0] + "\n" + dumped);
  config.warnings.clear();
  if (!(back == config)) finding("round trip changed the config:\n" + dumped);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (int world_size = 1; world_size <= 8; ++world_size) {
    try {
      zero::config::Config config = zero::config::parse_config(text, world_size, "fuzz.json");
      for (const std::string& w : config.warnings) check_message(w);
      check_round_trip(std::move(config), world_size);
    } catch (const zero::InternalError& e) {
      finding(std::string("internal error: ") + e.what());
    } catch (const zero::Error& e) {
      check_message(e.what());
    }
  }
  // Short inputs double as byte-size strings.
  if (size <= 64) (void)zero::config::parse_byte_size(text);
  return 0;
}
